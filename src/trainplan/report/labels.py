"""Labels for ``snakemake --report`` entries, read from sidecars when the report is built.

Kept free of matplotlib and WeasyPrint: the rules import it every time Snakemake parses the workflow.
"""

from __future__ import annotations

import json
from pathlib import Path

from trainplan.provenance import read_sidecar


def caption_path(svg: str | Path) -> Path:
    """The caption sidecar of a saved figure: ``<name>.caption.json`` beside ``<name>.svg``."""
    p = Path(svg)
    return p.with_name(p.stem + ".caption.json")


def figure_labels(fig_dir: str | Path, name: str) -> dict[str, str]:
    """Labels of figure ``name``: its config hash, sources and calibration source (braces doubled, since
    Snakemake substitutes wildcards in label values)."""
    cap = json.loads(caption_path(Path(fig_dir) / f"{name}.svg").read_text(encoding="utf-8"))
    labels = {"figure": name, "config hash": str(cap["config_hash"]), "sources": ", ".join(cap.get("sources", [])),
              "calibration": str(cap.get("calibration_source") or "n/a")}
    return {k: v.replace("{", "{{").replace("}", "}}") for k, v in labels.items()}


def memo_labels(pdf: str | Path) -> dict[str, str]:
    """Labels of the memo: the study's config hash and commit, from its provenance sidecar."""

    sc = read_sidecar(pdf)
    commit = (sc.get("git") or {}).get("commit") if isinstance(sc.get("git"), dict) else None
    return {"config hash": str(sc["config_hash"]), "commit": str(commit or "n/a")}
