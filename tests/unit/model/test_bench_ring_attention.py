"""benchmarks/bench_ring_attention.py: its call list is the FLOPs it divides by, those FLOPs are the ones the model
times, and without CUDA it says so instead of timing something else (torch's CP runs CUDA SDPA only)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
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
    # the model charges the ring's merges and copies in proportion to cp, like the attention: a near-constant share
    # (the backward's first send copies its strided fp32 dK, dV once per pass, not per step: 0.3% less at cp 8)
    assert fig[1]["model_time_per_flop_rel"] > 1
    assert fig[2]["model_time_per_flop_rel"] == pytest.approx(fig[1]["model_time_per_flop_rel"], rel=5e-3)
    assert fig[2]["model_time_per_flop_rel"] < fig[1]["model_time_per_flop_rel"]


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


# The timed path on CPU: torch's context parallel dispatches only the CUDA flash/efficient/cuDNN SDPA ops, so the
# script registers CPU kernels for aten::_scaled_dot_product_flash_attention (and its backward) that call the CPU
# flash ops and routes F.scaled_dot_product_attention to it, as CUDA SDPA does under sdpa_kernel([FLASH_ATTENTION]).
# The benchmark's own _measure then runs context_parallel on the fake process group exactly as on the GPU. In a
# subprocess: the aten registration and the patched SDPA must not leak into other tests.
SCRIPT = r'''
import argparse, json, sys
import torch
import torch.nn.functional as F
import torch.distributed._functional_collectives as ft_c

sys.path.insert(0, sys.argv[1])
import bench_ring_attention as B

aten = torch.ops.aten
CALLS = []
lib = torch.library.Library("aten", "IMPL")


def flash_fwd(q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    CALLS.append(["fwd", q.size(2), k.size(2), bool(is_causal)])
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, scale=scale)
    seed = torch.empty(2, dtype=torch.uint64)  # what CUDA flash returns: no cum_seq, a (2,) seed, a () offset
    return out, lse, None, None, q.size(2), k.size(2), seed, torch.empty((), dtype=torch.uint64), q.new_empty(0)


def flash_bwd(g, q, k, v, out, lse, cq, ck, mq, mk, dropout_p, is_causal, seed, offset, *, scale=None):
    CALLS.append(["bwd", q.size(2), k.size(2), bool(is_causal)])
    return aten._scaled_dot_product_flash_attention_for_cpu_backward(g, q, k, v, out, lse, dropout_p, is_causal,
                                                                      scale=scale)


lib.impl("_scaled_dot_product_flash_attention", flash_fwd, "CPU")
lib.impl("_scaled_dot_product_flash_attention_backward", flash_bwd, "CPU")


def scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, scale=scale)[0]


F.scaled_dot_product_attention = scaled_dot_product_attention

collectives = {"n": 0}  # the fake group's copying collectives, if the script let them run while timing the ring
for name in ("all_gather_single", "all_gather_tensor", "permute_tensor"):
    if hasattr(ft_c, name):
        real = getattr(ft_c, name)
        def counted(*args, _real=real, **kw):
            collectives["n"] += 1
            return _real(*args, **kw)
        setattr(ft_c, name, counted)

a = argparse.Namespace(heads=2, head_dim=16, local_tokens=64, iters=1, warmup=1, device="cpu")
rows = B.plan([1, 2, 4, 8], a.local_tokens, a.heads, a.head_dim)
start = {}
real_ring = B._ring_times
def ring(a_, r, *rest):
    start[r["cp"]] = len(CALLS)
    return real_ring(a_, r, *rest)
B._ring_times = ring
B._measure(a, rows)
B.summarize(rows, 4.8e12)
print(json.dumps({"rows": [{k: r.get(k) for k in ("cp", "calls", "fwd_s", "train_s", "kernels_train_s", "error",
                                                  "time_per_flop_rel")} for r in rows],
                  "calls": CALLS, "start": start, "collectives": collectives["n"],
                  "sdpa_restored": F.scaled_dot_product_attention is scaled_dot_product_attention}))
'''


def test_ring_benchmark_times_torch_context_parallel_on_the_fake_group(tmp_path):
    script = tmp_path / "ring_cpu.py"
    script.write_text(SCRIPT)
    r = subprocess.run([sys.executable, str(script), str(ROOT / "benchmarks")], capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    rows, calls = doc["rows"], doc["calls"]
    assert [row["cp"] for row in rows] == [1, 2, 4, 8]
    assert all(row["error"] is None and row["train_s"] > 0 and row["time_per_flop_rel"] > 0 for row in rows), rows
    assert doc["sdpa_restored"]  # F.sdpa is SDPA again after every CP degree
    # the fake group's collectives copy (cp copies of K, V per all-gather, the dK/dV all-to-all every backward
    # step): they must not run inside the timed ring, or their traffic reads as ring overhead
    assert doc["collectives"] == 0
    for row in rows[1:]:
        cp = row["cp"]
        ring = calls[doc["start"][str(cp)]:]
        ring = ring[:len(ring) if cp == 8 else doc["start"][str(2 * cp)] - doc["start"][str(cp)]]
        fwd = [c for c in ring if c[0] == "fwd"]
        # one forward (no grad) and one forward + backward per timed call (warmup 1 + iters 1): the last rank's
        # ring is the plan's calls, the first causal over its two chunks, then cp - 1 over half the keys
        want = [[q, k, causal] for q, k, causal in row["calls"]]
        assert [c[1:] for c in fwd[:cp]] == want, (cp, fwd[:cp])
        assert len(fwd) == 4 * cp and len([c for c in ring if c[0] == "bwd"]) == 2 * cp, (cp, len(fwd))
