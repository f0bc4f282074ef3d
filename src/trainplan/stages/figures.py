"""Rule ``figures``: results/figures/*.svg via ``trainplan.report.figures.make_figures`` (each with caption metadata)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from trainplan.io import write_json
from trainplan.provenance import write_sidecar
from trainplan.report.figures import make_figures
from trainplan.stages.common import (
    files_of,
    stage,
)


def run(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """results/figures/*.svg via ``trainplan.report.figures.make_figures`` (each with caption metadata)."""
    outdir = Path(out["figures"])
    outdir.mkdir(parents=True, exist_ok=True)
    # reads only the declared inputs; the results dir (the output's parent) only names the caption sources
    made = make_figures(inp, outdir, results_root=outdir.parent)
    write_json(outdir / "index.json", {"status": "ok", "figures": {k: str(v) for k, v in made.items()}})
    for svg in sorted(outdir.glob("*.svg")):
        write_sidecar(svg, rule="figures", config_slice=cfg, inputs=files_of(inp))


main = stage(run, "figures")
