checkpoint select_proxies:
    """Choose proxy runs (depth slice, width ladder, scale-out ladder, layouts) from the candidates."""
    input:
        candidates=f"{R}/analytic/candidates.csv",
    output:
        proxy_set=f"{R}/proxies/proxy_set.json",
    params:
        cfg=cfg("select_proxies"),
    log:
        f"{LOGS}/select_proxies.log",
    conda:
        "../envs/trainplan.yaml"
    script:
        "../workflow/scripts/select_proxies.py"


rule proxy_run:
    """One real training run (torchrun); OOM and timeout are results; other failures are retried."""
    input:
        proxy_set=f"{R}/proxies/proxy_set.json",
    output:
        record=f"{R}/proxies/runs/{{id}}.json",
    wildcard_constraints:
        id="[A-Za-z0-9_-]+",
    params:
        cfg=cfg("proxy_run"),
    threads: STUDY.raw["proxies"]["nproc_per_node"]
    log:
        f"{LOGS}/proxy_run/{{id}}.log",
    conda:
        "../envs/proxy.yaml"
    script:
        "../workflow/scripts/proxy_run.py"


rule aggregate:
    """Flatten the proxy records into one table, predicted next to measured."""
    input:
        records=proxy_records,
    output:
        records=f"{R}/proxies/records.csv",
    params:
        cfg=cfg("aggregate"),
    log:
        f"{LOGS}/aggregate.log",
    conda:
        "../envs/trainplan.yaml"
    script:
        "../workflow/scripts/aggregate.py"
