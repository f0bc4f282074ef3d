"""Rule ``analytic_model``: candidates.csv, families.csv, techniques.csv, summary.json from ``trainplan.search.layouts``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainplan.io import write_csv, write_json
from trainplan.launch.artifacts import plan_search
from trainplan.model.estimate import estimate
from trainplan.model.flops import n_params_dense, train_flops_per_token
from trainplan.model.layout import Layout
from trainplan.search.layouts import (
    batch_alternative,
    family_verdicts,
    fp8_technique_rows,
    impossible_techniques,
    launched_tps,
    pinned_options,
    technique_verdicts,
)
from trainplan.stages.common import (
    sidecars,
    specs_from_cfg,
    stage,
)


def run(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """candidates.csv, families.csv, techniques.csv, summary.json from ``trainplan.search.layouts``."""
    s = specs_from_cfg(cfg)
    options = pinned_options(cfg["search"], s["layout"])  # a pinned layout: its fields as single values
    # the search, then what the launch could not fit ruled out (each layout sized as its trainer runs it)
    df = plan_search(s["model"], s["cluster"], s["training"], s["efficiency"], options, int(cfg["search"]["top_k"]))
    fam = family_verdicts(df)
    summary: dict[str, Any] = {"status": "ok", "layout": None}
    best = df[df["rank"] == 1] if "rank" in df else df.iloc[:0]
    if len(best):
        layout = Layout.from_row(best.iloc[0])
        summary["layout"] = layout.to_dict()
        summary["family"] = str(best.iloc[0].get("family", layout.family))
        summary["estimate"] = estimate(s["model"], s["cluster"], s["training"], layout, s["efficiency"]).to_json()
        if s["layout"] is None:  # searched, not pinned: would a global batch that divides over the GPUs be faster?
            alt = batch_alternative(s["model"], s["cluster"], s["training"], s["efficiency"], options,
                                    launched_tps(best.iloc[0], "tokens_per_s_per_gpu"), plan_search)
            if alt:
                summary["batch_alternative"] = alt
    else:
        summary["status"] = "no feasible layout"
    m = s["model"]
    summary.update(model={**m.to_dict(), "n_params": m.n_params, "n_params_nonembedding": m.n_params_nonembedding,
                                 "n_params_dense": n_params_dense(m)},
                   n_params=m.n_params, gpu=s["cluster"].gpu.name, n_gpus=s["cluster"].n_gpus,
                   hbm_gib=s["cluster"].gpu.hbm_bytes / 2**30,
                   flops_per_token=train_flops_per_token(m, s["training"]))
    write_csv(df, out["candidates"])
    write_csv(fam, out["families"])
    if "techniques" in out:
        extra = fp8_technique_rows(s["model"], s["cluster"], s["training"], layout, s["efficiency"]) if len(best) else []
        write_csv(technique_verdicts(df, extra, impossible_techniques(s["cluster"], s["training"], options)),
                  out["techniques"])
    write_json(out["summary"], summary)
    sidecars("analytic_model", out, cfg, inp)


main = stage(run, "analytic_model")
