rule calibrate:
    """Fit the analytic model's free parameters; held-out error per published table."""
    input:
        records=f"{R}/proxies/records.csv",
        published=PUBLISHED,
        gpu_records=GPU_RECORDS,
        gpu_check=GPU_CHECK,
    output:
        calibration=f"{R}/calibration/calibration.json",
        heldout=f"{R}/calibration/heldout.csv",
    log:
        f"{LOGS}/calibrate.log",
    benchmark:
        f"{BENCH}/calibrate.tsv"
    conda:
        "../envs/trainplan.yaml"
    params:
        cfg=cfg("calibrate"),
        code=CODE_VERSION,
    script:
        "../workflow/scripts/calibrate.py"


rule fit_scaling:
    """Depth-slice, width-ladder and scale-out fits with intervals."""
    input:
        records=f"{R}/proxies/records.csv",
    output:
        scaling=f"{R}/calibration/scaling.json",
    log:
        f"{LOGS}/fit_scaling.log",
    conda:
        "../envs/trainplan.yaml"
    params:
        cfg=cfg("fit_scaling"),
        code=CODE_VERSION,
    script:
        "../workflow/scripts/fit_scaling.py"


rule predict_production:
    """The production run's tokens/s, MFU and memory for the top layouts, with p10/p50/p90."""
    input:
        candidates=f"{R}/analytic/candidates.csv",
        calibration=f"{R}/calibration/calibration.json",
        scaling=f"{R}/calibration/scaling.json",
    output:
        csv=f"{R}/prediction/production.csv",
        json=f"{R}/prediction/production.json",
    log:
        f"{LOGS}/predict_production.log",
    conda:
        "../envs/trainplan.yaml"
    params:
        cfg=cfg("predict_production"),
        code=CODE_VERSION,
    script:
        "../workflow/scripts/predict_production.py"
