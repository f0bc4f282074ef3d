"""benchmarks/bench_flex_attention.py: its work accounting and masks against torch's own, and its timed path on CPU
(forward only: FlexAttention has no CPU backward; the figures are host figures, never a GPU's)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import bench_flex_attention as bench  # noqa: E402


@pytest.mark.parametrize("seq,cp", [(1024, 2), (2048, 4), (4096, 8)])
def test_head_tail_positions_are_torchs_load_balancer(seq, cp):
    """The CP rows' local queries are the rank's slice of torch's head-tail rearrangement (the balancer
    torchtitan's CP uses by default)."""
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import _HeadTailLoadBalancer

    order = _HeadTailLoadBalancer(seq, cp, "cpu")._generate_indices()[0].tolist()
    local = seq // cp
    for rank in range(cp):
        assert bench.head_tail_positions(seq, cp, rank) == order[rank * local:(rank + 1) * local]


def test_each_cases_work_is_its_masks_score_pairs():
    """The plan's pairs are what each case's mask lets through, counted on the dense mask (the diagonal at half, the
    s²/2 convention for a causal square): so a TFLOP/s figure and the ratio to FA2 are per unit of real work."""
    import torch

    rows = bench.plan([512, 1024], 1024, [2, 4], 384, heads=2, head_dim=8)  # documents cut short at the end
    assert [r["case"] for r in rows] == ["fa2"] * 2 + ["flex causal"] * 2 + ["flex cp2", "flex cp4"] + [
        "flex documents"] * 2
    for r in rows:
        mod = bench.mask_mod_of(r, "cpu") or (lambda b, h, q, kv: q >= kv)
        q = torch.arange(r["queries"])[:, None]
        kv = torch.arange(r["keys"])[None, :]
        dense = mod(0, 0, q, kv)
        pos = torch.tensor(bench.head_tail_positions(r["seq"], r["cp"], r["cp"] - 1))[:, None] if r["cp"] > 1 else q
        diagonal = (dense & (pos == kv)).sum().item()
        assert dense.sum().item() - diagonal / 2 == r["pairs"], r["case"]
        assert r["train_flops"] == 3 * r["fwd_flops"] == 3 * 4.0 * r["batch"] * 2 * r["pairs"] * 8
    # the CP rank's share: seq²/(2·cp), the causal half split evenly
    assert [r["pairs"] for r in rows[4:6]] == [1024**2 / 4, 1024**2 / 8]


def test_arguments_are_checked_before_anything_runs(capsys):
    for argv, key in [(["--seqs", "1000"], "--seqs"), (["--seqs", "4096", "--cps", "1"], "--cps"),
                      (["--doc-tokens", "0"], "--doc-tokens")]:
        with pytest.raises(SystemExit) as e:
            bench.main([*argv, "--dry-run"])
        assert e.value.code == 2 and key in capsys.readouterr().err


@pytest.mark.slow
def test_timed_path_runs_on_cpu(tmp_path):
    """Every case runs through the timed path (forward only on CPU), and the JSON holds each with its rate against
    FA2; no training figure is written for a CPU run."""
    out = tmp_path / "flex.json"
    assert bench.main(["--device", "cpu", "--seqs", "256", "--tokens", "512", "--cps", "2", "--doc-tokens", "64",
                       "--heads", "2", "--head-dim", "16", "--iters", "1", "--warmup", "0", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    rows = doc["results"]
    assert doc["environment"]["device"] == "cpu" and [r["case"] for r in rows] == [
        "fa2", "flex causal", "flex cp2", "flex documents"]
    assert not [r for r in rows if "error" in r]
    assert all(r["fwd_s"] > 0 and "train_s" not in r for r in rows)
    assert rows[0]["fwd_time_per_pair_rel_fa2"] == 1.0
    # 128-token blocks: the documents keep the 2 diagonal blocks of 4, causal 3 of 4, the CP rank's queries (64-191)
    # reach both key blocks
    assert rows[3]["mask_density"] < rows[1]["mask_density"] < rows[2]["mask_density"] <= 1.0


@pytest.mark.slow
def test_many_cases_stay_compiled(tmp_path, recwarn):
    """Each case recompiles the one compiled flex_attention (its shape, its mask_mod). Past dynamo's recompile limit
    (8) the compiled call falls back to FlexAttention's eager path, which materialises the score matrix: the later
    cases would time that, silently. 14 FlexAttention cases here, every one compiled (a GPU run's default has 7,
    each compiled twice: the forward under no_grad, and forward with backward)."""
    import torch

    limit = torch._dynamo.config.recompile_limit
    out = tmp_path / "flex.json"
    try:
        assert bench.main(["--device", "cpu", "--seqs", "256,384,512,640,768", "--tokens", "7680", "--cps", "2,3,4,6",
                           "--doc-tokens", "64", "--heads", "2", "--head-dim", "16", "--iters", "1", "--warmup", "0",
                           "--out", str(out)]) == 0
    finally:
        torch._dynamo.config.recompile_limit = limit
        torch._dynamo.config.fail_on_recompile_limit_hit = False
    rows = json.loads(out.read_text())["results"]
    assert sum(r["case"] != "fa2" for r in rows) == 14 and not [r for r in rows if "error" in r]
    assert not [w for w in recwarn if "without torch.compile" in str(w.message)]
