# Config loading (fails at parse time, before any job, with a ConfigError naming the key) and helpers.
import json
from pathlib import Path

import trainplan
from trainplan.config import config_slice, load_config
from trainplan.specs import ConfigError

try:
    STUDY = load_config(
        config
    )  # defaults filled, specs resolved, pinned layout checked
except ConfigError as e:
    raise WorkflowError(f"Bad config: {e}") from None
validate(config, "../config/config.schema.yaml", set_default=True)
config.clear()
config.update(STUDY.raw)

R = STUDY.raw["study"]["results_dir"]
LOGS = f"{R}/logs"
# The published tables calibration reads (package data, cited in its SOURCES.md): editing one reruns calibrate.
PUBLISHED = sorted(
    str(p) for p in (Path(trainplan.__file__).parent / "data").glob("*.csv")
)
# Committed GPU proxy records (scripts/device_proxies.sh): inputs of calibrate, so new records rerun it.
GPU_RECORDS = sorted(
    str(p)
    for p in Path(
        config.get("calibration", {}).get("gpu_records_dir") or "data/calibration/gpu"
    ).glob("*.json")
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


def all_outputs():
    return [
        f"{R}/memo/design_memo.pdf",
        f"{R}/launch/manifest.json",
        f"{R}/cost/cost.json",
        f"{R}/calibration/heldout.csv",
    ]
