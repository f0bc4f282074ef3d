"""Causal attention rate per PyTorch SDPA backend on one GPU: the kernel behind ``attn_eff`` (docs/timing-model.md §7.9).

Llama-2-13B attention shape (40 heads × 128, bf16, causal), the same tokens per call at every sequence length
(batch × seq = ``--tokens``), as the GPU proxies' sequence ladder runs it. For each backend PyTorch offers here
(FlashAttention-2 = ``FLASH_ATTENTION``, cuDNN = ``CUDNN_ATTENTION``, memory-efficient), the median of ``--iters``
forward and forward+backward calls timed with CUDA events after warm-ups, as TFLOP/s of *causal* work (half the
score matrix; forward 4·b·h·s²·d / 2, training 3× that, the FLOP convention of ``trainplan.model.flops``) and as a
fraction of ``--peak-tflops``. A backend that cannot run a shape is reported with its error, not skipped silently.

    python benchmarks/bench_attention_backends.py --out attention_backends.json          # needs CUDA
    python benchmarks/bench_attention_backends.py --dry-run                               # list the shapes
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys


def _forward(F, q, k, v) -> None:
    import torch

    with torch.no_grad():
        F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _train(F, q, k, v, g) -> None:
    F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seqs", default="1024,2048,4096,8192,16384")
    p.add_argument("--tokens", type=int, default=32768, help="batch × seq per call")
    p.add_argument("--heads", type=int, default=40)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense BF16 peak (H100/H200 SXM: 989)")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args(argv)
    seqs = [int(s) for s in a.seqs.split(",")]
    if any(s < 1 or a.tokens % s for s in seqs):
        p.error(f"--seqs={a.seqs}: each must divide --tokens={a.tokens}")
    shapes = [(a.tokens // s, s) for s in seqs]
    if a.dry_run:
        for b, s in shapes:
            print(f"batch {b} × seq {s}, {a.heads} heads × {a.head_dim}, bf16, causal")
        return 0

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if not torch.cuda.is_available():
        print("bench_attention_backends: no CUDA device (use --dry-run to list the shapes)", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    backends = {"flash (FA2)": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    rows = []

    def timed(fn) -> float:
        for _ in range(a.warmup):
            fn()
        ts = []
        for _ in range(a.iters):
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0.record()
            fn()
            t1.record()
            torch.cuda.synchronize()
            ts.append(t0.elapsed_time(t1) / 1e3)
        return statistics.median(ts)

    for b, s in shapes:
        q, k, v = (torch.randn(b, a.heads, s, a.head_dim, device=dev, dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        g = torch.randn(b, a.heads, s, a.head_dim, device=dev, dtype=torch.bfloat16)
        fwd_flops = 4 * b * a.heads * s * s * a.head_dim / 2  # causal: half the score matrix

        for name, be in backends.items():
            row = {"backend": name, "batch": b, "seq": s, "heads": a.heads, "head_dim": a.head_dim}
            try:
                with sdpa_kernel([be]):
                    tf = timed(functools.partial(_forward, F, q, k, v))
                    tt = timed(functools.partial(_train, F, q, k, v, g))
                row |= {"fwd_s": tf, "train_s": tt, "fwd_tflops": fwd_flops / tf / 1e12,
                        "train_tflops": 3 * fwd_flops / tt / 1e12,
                        "fwd_frac_of_peak": fwd_flops / tf / 1e12 / a.peak_tflops,
                        "train_frac_of_peak": 3 * fwd_flops / tt / 1e12 / a.peak_tflops}
                print(f"{name:<12} b={b:<3} s={s:<6} fwd {row['fwd_tflops']:6.1f} TFLOP/s  fwd+bwd "
                      f"{row['train_tflops']:6.1f} TFLOP/s = {row['train_frac_of_peak']:.3f} of peak", flush=True)
            except Exception as e:  # noqa: BLE001 - a backend that cannot run this shape is a result
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                print(f"{name:<12} b={b:<3} s={s:<6} {row['error']}", flush=True)
            rows.append(row)
            q.grad = k.grad = v.grad = None
        q = k = v = g = None
        torch.cuda.empty_cache()
    doc = {"device": torch.cuda.get_device_name(dev), "torch_version": torch.__version__,
           "cuda_version": torch.version.cuda, "cudnn_version": torch.backends.cudnn.version(),
           "peak_tflops": a.peak_tflops, "tokens_per_call": a.tokens, "iters": a.iters, "warmup": a.warmup,
           "rows": rows}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
