rule cost_and_risk:
    """Wall-clock, GPU-hours, dollars, goodput, targets pass/fail, sensitivity."""
    input:
        production=f"{R}/prediction/production.json",
    output:
        cost=f"{R}/cost/cost.json",
        sensitivity=f"{R}/cost/sensitivity.csv",
    log:
        f"{LOGS}/cost_and_risk.log",
    benchmark:
        f"{BENCH}/cost_and_risk.tsv"
    conda:
        "../envs/trainplan.yaml"
    params:
        cfg=cfg("cost_and_risk"),
        code=CODE_VERSION,
    script:
        "../workflow/scripts/cost_and_risk.py"
