"""Rule ``predict_production``: production.csv/.json: top layouts with p10/p50/p90 from ``trainplan.prediction.production``."""

from __future__ import annotations

from collections.abc import Mapping

from trainplan.io import read_json, write_csv, write_json
from trainplan.prediction.production import stage_predict_production
from trainplan.stages.common import (
    read_table,
    sidecars,
    specs_from_cfg,
    stage,
)


def run(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """production.csv/.json: top layouts with p10/p50/p90 from ``trainplan.prediction.production``."""
    s = specs_from_cfg(cfg)
    calib = read_json(inp["calibration"])
    df, doc = stage_predict_production(read_table(inp["candidates"]), calib, read_json(inp["scaling"]),
                                       s["model"], s["cluster"], s["training"], cfg)
    write_csv(df, out["csv"])
    write_json(out["json"], doc)
    sidecars("predict_production", out, cfg, inp, calibration_source=calib.get("source"))


main = stage(run, "predict_production")
