"""Rule ``select_proxies``: proxy_set.json: RUN_SPECs chosen from the candidates by ``trainplan.proxy.select.select_proxies``."""

from __future__ import annotations

from collections.abc import Mapping

from trainplan.io import write_json
from trainplan.proxy.select import select_proxies
from trainplan.stages.common import (
    read_table,
    sidecars,
    specs_from_cfg,
    stage,
)


def run(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """proxy_set.json: RUN_SPECs chosen from the candidates by ``trainplan.proxy.select.select_proxies``."""
    s = specs_from_cfg(cfg)
    specs = select_proxies(read_table(inp["candidates"]), s["model"], s["training"], dict(cfg["proxies"]))
    ids = [p["id"] for p in specs]
    if len(set(ids)) != len(ids) or any(not str(i).replace("-", "").replace("_", "").isalnum() for i in ids):
        raise ValueError(f"proxy ids must be unique and [A-Za-z0-9_-]: {ids}")
    write_json(out["proxy_set"], {"status": "ok", "proxies": list(specs)})
    sidecars("select_proxies", out, cfg, inp)


main = stage(run, "select_proxies")
