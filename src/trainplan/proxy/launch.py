"""Start a proxy run under torchrun (or srun + torchrun inside a multi-node Slurm allocation) and
turn what the ranks left behind into one RECORD.

Locally: ``python -m torch.distributed.run --standalone --nproc-per-node N -m trainplan.proxy.run``.
Inside Slurm with ``SLURM_JOB_NUM_NODES > 1``: ``srun --nodes=K --ntasks-per-node=1`` starting one torchrun
per node with a c10d rendezvous on the allocation's first host. The whole process group is killed after
``timeout_s`` (a hung collective → status ``timeout``). Arguments are passed as a list, never a shell string.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trainplan.io import read_json, write_json

RDZV_PORT = 29517


def first_slurm_host() -> str:
    """The address of the allocation's first node: its ``NodeAddr`` (``scontrol show node``), which is what
    Slurm itself connects to and may differ from the NodeName (an IB interface, an IP); the name if unset."""
    name = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                          check=True, capture_output=True, text=True).stdout.split()[0]
    info = subprocess.run(["scontrol", "show", "node", "-o", name], capture_output=True, text=True).stdout
    addr = next((f.split("=", 1)[1] for f in info.split() if f.startswith("NodeAddr=")), "")
    return addr or name


def torchrun_command(spec: dict[str, Any], spec_path: str, rank_dir: str, env: dict[str, str] | None = None) -> list[str]:
    """The argv that starts every rank of ``spec``."""
    env = os.environ if env is None else env
    entry = ["-m", "trainplan.proxy.run", spec_path, rank_dir]
    nproc = str(spec["nproc_per_node"])
    nodes = int(env.get("SLURM_JOB_NUM_NODES", "1"))
    if spec["nnodes"] > 1 or nodes > 1:
        if nodes < spec["nnodes"]:
            from trainplan.specs import ConfigError

            raise ConfigError("nnodes", spec["nnodes"], f"the Slurm allocation has {nodes} node(s)")
        host = first_slurm_host()
        return ["srun", f"--nodes={spec['nnodes']}", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
                sys.executable, "-m", "torch.distributed.run", f"--nnodes={spec['nnodes']}",
                f"--nproc-per-node={nproc}", "--rdzv-backend=c10d", f"--rdzv-endpoint={host}:{RDZV_PORT}",
                f"--rdzv-id=trainplan-{spec['id']}", *entry]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *entry]


def launch(spec: dict[str, Any], out: str | Path, *, log=sys.stderr) -> tuple[dict[str, Any], int]:
    """Run the proxy, write the RECORD to ``out`` atomically; returns (record, exit code)."""
    from trainplan.proxy.record import assemble_record

    out = Path(out)
    work = Path(tempfile.mkdtemp(prefix=f".{spec['id']}.", dir=out.parent if out.parent.exists() else None))
    try:
        spec_path = work / "spec.json"
        write_json(spec_path, spec)
        rank_dir = work / "ranks"
        rank_dir.mkdir()
        cmd = torchrun_command(spec, str(spec_path), str(rank_dir))
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env, start_new_session=True)
        timed_out = False
        try:
            rc = proc.wait(timeout=spec["timeout_s"])
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            rc = proc.wait()
        wall = time.monotonic() - t0
        ranks = [read_json(p) for p in sorted(rank_dir.glob("rank*.json"))]
        record = assemble_record(spec, ranks, timed_out=timed_out, returncode=rc, wall_s=wall)
        write_json(out, record)
        return record, (1 if record["status"] == "error" else 0)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the launcher's whole process group, then SIGKILL what is left after 10 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
