"""Rule ``calibrate``: calibration.json and heldout.csv from ``trainplan.calibration.sources.stage_calibrate``."""

from __future__ import annotations

from collections.abc import Mapping

from trainplan.calibration.sources import stage_calibrate
from trainplan.io import write_csv, write_json
from trainplan.stages.common import (
    files_of,
    read_table,
    sidecars,
    specs_from_cfg,
    stage,
)


def run(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """calibration.json and heldout.csv from ``trainplan.calibration.sources.stage_calibrate``."""
    s = specs_from_cfg(cfg)
    result, heldout = stage_calibrate(read_table(inp["records"]), s["efficiency"], dict(cfg["calibration"]))
    write_json(out["calibration"], result)
    write_csv(heldout, out["heldout"])
    # committed GPU records (calibration.gpu_records_dir) are inputs too, whether or not the rule declares them
    gpu_files = [f for f in (result.get("gpu") or {}).get("records_files", []) if f not in files_of(inp)]
    sidecars("calibrate", out, cfg, {**inp, "gpu_records": gpu_files} if gpu_files else inp,
              calibration_source=result.get("source_detail") or result.get("source"))


main = stage(run, "calibrate")
