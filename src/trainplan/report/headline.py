"""The study's answer in three lines, printed when ``snakemake`` finishes (the Snakefile's ``onsuccess``): where
the memo is, the recommended layout with its p10–p90 throughput, and the cost. Read from the results files the
memo itself reads, so the terminal and page 1 agree; silent (None) when a run built only part of the DAG."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainplan.io import read_json


def _load(path: Path) -> dict[str, Any] | None:
    """io.read_json, or None when the file is missing or not JSON (a partial run is not an error here)."""
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None


def headline(results_dir: str | Path) -> str | None:
    """``None`` unless the memo, ``prediction/production.json`` and ``cost/cost.json`` are all there."""
    root = Path(results_dir)
    memo = root / "memo" / "design_memo.pdf"
    prod, cost = _load(root / "prediction" / "production.json"), _load(root / "cost" / "cost.json")
    if not memo.is_file() or not prod or not cost:
        return None
    ch, usd = prod.get("chosen") or {}, cost.get("dollars") or {}
    try:
        tok = [float(ch[f"tokens_per_s_per_gpu_{q}"]) for q in ("p50", "p10", "p90")]
        dollars = [float(usd[q]) for q in ("p50", "p10", "p90")]
        layout, family = str(ch["layout"]), str(ch["family"])
    except (KeyError, TypeError, ValueError):
        return None
    return (f"trainplan memo: {memo}\n"
            f"  recommended: {family}, {layout}: {tok[0]:,.0f} tokens/s/GPU (p10–p90 {tok[1]:,.0f}–{tok[2]:,.0f})\n"
            f"  cost: ${dollars[0]:,.0f} (p10–p90 ${dollars[1]:,.0f}–${dollars[2]:,.0f}); "
            f"how to read it: README.md, 'Reading the memo'")
