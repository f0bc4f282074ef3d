"""Forward + backward of the harness's model with bf16 parameters: the precision regime of every production plan.

The GPU proxy records run one rank under ``torch.autocast`` over fp32 weights (docs/timing-model.md §7.10), a regime no
production plan runs. This times the compute production runs per micro-batch instead. The harness's own Transformer
(``trainplan.proxy.model``, the same eager kernels) is cast to bf16, and so are its weights, activations and gradients.
One micro-batch's loss (the harness's fp32 cross-entropy) goes forward and backward, gradients set to None between
calls. No optimizer runs and no gradient is accumulated. What is left is the model's per-micro-batch compute
(``timing.step_time``'s ``compute_s`` at dp = 1, one micro-batch).

For each sequence length and depth: the median of ``--iters`` CUDA-event timings after ``--warmup`` calls, and the
SDPA backend the profiler saw (cuDNN, FlashAttention-2, ...), so the prediction uses the attention kernel that ran.

    python benchmarks/bench_bf16_step.py --out bf16_step.json                     # CUDA: Llama-2-13B widths
    python benchmarks/bench_bf16_step.py --device cpu --preset debug --seqs 64 --layers 1,2 --iters 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_hbm_stream import event_timer, write_results  # noqa: E402  (a sibling script, not a package)


def _ints(text: str) -> list[int]:
    try:
        out = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list of integers") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: positive integers")
    return out


def attention_kernels(fn: Any) -> list[str]:
    """The SDPA backends one call of ``fn`` dispatched to, read off the aten ops the profiler saw:
    ``cudnn``, ``flash`` (FlashAttention-2), ``efficient`` (memory-efficient), ``math``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    ops = " ".join(e.key for e in prof.key_averages() if e.key.startswith("aten::_scaled_dot_product_"))
    return [k for k in ("cudnn", "flash", "efficient", "math") if f"_{k}_" in ops + "_"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="llama2-13b", help="model preset whose widths the blocks take")
    ap.add_argument("--seqs", type=_ints, default=[1024, 4096, 16384])
    ap.add_argument("--layers", type=_ints, default=[1, 2, 4])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", help="write the results as JSON here")
    a = ap.parse_args(argv)
    if a.iters < 1 or a.warmup < 0:
        ap.error("--iters must be >= 1 and --warmup >= 0")

    import torch
    import torch.nn.functional as F

    from trainplan.model.arch import resolve_model
    from trainplan.proxy.model import build_model

    if a.device == "cuda" and not torch.cuda.is_available():
        print("bench_bf16_step: no CUDA device (use --device cpu for a smoke run)", file=sys.stderr)
        return 2
    dev = torch.device(a.device)
    timer = event_timer(a.device)  # CUDA events on the GPU (perf_counter on CPU), as bench_hbm_stream times
    base = resolve_model(a.preset)
    rows = []
    for s in a.seqs:
        for n_layers in a.layers:
            spec = replace(base, layers=n_layers, max_seq_len=max(s, base.max_seq_len), name=f"{base.name}-L{n_layers}")
            model = build_model(spec, device=dev, seed=0).to(torch.bfloat16)
            x = torch.randint(0, spec.vocab, (1, s + 1), device=dev, generator=torch.Generator(dev).manual_seed(0))

            def step(model: Any = model, x: torch.Tensor = x) -> None:
                for p in model.parameters():
                    p.grad = None
                logits = model(x[:, :-1])  # the harness's loss: fp32 cross-entropy over the bf16 logits
                F.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten()).backward()

            times = timer(step, a.warmup, a.iters)
            kernels = attention_kernels(step)
            med = statistics.median(times)
            rows.append({"seq_len": s, "layers": n_layers, "hidden": spec.hidden, "model": spec.to_dict(),
                         "median_s": med, "times_s": times, "attention_kernels": kernels,
                         "max_allocated_bytes": torch.cuda.max_memory_allocated() if a.device == "cuda" else None})
            print(f"seq {s:6d}  layers {n_layers}  {med * 1e3:9.3f} ms  attention {','.join(kernels) or '-'}", flush=True)
            del model, x
            if a.device == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
    write_results(a, rows, cudnn_version=torch.backends.cudnn.version() if a.device == "cuda" else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
