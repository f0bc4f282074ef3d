"""Rule ``memo``: design_memo.pdf via ``trainplan.report.memo.render_memo``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from trainplan.launch.artifacts import launch_judge
from trainplan.provenance import git_state, study_hash
from trainplan.report.benchmarks import benchmark_rows, benchmark_summary
from trainplan.report.memo import render_memo
from trainplan.stages.common import (
    sidecars,
    specs_from_cfg,
    stage,
)


def run(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """design_memo.pdf via ``trainplan.report.memo.render_memo``."""
    # reads only the declared inputs (and what they name: the figure SVGs in the figures dir, the launch files
    # manifest.json lists next to it, each input's provenance sidecar); the results dir only names files
    results = Path(out["pdf"]).parent.parent
    os.environ.setdefault("SOURCE_DATE_EPOCH", str(cfg["memo"]["source_date_epoch"]))
    bench = inp.get("benchmarks")
    files = [bench] if isinstance(bench, str) else list(bench or [])
    s = specs_from_cfg(cfg)  # page 1's day-1 switch is sized as the launch runs it (the launch stage's judge)
    judge = launch_judge(s["model"], s["cluster"], s["training"], s.get("efficiency"))
    render_memo(inp, out["pdf"], config=dict(cfg), study_hash=study_hash(cfg), results_root=results, judge=judge,
                git_commit=str(git_state()["commit"]),
                benchmarks=benchmark_summary(benchmark_rows(files)) if files else None,
                template=inp.get("template"), css=inp.get("css"))
    sidecars("memo", out, cfg, inp)


main = stage(run, "memo")
