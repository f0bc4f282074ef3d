"""Rule ``launch_artifacts``: accelerate/torchrun/sbatch/DeepSpeed files + manifest.json for the chosen layout (``trainplan.launch.artifacts``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from trainplan.io import read_json
from trainplan.launch.artifacts import write_artifacts
from trainplan.model.layout import Layout
from trainplan.provenance import study_hash, write_sidecar
from trainplan.stages.common import (
    files_of,
    specs_from_cfg,
    stage,
)


def run(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """accelerate/torchrun/sbatch/DeepSpeed files + manifest.json for the chosen layout (``trainplan.launch.artifacts``)."""
    s = specs_from_cfg(cfg)
    layout = read_json(inp["summary"]).get("layout")
    if layout is None:
        raise RuntimeError("launch_artifacts: no feasible layout in analytic/summary.json (see families.csv)")
    outdir = Path(out["manifest"]).parent
    # cost.json's Young/Daly interval and the chosen layout's predicted step time set the checkpoint interval; its
    # p10 tokens/s/GPU is the day-1 throughput threshold (optional inputs: a bare launch run works without them)
    cost = read_json(inp["cost"]) if inp.get("cost") else {}
    chosen = (read_json(inp["production"]) if inp.get("production") else {}).get("chosen") or {}
    tps = chosen.get("tokens_per_s_per_gpu_p50")
    ckpt_h = cost.get("checkpoint_interval_h")
    write_artifacts(s["model"], s["cluster"], s["training"], Layout.from_dict(layout), outdir,
                    study_hash=study_hash(cfg), options=cfg["launch"],
                    checkpoint_interval_s=float(ckpt_h) * 3600.0 if ckpt_h else None,
                    step_time_s=s["training"].tokens_per_step / (float(tps) * s["cluster"].n_gpus) if tps else None,
                    checkpoint_async=bool(cfg["cost"].get("checkpoint_async", True)),
                    min_tokens_per_s_per_gpu=chosen.get("tokens_per_s_per_gpu_p10"),
                    summary_path=str(inp["summary"]), study_config=cfg, eff=s.get("efficiency"))  # the preflight reads this study's files
    for f in sorted(outdir.iterdir()):
        if f.is_file() and not f.name.endswith(".provenance.json") and not f.name.startswith("."):
            write_sidecar(f, rule="launch_artifacts", config_slice=cfg, inputs=files_of(inp))


main = stage(run, "launch_artifacts")
