"""Rule ``cost_and_risk``: cost.json (``cost.stage_cost_and_risk``) and sensitivity.csv (``sensitivity.stage_sensitivity``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainplan.cost.budget import stage_cost_and_risk
from trainplan.cost.sensitivity import stage_sensitivity
from trainplan.io import read_json, write_csv, write_json
from trainplan.launch.artifacts import plan_search
from trainplan.model.efficiency import Efficiency
from trainplan.search.layouts import pinned_options
from trainplan.stages.common import (
    sidecars,
    specs_from_cfg,
    stage,
)


def run(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """cost.json (``cost.stage_cost_and_risk``) and sensitivity.csv (``sensitivity.stage_sensitivity``)."""
    s = specs_from_cfg(cfg)
    production = read_json(inp["production"])
    m, c, t = s["model"], s["cluster"], s["training"]
    doc, inputs = stage_cost_and_risk(production, n_params=float(m.n_params), n_gpus=c.n_gpus,
                                      total_tokens=float(t.total_tokens), d2h_Bps=c.host_to_device_Bps,
                                      cost_cfg=dict(cfg["cost"]), targets=dict(cfg["targets"]),
                                      finetune=t.finetune)
    options = pinned_options(cfg["search"], s["layout"])  # a pinned layout: its fields as single values
    eff = Efficiency.from_dict({k: v for k, v in (production.get("efficiency") or {}).items() if v is not None})
    top = int(cfg["search"]["top_k"])

    def searcher(model: Any, cluster: Any, training: Any, eff: Any, options: Any, *, mem_scale: float) -> Any:
        return plan_search(model, cluster, training, eff, options, top, mem_scale=mem_scale)  # as the study searched

    sens = stage_sensitivity(production["chosen"], model=m, cluster=c, training=t, eff=eff, options=options,
                             inputs=inputs, inter_busbw_GBps=float(cfg["cluster"]["inter_busbw_GBps"]),
                             searcher=searcher)
    doc["sensitivity_flips"] = sens.loc[sens["changes_recommendation"], "parameter"].tolist()
    write_json(out["cost"], doc)
    write_csv(sens, out["sensitivity"])
    sidecars("cost_and_risk", out, cfg, inp, calibration_source=doc.get("calibration_source"))


main = stage(run, "cost_and_risk")
