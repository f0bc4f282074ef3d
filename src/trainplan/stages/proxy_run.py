"""Rule ``proxy_run``: one proxy RECORD via ``trainplan proxy RUN_SPEC.json --out RECORD.json`` (OOM → exit 0, status oom)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainplan import cli
from trainplan.io import read_json, write_json
from trainplan.proxy.slurm_resources import restore_allocation_env
from trainplan.proxy.torchrun import PROGRESS_ENV
from trainplan.stages.common import (
    log,
    sidecars,
    stage,
)


def run(inp: Mapping, out: Mapping, cfg: Mapping, *, wildcards: Mapping | None = None) -> None:
    """One proxy RECORD via ``trainplan proxy RUN_SPEC.json --out RECORD.json`` (OOM → exit 0, status oom)."""
    pid = (wildcards or {}).get("id")
    spec = next(p for p in read_json(inp["proxy_set"])["proxies"] if p["id"] == pid)
    with tempfile.TemporaryDirectory(prefix=f"proxy-{pid}-") as d:
        spec_path = Path(d) / "run_spec.json"
        write_json(spec_path, spec)
        log.info("proxy %s: trainplan proxy %s --out %s", pid, spec_path, out["record"])
        try:
            rc = cli.main(["proxy", str(spec_path), "--out", str(out["record"])])
        except SystemExit as e:  # SIGINT/SIGTERM, or the Snakemake run gone: the launcher killed every rank
            log.warning("proxy %s: interrupted (exit %s); no record written, the next run reruns it", pid, e.code)
            raise
    if rc not in (0, None) or not Path(out["record"]).exists():
        raise RuntimeError(f"proxy {pid}: `trainplan proxy` exited {rc} (see the log; Snakemake retries)")
    log.info("proxy %s: status %s", pid, read_json(out["record"]).get("status"))
    sidecars("proxy_run", out, {**cfg, "spec": spec}, inp)


_stage_main = stage(run, "proxy_run")


def main(smk: Any) -> None:
    """Snakemake entry point of ``proxy_run``. Rank 0 appends one line per training step to the rule's ``steps``
    log (``PROGRESS_ENV``), so a long GPU proxy can be followed with ``tail -f`` (a retry appends after an
    ``# attempt N`` line); in a Slurm job the node count/list the jobstep plugin removed are restored first."""
    steps = Path(smk.log.steps)
    steps.parent.mkdir(parents=True, exist_ok=True)
    attempt = int(getattr(smk, "attempt", 1) or 1)
    with steps.open("a" if attempt > 1 else "w") as f:
        f.write(f"# proxy {smk.wildcards.id}: attempt {attempt}\n")
    os.environ[PROGRESS_ENV] = str(steps.resolve())
    restore_allocation_env()  # multi-node proxies: SLURM_NNODES / SLURM_JOB_NODELIST
    _stage_main(smk)
