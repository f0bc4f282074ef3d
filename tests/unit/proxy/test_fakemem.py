"""``trainplan proxy fakemem``: FSDPMemTracker on a fake N-rank FSDP2 world, next to the analytic breakdown."""

from __future__ import annotations

import json
import subprocess
import sys


def test_fakemem_sizes_the_sharded_params_as_the_analytic_model_does(tmp_path):
    """The subcommand runs in its own interpreter (it initialises a fake process group) and, on the debug model over
    4 fake ranks, FSDPMemTracker's sharded parameters are the analytic weights per rank, to the byte."""
    out = tmp_path / "fakemem.json"
    r = subprocess.run([sys.executable, "-m", "trainplan.cli", "proxy", "fakemem", "--model", "debug", "--world", "4",
                        "--seq-len", "64", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "FSDPMemTracker: debug on 4 fake ranks, seq 64" in r.stdout
    res = json.loads(out.read_text())
    assert res["world"] == 4 and res["seq_len"] == 64
    peak = res["peak_bytes_by_category"][res["device_type"]]
    assert peak["sharded_param"] == res["analytic"]["weights"] > 0
    assert peak["total"] >= peak["sharded_param"] + peak["opt"]


def test_fakemem_refuses_a_bad_flag_with_a_usage_error():
    r = subprocess.run([sys.executable, "-m", "trainplan.cli", "proxy", "fakemem", "--dtype", "fp16"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "invalid choice: 'fp16'" in r.stderr, r.stderr
