# Config loading (fails at parse time, before any job, with a ConfigError naming the key) and helpers.
import json
from pathlib import Path

from snakemake_interface_executor_plugins.settings import ExecMode

from trainplan import pkgdata
from trainplan.config import (
    config_slice,
    load_config,
    read_yaml,
    require_proxy_torch,
    schema_path,
)
from trainplan.provenance import code_version, study_hash
from trainplan.proxy.slurm_resources import proxy_job_resources
from trainplan.model.base import ConfigError
from trainplan.launch.artifacts import plan_search
from trainplan.search.layouts import pinned_options, require_feasible

try:
    for _configfile in workflow.configfiles:
        # the project's strict reader, as `trainplan plan` reads them: Snakemake's loader lets a duplicate key win
        # silently and takes aliases
        read_yaml(_configfile)
    STUDY = load_config(
        config
    )  # defaults filled, YAML 1.2 numbers (1e10) read, specs resolved, pinned layout checked
    # proxies.device: cuda needs a CUDA torch in the interpreter every job runs (the venv's is the CPU wheel)
    require_proxy_torch(STUDY.raw["proxies"])
    # a study no layout fits (every one OOM, also as its trainer runs it; an empty search space, a pinned layout
    # too big) is refused here, not by the cost stage after the proxies ran: the search takes about a second, so
    # only the process that plans the DAG runs it, not every cluster job's own parse (exec mode remote), which the
    # main process has checked
    if workflow.exec_mode == ExecMode.DEFAULT:
        require_feasible(
            plan_search(
                STUDY.model,
                STUDY.cluster,
                STUDY.training,
                STUDY.efficiency,
                pinned_options(STUDY.search, STUDY.layout),
                int(STUDY.search["top_k"]),
            ),
            STUDY.layout,
        )
except ConfigError as e:
    raise WorkflowError(f"Bad config: {e}") from None
# the schema is package data (src/trainplan/config.schema.yaml; in the wheel), the one load_config uses; checked on
# the resolved config, which load_config has validated already (on the raw one, 1e10 is still a YAML 1.1 string)
validate(STUDY.raw, str(schema_path()), set_default=True)
config.clear()
config.update(STUDY.raw)

R = STUDY.raw["study"]["results_dir"]
LOGS = f"{R}/logs"
BENCH = f"{R}/benchmarks"
# The one study hash (provenance.study_hash of the resolved config): the memo footer and the launch files
# print it, and so does every run here.
STUDY_HASH = study_hash(STUDY.raw)
# Hash of the trainplan package's own code and data (provenance.code_version): a param of every rule, so a
# changed model, fit or template reruns what it computes (Snakemake's "code" trigger sees only the rule scripts).
CODE_VERSION = code_version()
# Rules that run `benchmark:` (their TSVs are memo inputs: the memo reports their wall time).
BENCHMARKED = ("analytic_model", "calibrate", "cost_and_risk", "figures")
# The published tables calibration reads (package data, cited in its SOURCES.md): editing one reruns calibrate.
PUBLISHED = sorted(str(p) for p in pkgdata.path(pkgdata.DATA).glob("*.csv"))
# Committed GPU proxy records (scripts/device_proxies.sh): inputs of calibrate, so new records rerun it.
GPU_RECORDS = sorted(
    str(p)
    for p in Path(
        config.get("calibration", {}).get("gpu_records_dir") or "data/calibration/gpu"
    ).glob("*.json")
)

# GPU proxy records the memo checks the shipped fit against (never fitted): inputs of calibrate too.
# config holds STUDY.raw (schema defaults filled); null: no check.
_GPU_CHECK_DIR = config["calibration"]["gpu_check_dir"]
# With the microbenchmarks of the same session (microbench/*.json: bench_bf16_step's production-regime timings).
GPU_CHECK = (
    sorted(str(p) for p in Path(_GPU_CHECK_DIR).glob("*.json"))
    + sorted(str(p) for p in Path(_GPU_CHECK_DIR).glob("microbench/*.json"))
    if _GPU_CHECK_DIR
    else []
)


def cfg(rule):
    """The config slice a rule depends on (its params, hence its provenance hash and rerun trigger)."""
    return config_slice(STUDY.raw, rule)


def proxy_ids(wildcards=None):
    """Ids chosen by the select_proxies checkpoint (evaluated after it ran)."""
    ps = checkpoints.select_proxies.get().output.proxy_set
    return [p["id"] for p in json.loads(Path(ps).read_text())["proxies"]]


def proxy_records(wildcards=None):
    return expand(f"{R}/proxies/runs/{{id}}.json", id=proxy_ids())


def proxy_resources(wildcards):
    """Scheduler resources of one proxy job, from its RUN_SPEC (trainplan.proxy.slurm_resources)."""
    ps = checkpoints.select_proxies.get().output.proxy_set
    spec = next(
        p
        for p in json.loads(Path(ps).read_text())["proxies"]
        if p["id"] == wildcards.id
    )
    return proxy_job_resources(spec)


def benchmark_files(wildcards=None):
    """The benchmark TSVs of the expensive rules (one per proxy run), for the memo's wall-time table."""
    return [f"{BENCH}/{rule}.tsv" for rule in BENCHMARKED] + expand(
        f"{BENCH}/proxy_run/{{id}}.tsv", id=proxy_ids()
    )


def all_outputs():
    return [
        f"{R}/memo/design_memo.pdf",
        f"{R}/launch/manifest.json",
        f"{R}/cost/cost.json",
        f"{R}/calibration/heldout.csv",
    ]
