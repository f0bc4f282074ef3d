"""benchmarks/bench_ring_attention.py: its call list is the FLOPs it divides by, those FLOPs are the ones the model
times, and without CUDA it says so instead of timing something else (torch's CP runs CUDA SDPA only)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from trainplan.model import timing
from trainplan.model.efficiency import Efficiency
from trainplan.model.hardware import resolve_gpu

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("bench_ring_attention", ROOT / "benchmarks" / "bench_ring_attention.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)  # type: ignore[union-attr]


@pytest.mark.parametrize("cp", [1, 2, 4, 8, 16])
def test_the_last_ranks_calls_are_its_share_of_the_causal_scores(cp):
    local = 4096
    (row,) = bench.plan([cp], local, heads=32, head_dim=128)
    causal_half = sum(q * k / (2 if causal else 1) for q, k, causal in row["calls"])
    assert row["seq_len"] == cp * local
    assert causal_half == row["score_pairs"] == (cp * local) ** 2 / (2 * cp)  # balanced: 1/cp of the causal half
    assert len(row["calls"]) == cp and sum(c[2] for c in row["calls"]) == 1  # one causal step, the rest non-causal


def test_model_figures_time_the_same_flops():
    rows = bench.plan([1, 2, 8], 32768, heads=32, head_dim=128)
    fig = bench.model_figures(rows, "h100-sxm-80gb")
    g = resolve_gpu("h100-sxm-80gb")
    eff = timing.class_efficiency(Efficiency.for_gpu(g), "compiled")
    rate = g.peak_bf16_flops * float(timing.attn_eff_at(32768, 128, eff))  # every call sees seq/cp = 32,768 keys
    for r, f in zip(rows, fig, strict=True):
        assert f["model_kernels_fwd_s"] == pytest.approx(r["fwd_flops"] / rate, rel=1e-12)
        assert f["model_kernels_train_s"] == pytest.approx(r["train_flops"] / rate * (1 + timing.ATTN_BWD_FACTOR) / 3,
                                                           rel=1e-12)
    assert fig[0]["model_overhead_bytes_per_token_train"] == 0 and fig[0]["model_time_per_flop_rel"] == 1
    # the model charges the ring's merges and copies in proportion to cp, like the attention: a constant share
    assert fig[1]["model_time_per_flop_rel"] > 1
    assert fig[2]["model_time_per_flop_rel"] == pytest.approx(fig[1]["model_time_per_flop_rel"], rel=1e-3)


def test_dry_run_prints_every_cp(capsys):
    assert bench.main(["--dry-run", "--cps", "1,2,4", "--local-tokens", "1024"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines[1:]] == ["1", "2", "4"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_without_cuda_it_refuses(capsys):
    assert bench.main(["--cps", "1,2", "--local-tokens", "64"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize("cps", ["1,3,4", "0,2", "two"])
def test_bad_cps_is_a_clear_error(cps, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--dry-run", "--cps", cps])
    assert e.value.code == 2 and "--cps" in capsys.readouterr().err


def test_summarize_turns_timings_into_the_models_units():
    rows = bench.plan([1, 2, 4], 1000, heads=2, head_dim=64)
    for r, (train, kernels) in zip(rows, [(1.0, 1.0), (2.5, 2.0), (5.0, 4.0)], strict=True):
        r |= {"train_s": train, "kernels_train_s": kernels}
    rows[2] = {**rows[2], "error": "RuntimeError: x"}
    del rows[2]["train_s"]
    bench.summarize(rows, hbm_Bps=1e12)
    assert rows[0]["time_per_flop_rel"] == 1 and rows[0]["overhead_bytes_per_token_train"] == 0
    assert rows[1]["time_per_flop_rel"] == pytest.approx(2.5 / 2)  # twice the FLOPs in 2.5× the time
    assert rows[1]["overhead_bytes_per_token_train"] == pytest.approx(0.5 * 1e12 / 1000)
    assert "time_per_flop_rel" not in rows[2]  # an error stays an error, not a ratio


def test_without_the_reference_row_there_is_no_ratio():
    rows = bench.plan([1, 2], 1000, heads=2, head_dim=64)
    rows[0]["error"] = "RuntimeError: x"
    rows[1] |= {"train_s": 2.0, "kernels_train_s": 1.5}
    bench.summarize(rows, hbm_Bps=1e12)
    assert rows[1]["time_per_flop_rel"] is None and rows[1]["overhead_train_s"] == pytest.approx(0.5)


def test_the_timing_helper_runs_forward_and_backward_on_cpu():
    import argparse

    q, k, v = (torch.randn(1, 2, 64, 16, requires_grad=True) for _ in range(3))
    g = torch.randn(1, 2, 64, 16)
    fwd, train = bench._fwd_train_times(q, k, v, g, True, argparse.Namespace(warmup=1, iters=2),
                                        bench.event_timer("cpu"))
    assert fwd > 0 and train > 0
    assert q.grad is not None and k.grad is not None and v.grad is not None  # the backward ran into q, k, v
