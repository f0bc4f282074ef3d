"""The proxy launcher across Slurm nodes: srun + torchrun + c10d rendezvous on a real (emulated) 2-node cluster.

Two slurmd daemons on this machine give two real Slurm nodes (tests/slurm/cluster.py, ``nodes=2``); an
``sbatch -N 2`` job runs ``trainplan proxy`` with ``nnodes: 2``, so the launcher must take its multi-node
path (one ``srun`` task per node, rendezvous at the first node's NodeAddr). The record says on which Slurm
nodes the ranks ran, and its per-rank state bytes must still equal the analytic prediction exactly.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "slurm"))
from cluster import EMULATED_PREFIX, PARTITION, available, local_slurm  # noqa: E402

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SPEC = {"id": "two-node-fsdp", "family": "scaleout", "model": "debug", "nnodes": 2, "nproc_per_node": 1,
        "layout": {"dp": 2, "sharding": "zero3"}, "seq_len": 64, "global_batch": 4, "steps": 6, "warmup": 1,
        "timeout_s": 240}


def _wait_gone(job: str, env: dict, timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        q = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], env=env, capture_output=True, text=True)
        if not q.stdout.strip():
            return
        time.sleep(2)
    raise TimeoutError(f"job {job} still queued/running after {timeout_s} s")


@pytest.mark.skipif(available() is not None, reason=f"local Slurm: {available()}")
def test_proxy_spans_two_slurm_nodes_with_srun_and_c10d(tmp_path):
    spec, rec, log = tmp_path / "spec.json", tmp_path / "record.json", tmp_path / "job.out"
    spec.write_text(json.dumps(SPEC))
    trainplan = Path(sys.executable).with_name("trainplan")
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=1 --time=5 --output={log}\n"
                      f"#SBATCH --partition={PARTITION}\n"
                      f"{trainplan} proxy {spec} --out {rec}\n")
    with local_slurm(tmp_path, nodes=2) as env:
        nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], env=env, capture_output=True, text=True).stdout.split()
        assert sorted(nodes) == [f"{EMULATED_PREFIX}1", f"{EMULATED_PREFIX}2"]
        sub = subprocess.run(["sbatch", "--parsable", "--export=ALL", str(script)], env=env, capture_output=True,
                             text=True, check=True)
        _wait_gone(sub.stdout.strip().split(";")[0], env, 300)
    out = log.read_text() if log.exists() else "(no job log)"
    assert rec.exists(), out[-3000:]
    r = json.loads(rec.read_text())
    assert r["status"] == "ok", (r["message"], out[-3000:])
    env_ = r["environment"]
    assert env_["world_size"] == 2 and env_["backend"] == "gloo"
    assert env_["slurm_nodes"] == [f"{EMULATED_PREFIX}1", f"{EMULATED_PREFIX}2"]  # one rank per Slurm node
    exact = r["predicted"]["exact_state_bytes"]
    for rank in r["memory"]["state_bytes_per_rank"]:
        assert {k: rank[k] for k in exact} == exact
    assert r["comm"]["all_gather_into_tensor"]["calls"] > 0 and r["comm"]["reduce_scatter_tensor"]["calls"] > 0
    assert r["loss"][-1] < r["loss"][0]
