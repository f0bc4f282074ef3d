"""Chaos: the real tiny study interrupted mid-proxy, then rerun (issue 13, item 7).

SIGINT to the Snakemake process alone (not its process group: the case where Snakemake would wait for the
running proxy to finish) while a proxy's two torchrun workers train. The Snakefile's ``onstart:`` passes it
on to the proxy launcher (``proxy.procs.forward_signals_to_proxies``): every process below Snakemake is gone
within seconds, Snakemake exits, no hidden work folder, temporary spec folder or partial record is left.
The rerun completes, and the memo counts every proxy of the proxy set. (Ctrl-C, SIGINT to the whole group,
reaches the launcher directly: tests/integration/test_interrupts.py.)
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "slurm"))
from workflow_copy import SNAKEMAKE, copy_workflow, snakemake  # noqa: E402

from trainplan.proxy import procs as P  # noqa: E402
from trainplan.proxy.aggregate import check_record  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")]
TINY = ("--cores", "2", "--configfile", "config/tiny.yaml")
GONE_WITHIN_S = 20.0


def _ranks(pid: int) -> list[int]:
    return [p for p in P.descendants(pid) if P.RANK_ENTRY in (c := P.cmdline(p)) and "torch.distributed.run" not in c]


def _processes_in(wf: Path) -> list[tuple[int, list[str]]]:
    """Live processes whose working directory is inside the workflow copy."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit() and P.running(int(d)):
            try:
                cwd = os.readlink(f"/proc/{d}/cwd")
            except OSError:
                continue
            if cwd == str(wf) or cwd.startswith(f"{wf}/"):
                out.append((int(d), P.cmdline(int(d))))
    return out


def _hidden(runs: Path) -> list[str]:
    return sorted(p.name for p in runs.iterdir() if p.name.startswith(".")) if runs.exists() else []


@pytest.mark.timeout(900)
def test_study_interrupted_mid_proxy_reruns_to_a_memo_that_counts_every_proxy(tmp_path):
    wf = copy_workflow(tmp_path / "wf")
    runs = wf / "results" / "proxies" / "runs"
    with (tmp_path / "first.log").open("w") as log:
        smk = subprocess.Popen([SNAKEMAKE, *TINY], cwd=wf, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
        deadline = time.monotonic() + 300
        while len(_ranks(smk.pid)) < 2:
            assert smk.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no proxy started within 300 s"
            time.sleep(0.1)
        time.sleep(1.0)  # the ranks are importing torch / training
        tree = {p: st[2] for p in P.descendants(smk.pid) if (st := P.proc_stat(p))}
        running = [p for p in _ranks(smk.pid)]
        spec_dir = next(Path(a).parent for p in running for a in P.cmdline(p) if a.endswith("spec.json"))
        t0 = time.monotonic()
        os.kill(smk.pid, signal.SIGINT)  # Snakemake alone
        while any(P.running(p, s) for p, s in tree.items()):
            assert time.monotonic() - t0 < GONE_WITHIN_S, [P.cmdline(p) for p, s in tree.items() if P.running(p, s)]
            time.sleep(0.05)
        gone = time.monotonic() - t0
        rc = smk.wait(timeout=60)
        exited = time.monotonic() - t0
    first = (tmp_path / "first.log").read_text()
    interrupted = re.search(r"proxy ([\w-]+): interrupted \(SIGINT received\); process tree killed in ([\d.]+) s",
                            first + "".join(p.read_text() for p in (wf / "results" / "logs").rglob("*.log")))
    print(f"SIGINT to Snakemake mid-proxy: {len(tree)} processes below Snakemake gone in {gone:.2f} s; Snakemake exit {rc} "
          f"after {exited:.2f} s; "
          f"launcher: {interrupted.group(0) if interrupted else '?'}")
    assert rc != 0 and interrupted, first[-3000:]
    pid = interrupted.group(1)
    assert not spec_dir.exists() and _hidden(runs) == [], _hidden(runs)  # no .{id}.* work folder
    assert not (runs / f"{pid}.json").exists()  # no record of the interrupted proxy
    for rec in runs.glob("*.json") if runs.exists() else ():
        if not rec.name.endswith(".provenance.json"):
            check_record(rec)  # what finished before the interrupt is complete and valid
    tmp_spec = re.search(rf"proxy {pid}: trainplan proxy (\S+)/run_spec.json",
                         (wf / "results" / "logs" / "proxy_run" / f"{pid}.log").read_text())
    assert tmp_spec and not Path(tmp_spec.group(1)).exists()  # the stage's temporary spec folder is gone
    assert _processes_in(wf) == []

    r = snakemake(wf, *TINY, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ids = [p["id"] for p in json.loads((wf / "results" / "proxies" / "proxy_set.json").read_text())["proxies"]]
    for i in ids:
        assert check_record(runs / f"{i}.json", i)["status"] == "ok"
    assert (wf / "results" / "proxies" / "records.csv").read_text().count("\n") == len(ids) + 1
    text = subprocess.run(["pdftotext", "-layout", str(wf / "results" / "memo" / "design_memo.pdf"), "-"],
                          capture_output=True, text=True, check=True).stdout
    n = len(ids)
    assert re.search(rf"\b{n}\s+proxy\s+runs\s+\({n}\s+ok\b", text), re.findall(r".{0,40}proxy runs.{0,40}", text)
    assert _hidden(runs) == [] and _processes_in(wf) == []
