"""benchmarks/bench_hbm_stream.py: a smoke run on CPU, and its byte counts are the model's (so a GPU session's figures
read directly as the rate of what timing.py charges at membound_eff)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

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
    assert names == ["cast_fp32_to_bf16", "cast_bf16_to_fp32", "add_fp32_inplace", "adamw_foreach", "rmsnorm_eager"]
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
