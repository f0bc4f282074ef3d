# Figures, memo and launch artifacts. The figures and the memo are also in `snakemake --report report.html`
# (captions: report/captions/*.rst; labels read from each output's caption/provenance sidecar at report time).
from trainplan.report.labels import figure_labels, memo_labels


rule figures:
    """Every memo figure as SVG with caption metadata (config hash, sources)."""
    input:
        candidates=f"{R}/analytic/candidates.csv",
        summary=f"{R}/analytic/summary.json",
        records=f"{R}/proxies/records.csv",
        calibration=f"{R}/calibration/calibration.json",
        production=f"{R}/prediction/production.json",
        cost=f"{R}/cost/cost.json",
        sensitivity=f"{R}/cost/sensitivity.csv",
    output:
        figures=report(
            directory(f"{R}/figures"),
            patterns=["{name}.svg"],
            caption="../report/captions/figure.rst",
            category="Figures",
            labels=lambda wildcards: figure_labels(f"{R}/figures", wildcards.name),
        ),
    log:
        f"{LOGS}/figures.log",
    benchmark:
        f"{BENCH}/figures.tsv"
    conda:
        "../envs/trainplan.yaml"
    params:
        cfg=cfg("figures"),
        code=CODE_VERSION,
    script:
        "../workflow/scripts/figures.py"


rule memo:
    """The PDF design memo (jinja2 + WeasyPrint). It reads these inputs (names: trainplan.report.memo.MEMO_INPUTS),
    the SVGs and captions in the figures dir, the launch files manifest.json lists next to it (the rest of the
    launch_artifacts output set) and the provenance sidecar of each (the provenance appendix); scaling.json and
    the proxy run records only for their sidecars.
    """
    input:
        figures=f"{R}/figures",
        summary=f"{R}/analytic/summary.json",
        candidates=f"{R}/analytic/candidates.csv",
        families=f"{R}/analytic/families.csv",
        techniques=f"{R}/analytic/techniques.csv",
        proxy_set=f"{R}/proxies/proxy_set.json",
        proxy_runs=proxy_records,
        records=f"{R}/proxies/records.csv",
        calibration=f"{R}/calibration/calibration.json",
        heldout=f"{R}/calibration/heldout.csv",
        scaling=f"{R}/calibration/scaling.json",
        production=f"{R}/prediction/production.json",
        production_table=f"{R}/prediction/production.csv",
        cost=f"{R}/cost/cost.json",
        sensitivity=f"{R}/cost/sensitivity.csv",
        launch=f"{R}/launch/manifest.json",
        benchmarks=benchmark_files,
        template="report/templates/memo.html.j2",
        css="report/templates/memo.css",
    output:
        pdf=report(
            f"{R}/memo/design_memo.pdf",
            caption="../report/captions/memo.rst",
            category="Design memo",
            labels=lambda wildcards: memo_labels(f"{R}/memo/design_memo.pdf"),
        ),
    log:
        f"{LOGS}/memo.log",
    conda:
        "../envs/trainplan.yaml"
    params:
        cfg=cfg("memo"),
        code=CODE_VERSION,
    script:
        "../workflow/scripts/memo.py"


rule launch_artifacts:
    """Accelerate FSDP2 config, torchrun and sbatch scripts, DeepSpeed config (if pure DP + ZeRO) for the
    chosen layout, written next to manifest.json (the declared output: the sbatch name depends on the cluster).
    """
    input:
        summary=f"{R}/analytic/summary.json",
        cost=f"{R}/cost/cost.json",
        production=f"{R}/prediction/production.json",
    output:
        manifest=f"{R}/launch/manifest.json",
    log:
        f"{LOGS}/launch_artifacts.log",
    conda:
        "../envs/trainplan.yaml"
    params:
        # the whole resolved config (RULE_SECTIONS: "*"): every file's header prints the study hash
        # (provenance.study_hash), the same value as the memo footer, so any config change rewrites them
        cfg=cfg("launch_artifacts"),
        code=CODE_VERSION,
    script:
        "../workflow/scripts/launch_artifacts.py"
