checkpoint select_proxies:
    """Choose proxy runs (depth slice, width ladder, scale-out ladder, layouts) from the candidates."""
    input:
        candidates=f"{R}/analytic/candidates.csv",
    output:
        proxy_set=f"{R}/proxies/proxy_set.json",
    log:
        f"{LOGS}/select_proxies.log",
    conda:
        "../envs/trainplan.yaml"
    params:
        cfg=cfg("select_proxies"),
        code=CODE_VERSION,
    script:
        "../workflow/scripts/select_proxies.py"


rule proxy_run:
    """One real training run (torchrun); OOM and timeout are results; other failures are retried."""
    input:
        proxy_set=f"{R}/proxies/proxy_set.json",
    output:
        record=f"{R}/proxies/runs/{{id}}.json",
    log:
        f"{LOGS}/proxy_run/{{id}}.log",
        steps=f"{LOGS}/proxy_run/{{id}}.steps.log",
    benchmark:
        f"{R}/benchmarks/proxy_run/{{id}}.tsv"
    wildcard_constraints:
        id="[A-Za-z0-9_-]+",
    conda:
        "../envs/proxy.yaml"
    threads: STUDY.raw["proxies"]["nproc_per_node"]
    resources:
        nodes=lambda wc: proxy_resources(wc)["nodes"],
        cpus_per_task=lambda wc: proxy_resources(wc)["cpus_per_task"],
        mem_mb=lambda wc: proxy_resources(wc)["mem_mb"],
        runtime=lambda wc: proxy_resources(wc)["runtime"],
        gres=lambda wc: proxy_resources(wc)["gres"],
        tasks=lambda wc: proxy_resources(wc)["tasks"],
        tasks_per_gpu=lambda wc: proxy_resources(wc)["tasks_per_gpu"],
        mpi=lambda wc: proxy_resources(wc)["mpi"],
    params:
        cfg=cfg("proxy_run"),
        code=CODE_VERSION,
    script:
        "../workflow/scripts/proxy_run.py"


rule aggregate:
    """Flatten the proxy records into one table, predicted next to measured."""
    input:
        records=proxy_records,
    output:
        records=f"{R}/proxies/records.csv",
    log:
        f"{LOGS}/aggregate.log",
    conda:
        "../envs/trainplan.yaml"
    params:
        cfg=cfg("aggregate"),
        code=CODE_VERSION,
    script:
        "../workflow/scripts/aggregate.py"
