"""A proxy rank killed by the kernel's OOM killer for host memory is a recorded ``oom``, not a failed job.

Run for real: a memory cgroup with a limit the proxy's ranks exceed (a Slurm job's memory limit, a container's),
the launcher inside it. The rank dies of SIGKILL and writes nothing; the cgroup's oom_kill counter
(``proxy.torchrun.oom_kills``) is what says it was memory. Skipped where this machine lets no one create a memory
cgroup (the unit tests below still check the reading of both cgroup versions)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainplan.proxy.record import _status
from trainplan.proxy.torchrun import CGROUP_ROOT, oom_kills

LIMIT = 3 * 2**30  # launcher + torchrun's agent (~0.4 GB each) fit; two ranks of the model below (~2.7 GB each) do not
MODEL = {"name": "oom-probe", "layers": 8, "hidden": 1024, "heads": 16, "kv_heads": 16, "ffn_hidden": 2816,
         "vocab": 32000}


def _memory_cgroup(name: str) -> tuple[Path, str] | None:
    """A new memory cgroup limited to LIMIT bytes (v1, or v2 under this process's own cgroup): (dir, procs file);
    None where it cannot be made."""
    v1 = CGROUP_ROOT / "memory"
    try:
        if (v1 / "memory.limit_in_bytes").exists():
            d = v1 / name
            d.mkdir()
            (d / "memory.limit_in_bytes").write_text(str(LIMIT))
            return d, "cgroup.procs"
        own = Path(Path("/proc/self/cgroup").read_text().splitlines()[-1].split(":", 2)[2].lstrip("/"))
        parent = CGROUP_ROOT / own
        if "memory" not in (parent / "cgroup.subtree_control").read_text().split():
            return None
        d = parent / name
        d.mkdir()
        (d / "memory.max").write_text(str(LIMIT))
        return d, "cgroup.procs"
    except OSError:
        return None


@pytest.mark.slow
def test_a_rank_killed_for_host_memory_is_recorded_as_oom(tmp_path):
    made = _memory_cgroup(f"trainplan-test-{os.getpid()}")
    if made is None:
        pytest.skip("no memory cgroup can be created here (needs root and a writable cgroup hierarchy)")
    cg, procs = made
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"id": "host-oom", "model": MODEL, "layout": {"dp": 2, "sharding": "none"},
                                "seq_len": 64, "global_batch": 2, "steps": 3, "warmup": 1, "nproc_per_node": 2,
                                "timeout_s": 300}))
    out = tmp_path / "host-oom.json"
    script = ("import json, sys; from trainplan.proxy.schema import normalize_run_spec; "
              "from trainplan.proxy.torchrun import launch; "
              "rec, code = launch(normalize_run_spec(json.load(open(sys.argv[1]))), sys.argv[2]); sys.exit(code)")
    try:
        # the launcher joins the cgroup before it starts torchrun: every rank is born inside the limit
        r = subprocess.run(["bash", "-c", f'echo $$ > {cg / procs} && exec "$0" -c "$1" "$2" "$3"', sys.executable,
                            script, str(spec), str(out)], capture_output=True, text=True, timeout=400,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    finally:
        subprocess.run(["rmdir", str(cg)], capture_output=True)
    rec = json.loads(out.read_text())
    assert (rec["status"], r.returncode) == ("oom", 0), (rec["message"], r.stderr[-3000:])
    assert "OOM killer killed" in rec["message"] and "host memory" in rec["message"]


def test_oom_kills_reads_both_cgroup_versions_and_a_container_prefix(tmp_path):
    """v1 ``memory.oom_control`` under the memory controller's mount, v2 ``memory.events`` under the unified one;
    /proc/self/cgroup may name a path whose leading part the mount does not show (a container's own cgroup is the
    mount's root here: ``4:memory:/process_api/<id>`` with the file at the mount's top)."""
    proc = tmp_path / "cgroup"
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    proc.write_text("4:memory:/process_api/e153\n0::/\n")
    assert oom_kills(proc, tmp_path) == 3
    (tmp_path / "memory" / "e153").mkdir()
    (tmp_path / "memory" / "e153" / "memory.oom_control").write_text("oom_kill 5\n")
    assert oom_kills(proc, tmp_path) == 5  # the deepest path that exists
    v2 = tmp_path / "v2"
    (v2 / "job" / "step").mkdir(parents=True)
    (v2 / "job" / "step" / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\n")
    proc.write_text("0::/job/step\n")
    assert oom_kills(proc, v2) == 2
    proc.write_text("0::/elsewhere\n")
    assert oom_kills(proc, v2) is None
    assert oom_kills(tmp_path / "missing", v2) is None


def test_only_a_failed_run_missing_a_rank_with_kills_is_oom():
    """A kill counted in a cgroup that another run shares does not turn a run that finished, or one whose every rank
    wrote its own error, into an OOM: a rank the kernel killed writes nothing."""
    ok = [{"rank": 0, "status": "ok"}, {"rank": 1, "status": "ok"}]
    assert _status(ok, False, 0, host_oom_kills=1, world=2) == ("ok", "")
    status, msg = _status(ok[:1], False, 1, host_oom_kills=1, world=2)
    assert status == "oom" and "launcher exited 1 with 1 rank result(s)" in msg
    assert _status(ok[:1], False, 1, host_oom_kills=0, world=2)[0] == "error"
    assert _status(ok[:1], True, 1, host_oom_kills=1, world=2)[0] == "timeout"
    failed = [{"rank": 0, "status": "error", "message": "ValueError: bad"}, {"rank": 1, "status": "ok"}]
    assert _status(failed, False, 1, host_oom_kills=1, world=2) == ("error", "rank 0: ValueError: bad")
