"""Interrupting a proxy: nothing of it survives, nothing half-done is left (issue 13, item 3).

A real 2-rank torchrun/gloo proxy (rank 1 hangs before its first collective: both workers alive, the run
never ends by itself) is interrupted four ways — SIGINT and SIGTERM to ``trainplan proxy``, SIGKILL to it
(only the kernel's parent-death signals are left), and SIGKILL to the ``snakemake`` process that started
it. Every descendant (snapshotted from /proc before the signal: torchrun's workers each lead a session of
their own) must be gone within seconds, with no record and no hidden ``.{id}.*`` work folder left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainplan.proxy import procs as P
from trainplan.proxy import torchrun as L

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
SPEC = {"id": "hang", "model": "debug", "layout": {"dp": 2, "sharding": "zero3"}, "seq_len": 64, "global_batch": 4,
        "steps": 3, "warmup": 1, "nproc_per_node": 2, "timeout_s": 300}
GONE_WITHIN_S = 15.0  # the launcher's grace is 3 s; the rest is slack for a loaded 2-core CI machine
ROOT = Path(__file__).resolve().parents[2]
PROXY = [sys.executable, "-c", "import sys; from trainplan.cli import main; sys.exit(main())", "proxy"]


def _workers(pid: int) -> set[int]:
    """The ranks: ``python -m trainplan.proxy.worker …`` (torchrun's own argv names them too)."""
    return {p for p in P.descendants(pid) if P.RANK_ENTRY in (c := P.cmdline(p)) and "torch.distributed.run" not in c}


def _start(tmp: Path, prefix: list[str] = (), cmd: list[str] | None = None) -> tuple[subprocess.Popen, int, set[int], dict]:
    """Start the hanging proxy (optionally under ``prefix``); wait until torchrun runs both workers."""
    (tmp / "spec.json").write_text(json.dumps(SPEC))
    logf = (tmp / "proxy.log").open("w")
    env = {**os.environ, "TRAINPLAN_PROXY_HANG_RANK": "1"}
    cmd = cmd or [*PROXY, str(tmp / "spec.json"), "--out", str(tmp / "hang.json")]
    top = subprocess.Popen([*prefix, *cmd], stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    deadline = time.monotonic() + 120
    while len(_workers(top.pid)) < 2:
        assert top.poll() is None, (tmp / "proxy.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "torchrun did not start two workers in 120 s"
        time.sleep(0.2)
    time.sleep(2.0)  # let the ranks get into the run (rank 0 blocks in its first collective)
    below = sorted(P.descendants(top.pid)) if prefix else [top.pid, *sorted(P.descendants(top.pid))]
    launcher = next(p for p in below if "proxy" in P.cmdline(p) and "trainplan.cli" in " ".join(P.cmdline(p)))
    tree = P.descendants(launcher)
    starts = {p: P.proc_stat(p)[2] for p in tree if P.proc_stat(p)}
    assert len(_workers(launcher)) == 2 and len(tree) >= 3, tree  # torchrun + 2 workers (+ helpers)
    return top, launcher, tree, starts


def _wait_gone(starts: dict[int, int], limit: float) -> float:
    t0 = time.monotonic()
    while any(P.running(p, s) for p, s in starts.items()):
        assert time.monotonic() - t0 < limit, [(p, P.cmdline(p)) for p, s in starts.items() if P.running(p, s)]
        time.sleep(0.05)
    return time.monotonic() - t0


def _left(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith(".hang.") or p.name.startswith("hang.json"))


# ------------------------------------------------------------------------------------ fast: no torch
def test_kill_tree_reaches_descendants_in_their_own_sessions():
    """What torchrun does (each worker in a new session), without torch: kill_tree still gets every one."""
    code = ("import subprocess, sys, time\n"
            "ps = [subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'], start_new_session=True) "
            "for _ in range(2)]\n"
            "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    deadline = time.monotonic() + 30
    while len(P.descendants(proc.pid)) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.3)  # the children have installed their SIGTERM-ignoring handler
    kids = {p: P.proc_stat(p)[2] for p in P.descendants(proc.pid)}
    took = L.kill_tree(proc, grace_s=0.5)  # they ignore SIGTERM: SIGKILL after the grace
    assert proc.returncode is not None and took < 10
    assert not any(P.running(p, s) for p, s in kids.items())


def test_unreadable_rank_result_is_an_error_result_not_a_crash(tmp_path):
    (tmp_path / "rank1.json").write_text('{"rank": 1, "sta')
    (tmp_path / "rank0.json").write_text("[]")
    assert L._rank_result(tmp_path / "rank1.json")["status"] == "error"
    assert "rank1.json" in L._rank_result(tmp_path / "rank1.json")["message"]
    assert L._rank_result(tmp_path / "rank0.json")["rank"] == 0


def test_watched_parent_is_none_outside_snakemake():
    assert L.watched_parent() is None  # pytest is not run by Snakemake: a plain proxy is not tied to its caller


# ------------------------------------------------------------------------ slow: real torchrun + gloo
@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_trainplan_proxy_kills_every_rank_and_leaves_nothing(tmp_path, sig):
    top, launcher, tree, starts = _start(tmp_path)
    t0 = time.monotonic()
    os.kill(launcher, sig)
    took = _wait_gone(starts, GONE_WITHIN_S)
    rc = top.wait(timeout=30)
    log = (tmp_path / "proxy.log").read_text()
    print(f"{sig.name}: {len(tree)} descendants gone {took:.2f} s after the signal; launcher exit "
          f"{time.monotonic() - t0:.2f} s, rc {rc}")
    assert rc == 128 + sig, log[-3000:]
    assert "interrupted" in log and "no record written" in log
    assert _left(tmp_path) == []  # no record, no .hang.* work folder


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigkill_of_the_launcher_still_takes_the_ranks_down(tmp_path):
    """No handler runs: torchrun's parent-death signal (SIGTERM) and the workers' (SIGKILL) do the work;
    the work folder the launcher could not remove is removed by the next launch of the same id."""
    top, launcher, tree, starts = _start(tmp_path)
    os.kill(launcher, signal.SIGKILL)
    took = _wait_gone(starts, GONE_WITHIN_S)
    top.wait(timeout=30)
    print(f"SIGKILL: {len(tree)} descendants gone {took:.2f} s after the launcher died")
    stale = [n for n in _left(tmp_path) if n.startswith(".hang.")]
    assert len(stale) == 1 and not (tmp_path / "hang.json").exists()
    L._stale_work_dirs(tmp_path / "hang.json", "hang")
    assert _left(tmp_path) == []


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_proxy_stops_when_the_snakemake_that_started_it_dies(tmp_path):
    """SIGKILL to a process named ``snakemake`` between pytest and the launcher: the launcher sees its run is
    gone, kills the tree, writes no record and exits 143 (the real study: tests/integration/test_chaos.py)."""
    fake = tmp_path / "bin" / "snakemake"
    fake.parent.mkdir()
    fake.write_text(f"#!{sys.executable}\nimport subprocess, sys\nsys.exit(subprocess.call(sys.argv[1:]))\n")
    fake.chmod(0o755)
    top, launcher, tree, starts = _start(tmp_path, [str(fake)])
    assert P.descendants(top.pid) >= {launcher}
    os.kill(top.pid, signal.SIGKILL)
    took = _wait_gone({**starts, launcher: P.proc_stat(launcher)[2]}, GONE_WITHIN_S)
    top.wait(timeout=30)
    log = (tmp_path / "proxy.log").read_text()
    print(f"parent lost: launcher and {len(tree)} descendants gone {took:.2f} s after snakemake died")
    assert "its snakemake (pid" in log and "no record written" in log, log[-3000:]
    assert _left(tmp_path) == []


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigterm_to_trainplan_preflight_stops_its_proxy_and_judges_nothing(tmp_path):
    from trainplan.io import write_json

    write_json(tmp_path / "analytic" / "summary.json", {"layout": {"dp": 32, "sharding": "zero2"}})
    cmd = [sys.executable, "-c", "import sys; from trainplan.cli import main; sys.exit(main())", "preflight",
           "--summary", str(tmp_path / "analytic" / "summary.json"), "--config", "config/config.yaml",
           "--out", str(tmp_path / "pf"), "--steps", "3", "--warmup", "1"]
    top, _, tree, starts = _start(tmp_path, cmd=cmd)
    os.kill(top.pid, signal.SIGTERM)
    took = _wait_gone(starts, GONE_WITHIN_S)
    rc = top.wait(timeout=30)
    print(f"preflight SIGTERM: {len(tree)} descendants gone {took:.2f} s after the signal, rc {rc}")
    assert rc == 143, (tmp_path / "proxy.log").read_text()[-3000:]
    assert sorted(p.name for p in (tmp_path / "pf").iterdir()) == ["preflight_spec.json"]


GRACEFUL_PARENT = """\
import signal, subprocess, sys
from trainplan.proxy.procs import forward_signals_to_proxies
# like Snakemake's scheduler: SIGTERM means "finish the running jobs, then exit" (exit_gracefully)
signal.signal(signal.SIGTERM, lambda *a: print("graceful: waiting for running jobs", flush=True))
forward_signals_to_proxies()  # what the Snakefile's onstart: hook installs
sys.exit(subprocess.call(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigterm_to_a_waiting_snakemake_reaches_its_proxies(tmp_path):
    """Snakemake alone gets SIGTERM and would wait for its jobs; with ``forward_signals_to_proxies`` (the
    Snakefile's onstart hook) the proxy launcher gets it too: the ranks are gone within seconds."""
    fake = tmp_path / "bin" / "snakemake"
    fake.parent.mkdir()
    fake.write_text(f"#!{sys.executable}\n{GRACEFUL_PARENT}")
    fake.chmod(0o755)
    top, launcher, tree, starts = _start(tmp_path, [str(fake)])
    assert P.proxy_launchers(top.pid) == {launcher}
    os.kill(top.pid, signal.SIGTERM)
    took = _wait_gone({**starts, launcher: P.proc_stat(launcher)[2]}, GONE_WITHIN_S)
    rc = top.wait(timeout=30)
    log = (tmp_path / "proxy.log").read_text()
    print(f"SIGTERM to the parent alone: launcher and {len(tree)} descendants gone {took:.2f} s later, rc {rc}")
    assert "graceful: waiting" in log and "interrupted (SIGTERM received)" in log, log[-3000:]
    assert rc == 143 and _left(tmp_path) == []
