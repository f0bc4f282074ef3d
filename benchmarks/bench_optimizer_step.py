"""The AdamW step on FSDP2-sharded parameters, per implementation: for-loop, foreach, fused (timing-model §7.14).

``training.optimizer_impl`` times the step at the HBM rate ``bench_hbm_stream`` measured for the fused and foreach
kernels on one plain tensor. A training job steps FSDP2's DTensor shards instead: many tensors, each op dispatched
through DTensor. This times exactly that, for the three implementations ``torch.optim.AdamW`` offers, on the shards
one rank holds of ``--layers`` Llama blocks (``--hidden``, ``--ffn``: Llama-2-13B's by default) sharded over the
launch's ranks: ``for-loop`` (``foreach=False``, what ``trainplan.train_entry`` ran before it took
``--optimizer-impl``), ``foreach`` (PyTorch's default on CUDA, the proxy harness) and ``fused`` (torchtitan's
default, the launch's now).

Each figure is the median of ``--iters`` steps timed with CUDA events (``time.perf_counter`` on CPU) after warm-ups;
printed as ms, as the bytes per local parameter the step would move at ``--hbm-tbps`` (28 B is the minimum: p, g,
m, v read, p, m, v written), and as a ratio to fused. On CPU the figures are the host's (dispatch and a CPU's
memory), never GPU evidence.

    torchrun --nproc-per-node 8 benchmarks/bench_optimizer_step.py --out optimizer_step.json   # one node
    python benchmarks/bench_optimizer_step.py --device cpu --hidden 256 --ffn 688 --layers 2     # a smoke run
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_hbm_stream import ADAMW_BYTES, event_timer, write_results  # noqa: E402

IMPLS = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def sharded_blocks(layers: int, hidden: int, ffn: int, device: str) -> Any:
    """``layers`` blocks of Llama linear weights (q, k, v, o: h×h; gate, up, down: h×ffn), each block fully_shard-ed
    over all ranks (FSDP2: DTensor shards), with gradients of the same placement."""
    import torch
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)

    def block() -> torch.nn.Module:
        m = torch.nn.Module()
        for name, shape in (("q", (hidden, hidden)), ("k", (hidden, hidden)), ("v", (hidden, hidden)),
                            ("o", (hidden, hidden)), ("gate", (ffn, hidden)), ("up", (ffn, hidden)),
                            ("down", (hidden, ffn))):
            m.register_parameter(name, torch.nn.Parameter(torch.randn(*shape, device=device) * 0.02))
        return m

    model = torch.nn.ModuleList([block() for _ in range(layers)])
    for b in model:
        fully_shard(b)
    for p in model.parameters():  # a gradient of the parameter's placement (DTensor arithmetic, no DTensor RNG)
        p.grad = p.detach() * 0.05 + 1e-3
    return model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=5120)
    ap.add_argument("--ffn", type=int, default=13824)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--hbm-tbps", type=float, default=4.8, help="spec HBM bandwidth, TB/s (H100 SXM 3.35, H200 4.8)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", help="write the results as JSON here (rank 0)")
    a = ap.parse_args(argv)
    if min(a.layers, a.hidden, a.ffn, a.iters) < 1 or a.warmup < 0 or a.hbm_tbps <= 0:
        ap.error("--layers, --hidden, --ffn and --iters must be >= 1, --warmup >= 0, --hbm-tbps > 0")

    import torch
    import torch.distributed as dist

    if a.device == "cuda" and not torch.cuda.is_available():
        print("bench_optimizer_step: no CUDA device (use --device cpu for a smoke run)", file=sys.stderr)
        return 2
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29517")):
        os.environ.setdefault(k, v)  # plain `python`: one rank
    if a.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        model = sharded_blocks(a.layers, a.hidden, a.ffn, a.device)
        local = sum(p.to_local().numel() for p in model.parameters())
        tensors = sum(1 for _ in model.parameters())
        timer = event_timer(a.device)
        start = [p.detach().clone() for p in model.parameters()]
        rows: list[dict[str, Any]] = []
        first: list[Any] = []  # the for-loop's first update (IMPLS runs it first), which the others must match
        for impl, kw in IMPLS.items():
            with torch.no_grad():
                for p, s in zip(model.parameters(), start, strict=True):
                    p.copy_(s)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, **kw)
            opt.step()  # the states exist before timing; the first update is compared across implementations
            after = [p.detach().full_tensor() for p in model.parameters()]
            first = first or after
            times = timer(opt.step, a.warmup, a.iters)
            med = statistics.median(times)
            rows.append({"impl": impl, "median_s": med, "times_s": times, "local_params": local,
                         "bytes_equiv_per_param": med * a.hbm_tbps * 1e12 / local if a.device == "cuda" else None,
                         "max_abs_diff_vs_for_loop": max(float((x - y).abs().max())
                                                         for x, y in zip(after, first, strict=True))})
            del opt
        fused = rows[-1]["median_s"]  # IMPLS ends with fused
        for r in rows:
            r["vs_fused"] = r["median_s"] / fused
        if rank == 0:
            print(f"{world} rank(s), {a.device}: {local / 1e6:.2f} M local parameters in {tensors} sharded tensors "
                  f"({a.layers} blocks, hidden {a.hidden}, ffn {a.ffn})")
            for r in rows:
                ratio = f"{r['vs_fused']:5.2f}x fused"
                hbm = (f"{r['bytes_equiv_per_param']:7.1f} B/param at {a.hbm_tbps:g} TB/s (minimum {ADAMW_BYTES:g})"
                       if a.device == "cuda" else "")  # a CPU's time says nothing about HBM
                print(f"  {r['impl']:9s} {r['median_s'] * 1e3:9.3f} ms  {hbm}  {ratio}  max |Δ| after one step vs "
                      f"for-loop {r['max_abs_diff_vs_for_loop']:.1e}")
            write_results(a, rows, world_size=world, local_params=local, sharded_tensors=tensors)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
