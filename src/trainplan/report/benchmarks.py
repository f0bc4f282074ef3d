"""Wall time and peak memory of the expensive rules, from Snakemake's ``benchmark:`` TSVs.

The workflow writes ``results/benchmarks/<rule>.tsv`` (and ``benchmarks/proxy_run/<id>.tsv``, one per
proxy) and passes them to the memo rule as the input ``benchmarks``. Snakemake's benchmark columns: ``s``
(wall seconds), ``h:m:s``, ``max_rss`` (MB), ``max_vms``, ``max_uss``, ``max_pss``, ``io_in``, ``io_out``,
``mean_load``, ``cpu_time``; one row per repeat (``repeat("...", n)``) — the median of the repeats is used.
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["benchmark_rows", "benchmark_summary"]


def _num(v: str | None) -> float | None:
    try:
        return float(v) if v not in (None, "", "-", "NA") else None
    except ValueError:
        return None


def _rule_of(path: Path) -> str:
    """``benchmarks/calibrate.tsv`` → ``calibrate``; ``benchmarks/proxy_run/depth-L1.tsv`` → ``proxy_run depth-L1``."""
    return f"{path.parent.name} {path.stem}" if path.parent.name != "benchmarks" else path.stem


def benchmark_rows(paths: Iterable[str | Path] | str | Path) -> list[dict[str, Any]]:
    """``[{rule, wall_s, max_rss_mb, cpu_s}]`` per benchmark TSV, in the given order (a directory: every
    ``*.tsv`` under it, sorted). A missing or empty file is skipped; a missing column is ``None``."""
    if isinstance(paths, str | Path) and Path(paths).is_dir():
        paths = sorted(Path(paths).rglob("*.tsv"))
    elif isinstance(paths, str | Path):
        paths = [paths]
    rows: list[dict[str, Any]] = []
    for p in map(Path, paths):
        if not p.is_file():
            continue
        with p.open(newline="", encoding="utf-8") as f:
            recs = list(csv.DictReader(f, delimiter="\t"))
        if not recs:
            continue

        def med(col: str, recs: list[dict[str, str]] = recs) -> float | None:
            xs = [x for x in (_num(r.get(col)) for r in recs) if x is not None]
            return statistics.median(xs) if xs else None

        rows.append({"rule": _rule_of(p), "wall_s": med("s"), "max_rss_mb": med("max_rss"), "cpu_s": med("cpu_time")})
    return rows


def benchmark_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Rows for a short memo table: each non-proxy rule, the proxies as one line (count, total and slowest
    wall time, peak RSS), and the total of the benchmarked wall time."""
    proxies = [r for r in rows if r["rule"].startswith("proxy_run ")]
    out = [r for r in rows if not r["rule"].startswith("proxy_run ")]
    if proxies:
        walls = [r["wall_s"] or 0.0 for r in proxies]
        slowest = max(proxies, key=lambda r: r["wall_s"] or 0.0)
        rss = [r["max_rss_mb"] for r in proxies if r["max_rss_mb"] is not None]
        out.append({"rule": f"proxy_run x{len(proxies)} (slowest: {slowest['rule'].split(' ', 1)[1]}, "
                            f"{slowest['wall_s'] or 0.0:.1f} s)",
                    "wall_s": sum(walls), "max_rss_mb": max(rss) if rss else None,
                    "cpu_s": sum(r["cpu_s"] or 0.0 for r in proxies)})
    return {"rows": out, "total_wall_s": sum(r["wall_s"] or 0.0 for r in rows), "n_files": len(rows)}
