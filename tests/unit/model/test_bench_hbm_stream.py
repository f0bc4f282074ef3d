"""benchmarks/bench_hbm_stream.py: a smoke run on CPU, and its byte counts are the model's (so a GPU session's figures
read directly as the rate of what timing.py charges at membound_eff)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from trainplan.model import timing
from trainplan.model.arch import resolve_model
from trainplan.model.efficiency import Efficiency
from trainplan.model.memory import layer_matmul_params_per_rank

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("bench_hbm_stream", ROOT / "benchmarks" / "bench_hbm_stream.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)  # type: ignore[union-attr]


def test_smoke_run_on_cpu_writes_every_kernel(tmp_path):
    out = tmp_path / "hbm.json"
    assert bench.main(["--device", "cpu", "--numel", "20000", "--tokens", "64", "--hidden", "128", "--iters", "2",
                       "--warmup", "1", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    names = [r["kernel"] for r in doc["results"]]
    assert names == ["cast_fp32_to_bf16", "cast_bf16_to_fp32", "add_fp32_inplace", "adamw_foreach", "rmsnorm_eager",
                     "fp8_cast_eager"]
    assert all(r["median_s"] > 0 and r["GBps"] > 0 and len(r["times_s"]) == 2 for r in doc["results"])
    assert doc["environment"]["device"] == "cpu"


def test_bytes_per_element_are_the_models():
    n, tokens, hidden = 1000, 10, 100
    ks = bench.kernels(n, "cpu", tokens, hidden)
    got = {k: b / n for k, (_, b) in ks.items()}
    assert got["cast_fp32_to_bf16"] == got["cast_bf16_to_fp32"] == timing.AUTOCAST_CAST_BYTES
    assert got["add_fp32_inplace"] == timing.AUTOCAST_ACCUM_BYTES
    # Efficiency's AdamW traffic adds the bf16 parameter copy (2 B) that fp32-parameter AdamW does not write
    assert got["adamw_foreach"] == Efficiency().optimizer_bytes_per_param_traffic - 2
    m = resolve_model("llama2-13b")
    assert ks["rmsnorm_eager"][1] / (tokens * hidden) == timing.norm_bytes_per_elem(m, "eager", 2.0)
    assert layer_matmul_params_per_rank(m) == bench.BLOCK_NUMEL
    assert ks["fp8_cast_eager"][1] / (tokens * hidden) == timing.FP8_CAST_BYTES_EAGER
    import torch

    assert torch.finfo(torch.float8_e4m3fn).max == bench.FP8_E4M3_MAX


def test_the_model_reads_the_measured_h200_rates():
    """timing.stream_frac reads the package copy of the H200 session's measurement, byte for byte, taken at one
    Llama-2-13B block (so per-call latency is negligible) against the h200-141gb spec bandwidth."""
    from trainplan import pkgdata
    from trainplan.model.hardware import GPUS

    measured = ROOT / "data" / "calibration" / "h200-2026-12-04b" / "microbench" / "hbm_stream.json"
    package = pkgdata.path(f"{pkgdata.DATA}/{timing.HBM_STREAM_FILE}")
    assert package.read_bytes() == measured.read_bytes()
    doc = json.loads(measured.read_text())
    assert doc["environment"]["device_name"] == "NVIDIA H200" and doc["args"]["numel"] == bench.BLOCK_NUMEL
    assert doc["args"]["hbm_tbps"] * 1e12 == GPUS["h200-141gb"].hbm_bw_Bps
    for r in doc["results"]:
        assert timing.stream_frac(r["kernel"]) == r["frac_of_spec"]
        assert r["frac_of_spec"] == pytest.approx(r["bytes"] / r["median_s"] / (doc["args"]["hbm_tbps"] * 1e12))
    # the two cast directions move the same bytes at different rates: the model keeps them apart
    assert timing.stream_frac("cast_bf16_to_fp32") < 0.6 * timing.stream_frac("cast_fp32_to_bf16")
    with pytest.raises(ValueError, match="no timing of 'memcpy'"):
        timing.stream_frac("memcpy")


def test_optimizer_step_bench_runs_the_three_adamw_implementations_on_fsdp2_shards(tmp_path):
    """benchmarks/bench_optimizer_step.py under torchrun on CPU (2 ranks, gloo): for-loop, foreach and fused AdamW on
    FSDP2's DTensor shards take the same first step (the fused CPU kernel to float rounding) and each is timed; the
    HBM-equivalent bytes are a GPU figure only. Times are printed, never asserted (these machines are noisy)."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "opt.json"
    torchrun = Path(sys.executable).parent / "torchrun"
    p = subprocess.run([str(torchrun), "--nproc-per-node", "2", "--master-port", str(port),
                        str(ROOT / "benchmarks" / "bench_optimizer_step.py"), "--device", "cpu", "--hidden", "64",
                        "--ffn", "172", "--layers", "2", "--iters", "2", "--warmup", "1", "--out", str(out)],
                       capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(out.read_text())
    rows = {r["impl"]: r for r in doc["results"]}
    assert list(rows) == ["for-loop", "foreach", "fused"] and doc["environment"]["world_size"] == 2
    # 2 blocks of 7 weights over 2 ranks: one block's worth of parameters per rank
    env = doc["environment"]
    assert env["sharded_tensors"] == 14 and env["local_params"] == 4 * 64 * 64 + 3 * 64 * 172
    for r in rows.values():
        assert r["median_s"] > 0 and len(r["times_s"]) == 2 and r["bytes_equiv_per_param"] is None
        assert r["max_abs_diff_vs_for_loop"] < 1e-6
    assert rows["fused"]["vs_fused"] == 1.0 and "x fused" in p.stdout
