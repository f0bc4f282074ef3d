"""Rule ``fit_scaling``: scaling.json: depth-slice, width-ladder and scale-out fits of the CPU proxy records (bytes, FLOPs)."""

from __future__ import annotations

from collections.abc import Mapping

from trainplan.calibration.scaling import stage_fit_scaling
from trainplan.io import write_json
from trainplan.stages.common import (
    read_table,
    sidecars,
    specs_from_cfg,
    stage,
)


def run(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """scaling.json: depth-slice, width-ladder and scale-out fits of the CPU proxy records (bytes, FLOPs)."""
    s = specs_from_cfg(cfg)
    result = stage_fit_scaling(read_table(inp["records"]), s["model"], s["cluster"].n_gpus, dict(cfg["calibration"]))
    write_json(out["scaling"], result)
    sidecars("fit_scaling", out, cfg, inp)


main = stage(run, "fit_scaling")
