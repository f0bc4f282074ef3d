"""Rule ``aggregate``: records.csv: one flattened row per proxy RECORD, predicted next to measured."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from trainplan.io import read_json, write_csv
from trainplan.provenance import sidecar_path
from trainplan.proxy.aggregate import RecordsError, aggregate
from trainplan.stages.common import (
    CorruptResultError,
    remove_result,
    sidecars,
    stage,
)


def _proxy_set_path(inp: Mapping, records: list[str]) -> Path | None:
    if inp.get("proxy_set"):
        return Path(str(inp["proxy_set"]))
    return Path(records[0]).parent.parent / "proxy_set.json" if records else None


def run(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """records.csv: one flattened row per proxy RECORD, predicted next to measured.

    Every run named in proxy_set.json must be there and be a valid RECORD (``aggregate.check_records``). A
    missing, truncated or invalid one fails the rule with its path; the bad file and its sidecar are removed,
    so the next ``snakemake`` reruns exactly those proxies. The sidecar promises the row count and ids."""
    records = [str(p) for p in inp.get("records", [])]
    ps = _proxy_set_path(inp, records)
    expected = None
    if ps is not None and ps.exists():
        try:
            expected = [p["id"] for p in read_json(ps)["proxies"]]
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptResultError(f"{ps}: not a proxy set ({type(e).__name__}: {e})") from None
    try:
        df = aggregate(records, expected)
    except RecordsError as e:
        for p in e.paths:
            if p.exists():
                remove_result(p)
            else:  # an orphaned sidecar

                sidecar_path(p).unlink(missing_ok=True)
        lines = "\n".join(f"  {p}: {why}" for p, why in e.problems)
        raise CorruptResultError(f"aggregate: {len(e.problems)} proxy record(s) missing or invalid — removed "
                                 f"with their sidecars; rerun snakemake to redo these proxies:\n{lines}") from None
    write_csv(df, out["records"])
    sidecars("aggregate", out, cfg, inp, extra={"ids": list(df["id"]) if len(df) else []})


main = stage(run, "aggregate")
