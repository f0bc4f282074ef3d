rule analytic_model:
    """Enumerate and evaluate every layout; rank; Pareto front; family and technique verdicts."""
    output:
        candidates=f"{R}/analytic/candidates.csv",
        families=f"{R}/analytic/families.csv",
        techniques=f"{R}/analytic/techniques.csv",
        summary=f"{R}/analytic/summary.json",
    log:
        f"{LOGS}/analytic_model.log",
    benchmark:
        f"{BENCH}/analytic_model.tsv"
    conda:
        "../envs/trainplan.yaml"
    params:
        cfg=cfg("analytic_model"),
        code=CODE_VERSION,
    script:
        "../workflow/scripts/analytic_model.py"
