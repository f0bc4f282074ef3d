"""HBM bandwidth of the weight-sized streaming kernels the model charges at ``membound_eff`` (docs/timing-model.md §7.10).

The H200 proxy records say autocast's weight casts run near 0.9 of HBM bandwidth, where ``membound_eff`` (0.558,
fitted on published end-to-end runs, whose elementwise work is many small eager kernels) charges them 1.6× longer.
This measures the rate directly, per kernel, on tensors of one Llama-2-13B block's weights (``--numel``), so a GPU
session can put a number on "weight-sized stream" without fitting it:

* ``cast_fp32_to_bf16`` (read 4, write 2 B per element: autocast's forward weight cast, FSDP2's copy-out),
* ``cast_bf16_to_fp32`` (2 + 4: the cast's backward, FSDP2's reduce-scatter copy-in),
* ``add_fp32_inplace`` (4 + 4 read, 4 write: AccumulateGrad from the second micro-batch),
* ``adamw_foreach`` / ``adamw_fused`` (p, g, m, v read, p, m, v written: 28 B per fp32 parameter),
* ``rmsnorm_eager`` (HF's Python RMSNorm on bf16 activations, 4096 × 5120: the small-kernel contrast),
* ``fp8_cast_eager`` (torchao's dynamic tensorwise FP8 cast of the same activations without torch.compile:
  ``max(abs(x))``, ``.to(float32)``, ``* scale``, ``clamp``, ``.to(float8)``, one kernel each, 33 B per element,
  ``timing.FP8_CAST_BYTES_EAGER``) and, on CUDA, ``fp8_cast_compiled`` (the same function under torch.compile,
  charged 5 B per element, ``timing.FP8_CAST_BYTES``): whether the eager chain costs what §9 charges.

Each is the median of ``--iters`` calls timed with CUDA events (``time.perf_counter`` on CPU) after warm-ups, as GB/s
of the bytes it must move and as a fraction of ``--hbm-tbps`` (the spec bandwidth: H100 SXM 3.35, H200 4.8).

    python benchmarks/bench_hbm_stream.py --out hbm_stream.json                  # CUDA, the H200 spec
    python benchmarks/bench_hbm_stream.py --device cpu --numel 1000000 --iters 3   # a smoke run anywhere
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

# One Llama-2-13B block's matmul weights: 4·5120² + 3·5120·13824 (trainplan.model.memory.layer_matmul_params_per_rank).
BLOCK_NUMEL = 4 * 5120 * 5120 + 3 * 5120 * 13824
ADAMW_BYTES = 28.0  # fp32 p, g, m, v read (16) + p, m, v written (12)
FP8_E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max


def event_timer(device: str) -> Callable[[Callable[[], Any], int, int], list[float]]:
    """``run(fn, warmup, iters)``: seconds of each of ``iters`` calls after ``warmup`` untimed ones, by CUDA events
    recorded around each call on ``cuda``, by ``time.perf_counter`` on ``cpu``."""
    import torch

    def run(fn: Callable[[], Any], warmup: int, iters: int) -> list[float]:
        for _ in range(warmup):
            fn()
        out = []
        for _ in range(iters):
            if device == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                # ~1 ms of queued GPU work first: the host's dispatch before fn's first kernel (0.4-0.6 ms for torch's
                # context-parallel SDPA) overlaps it instead of being timed as an idle GPU
                torch.cuda._sleep(2_000_000)
                a.record()
                fn()
                b.record()
                b.synchronize()
                out.append(a.elapsed_time(b) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t0)
        return out

    return run


def kernels(numel: int, device: str, tokens: int, hidden: int) -> dict[str, tuple[Callable[[], Any], float]]:
    """name → (the call, bytes it must move)."""
    import torch

    w32 = torch.randn(numel, device=device)
    w16 = torch.empty(numel, device=device, dtype=torch.bfloat16)
    g32 = torch.randn(numel, device=device)
    acc = torch.zeros(numel, device=device)
    p = torch.nn.Parameter(torch.randn(numel, device=device))
    p.grad = torch.randn(numel, device=device)
    opt_foreach = torch.optim.AdamW([p], lr=1e-6, foreach=True)
    q = torch.nn.Parameter(torch.randn(numel, device=device))
    q.grad = torch.randn(numel, device=device)
    fused_ok = device == "cuda"
    opt_fused = torch.optim.AdamW([q], lr=1e-6, fused=True) if fused_ok else None
    x = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16)
    nw = torch.ones(hidden, device=device, dtype=torch.bfloat16)

    def rmsnorm() -> torch.Tensor:  # transformers' LlamaRMSNorm.forward, kernel by kernel
        h = x.to(torch.float32)
        var = h.pow(2).mean(-1, keepdim=True)
        return nw * (h * torch.rsqrt(var + 1e-5)).to(torch.bfloat16)

    def fp8_cast() -> torch.Tensor:  # torchao float8_utils / _ToFloat8ConstrFunc, tensorwise, op by op
        scale = FP8_E4M3_MAX / x.abs().max().to(torch.float32).clamp(min=1e-12)
        return (x.to(torch.float32) * scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)

    out = {
        "cast_fp32_to_bf16": (lambda: w16.copy_(w32), 6.0 * numel),
        "cast_bf16_to_fp32": (lambda: g32.copy_(w16), 6.0 * numel),
        "add_fp32_inplace": (lambda: acc.add_(g32), 12.0 * numel),
        "adamw_foreach": (opt_foreach.step, ADAMW_BYTES * numel),
        # x.float() (2 r, 4 w) · pow (4, 4) · mean (4) · x·rsqrt (4, 4) · .to(bf16) (4, 2) · ×w (2, 2): 36 B per element
        "rmsnorm_eager": (rmsnorm, 36.0 * tokens * hidden),
        # abs (2 r, 2 w) · max (2) · .to(fp32) (2, 4) · × scale (4, 4) · clamp (4, 4) · .to(fp8) (4, 1): 33 B
        "fp8_cast_eager": (fp8_cast, 33.0 * tokens * hidden),
    }
    if opt_fused is not None:
        out["adamw_fused"] = (opt_fused.step, ADAMW_BYTES * numel)
    if device == "cuda":  # Inductor fuses the chain: an amax pass (2) and one cast kernel (2 r, 1 w)
        out["fp8_cast_compiled"] = (torch.compile(fp8_cast), 5.0 * tokens * hidden)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--numel", type=int, default=BLOCK_NUMEL, help="elements per weight-sized tensor")
    ap.add_argument("--tokens", type=int, default=4096, help="rows of the RMSNorm contrast")
    ap.add_argument("--hidden", type=int, default=5120)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--hbm-tbps", type=float, default=4.8, help="spec HBM bandwidth, TB/s (H100 SXM 3.35, H200 4.8)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", help="write the results as JSON here")
    a = ap.parse_args(argv)
    if a.numel < 1 or a.iters < 1 or a.warmup < 0 or a.hbm_tbps <= 0:
        ap.error("--numel and --iters must be >= 1, --warmup >= 0, --hbm-tbps > 0")

    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        print("bench_hbm_stream: no CUDA device (use --device cpu for a smoke run)", file=sys.stderr)
        return 2
    timer = event_timer(a.device)
    rows = []
    for name, (fn, nbytes) in kernels(a.numel, a.device, a.tokens, a.hidden).items():
        times = timer(fn, a.warmup, a.iters)
        med = statistics.median(times)
        gbps = nbytes / med / 1e9
        rows.append({"kernel": name, "bytes": nbytes, "median_s": med, "GBps": gbps,
                     "frac_of_spec": gbps / (a.hbm_tbps * 1e3), "times_s": times})
        print(f"{name:20s} {nbytes / 1e9:8.3f} GB  {med * 1e3:9.3f} ms  {gbps:8.1f} GB/s  "
              f"{gbps / (a.hbm_tbps * 1e3):6.3f} of {a.hbm_tbps:g} TB/s")
    write_results(a, rows)
    return 0


def write_results(a: argparse.Namespace, rows: list[dict[str, Any]], **env: Any) -> None:
    """``{"args", "environment", "results"}`` as JSON to ``a.out`` (nothing without ``--out``): the arguments, where
    it ran (torch, the device, CUDA; plus ``env``) and the rows."""
    import torch

    if not a.out:
        return
    env = {"torch_version": torch.__version__, "device": a.device,
           "device_name": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
           "cuda_version": torch.version.cuda, **env}
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump({"args": vars(a), "environment": env, "results": rows}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    raise SystemExit(main())
