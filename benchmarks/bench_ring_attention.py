"""One rank of PyTorch ring attention on one GPU: what context parallelism costs beyond the flash kernels (§7.4).

The held-out H100 check misses one target, the CP family (docs/timing-model.md §7.4: the torchtitan 8B CP4/CP8 rows
imply ~25% more time per attention FLOP than CP2 and the 32k row without CP, on one node where the ring traffic is
hidden). This separates the two halves of that question on the one GPU a device session gets:

* **the ring code's own compute** — torch's ``context_parallel`` (the API torchtitan calls, pass-KV with the default
  all-gather rotater, ``convert_to_f32``, round-robin load balancing) run as the *last* rank of a ``cp``-rank mesh on
  a fake process group (``torch.testing._internal.distributed.fake_pg``: no other rank, so only this rank's kernels
  run and the timing is its compute, merges included, with no communication). The fake group's collectives still
  copy (its all-gather writes the input into every chunk, its all-to-all copies it: 131,072·cp B per token of a
  training call at 4,096 wide, ~30% of the model's ring overhead); while the ring is timed they are replaced by
  stand-ins that copy nothing (a real ring's NCCL moves those bytes on its own stream);
* **the flash kernels alone** — the same rank's calls made directly: the first ring step causal over its two local
  chunks (L × L), each later one non-causal over half the keys (L × L/2).

The difference per local token, at the spec HBM bandwidth, is the ring overhead in bytes, next to what the model
charges (``trainplan.model.timing.ring_overhead_bytes``, at ``membound_eff``); the time per attention FLOP relative to
cp = 1 is the figure the published rows disagree on, next to the model's. The local tokens are the same at every cp
(``--local-tokens``, 32,768 as in every torchtitan CP row), so each rank's linear layers cost the same and only the
attention grows. Shape: Llama 3.1 8B's attention after ``repeat_kv`` (32 heads × 128, bf16), one layer, batch 1.

    python benchmarks/bench_ring_attention.py --out ring_attention.json      # CUDA (torch CP runs CUDA SDPA only)
    python benchmarks/bench_ring_attention.py --dry-run                      # the shapes and the model's figures
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_hbm_stream import event_timer, write_results  # noqa: E402  (a sibling script, not a package)


def plan(cps: list[int], local: int, heads: int, head_dim: int) -> list[dict[str, Any]]:
    """Per CP degree: the sequence (cp · local), the last rank's flash calls and its causal attention FLOPs. With
    round-robin load balancing every rank computes seq²/(2·cp) score pairs (the causal half of the total, split
    evenly): 4 FLOPs per pair and head feature in the forward (QKᵀ and PV), 3× that for forward + backward."""
    rows = []
    for cp in cps:
        seq = cp * local
        pairs = seq * seq / (2 * cp)
        calls = [(local, local, True)] + [(local, local // 2, False)] * (cp - 1)  # (queries, keys, causal)
        rows.append({"cp": cp, "seq_len": seq, "local_tokens": local, "heads": heads, "head_dim": head_dim,
                     "calls": calls, "score_pairs": pairs, "fwd_flops": 4.0 * pairs * heads * head_dim,
                     "train_flops": 12.0 * pairs * heads * head_dim})
    return rows


def model_figures(rows: list[dict[str, Any]], gpu: str, kernels: str = "compiled") -> list[dict[str, Any]]:
    """What the planner charges one layer of each row on ``gpu`` (its generation's fitted Efficiency, ``kernels``
    class): flash forward and forward + backward at ``attn_eff_at(seq/cp)`` (timing.attn_fwd_s, the backward at
    ATTN_BWD_FACTOR), the ring overhead bytes per local token (timing.ring_overhead_bytes, K and V at
    timing.ring_kv_width) and their time (timing.ring_overhead_mb_s, as step_time charges it), and the time per
    attention FLOP relative to the first row."""
    import numpy as np

    from trainplan.model import timing
    from trainplan.model.arch import ModelSpec
    from trainplan.model.efficiency import Efficiency
    from trainplan.model.hardware import resolve_gpu
    from trainplan.model.layout import Layout
    from trainplan.model.training import TrainingSpec

    g = resolve_gpu(gpu)
    eff = timing.class_efficiency(Efficiency.for_gpu(g), kernels)
    out = []
    for r in rows:
        h, d, local, cp = r["heads"], r["head_dim"], r["local_tokens"], r["cp"]
        m = ModelSpec(name="ring-bench", layers=1, hidden=h * d, heads=h, kv_heads=h, vocab=32000,
                      max_seq_len=r["seq_len"])
        t = TrainingSpec(seq_len=r["seq_len"], global_batch=1, kernels=kernels, attn_impl="flash")
        lay = Layout(dp=1, cp=cp, cp_kind="ring", sharding="none", recompute="none")
        act = 2.0 if t.half else 4.0  # as timing.step_time
        fwd = float(timing.attn_fwd_s(m, local, r["seq_len"], 1, g.peak_bf16_flops, eff, cp))
        f_b, b_b = (float(np.asarray(x))
                    for x in timing.ring_overhead_bytes(cp, h * d, timing.ring_kv_width(m, kernels), act))
        ring_s = float(np.asarray(timing.ring_overhead_mb_s(m, t, local, lay, 1, g.hbm_bw_Bps, eff, act)))
        out.append({"cp": cp, "model_kernels_fwd_s": fwd, "model_kernels_train_s": fwd * (1 + timing.ATTN_BWD_FACTOR),
                    "model_overhead_bytes_per_token_fwd": f_b, "model_overhead_bytes_per_token_train": f_b + b_b,
                    "model_train_s": fwd * (1 + timing.ATTN_BWD_FACTOR) + ring_s})
    base = out[0]["model_train_s"] / rows[0]["train_flops"]
    for r, o in zip(rows, out, strict=True):
        o["model_time_per_flop_rel"] = o["model_train_s"] / r["train_flops"] / base
    return out


def _fwd_train_times(q: Any, k: Any, v: Any, g: Any, causal: bool, a: argparse.Namespace,
                     timer: Any) -> tuple[float, float]:
    """Median seconds of one SDPA forward (no grad) and one forward + backward over ``q``, ``k``, ``v`` (which
    require grad) with output gradient ``g``, through whatever ``F.scaled_dot_product_attention`` is at call time
    (under ``context_parallel``: torch's ring attention)."""
    import torch
    import torch.nn.functional as F

    def fwd() -> None:
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def train() -> None:
        q.grad = k.grad = v.grad = None
        F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(g)

    return statistics.median(timer(fwd, a.warmup, a.iters)), statistics.median(timer(train, a.warmup, a.iters))


def _ring_times(a: argparse.Namespace, r: dict[str, Any], world: int, timer: Any, bf16: Any) -> tuple[float, float]:
    """(forward, forward + backward) seconds of one layer's SDPA under torch's ``context_parallel`` as the last rank
    of a ``r["cp"]``-rank mesh inside the fake ``world``."""
    import contextlib
    from unittest import mock

    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as ft_c
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    cp = r["cp"]
    mesh = init_device_mesh(a.device, (world // cp, cp), mesh_dim_names=("dp", "cp"))["cp"]
    full = [bf16(1, a.heads, r["seq_len"], a.head_dim) for _ in range(4)]
    gathered: dict[Any, Any] = {}

    def gather(t: Any, gather_dim: int, group: Any, tag: str = "") -> Any:
        # The fake PG's all-gather copies the input into every chunk (cp copies a call; a real ring's NCCL does
        # that traffic on its own stream): hand back one buffer, filled once, instead.
        key = (tuple(t.shape), t.dtype, gather_dim)
        if key not in gathered:
            gathered[key] = torch.cat([t] * dist.get_world_size(group), dim=gather_dim)
        return gathered[key]

    sdpa = F.scaled_dot_product_attention
    with contextlib.ExitStack() as stack:
        for name in ("all_gather_single", "all_gather_tensor"):  # torch 2.13 / 2.11's _AllGatherRotater
            if hasattr(ft_c, name):
                stack.enter_context(mock.patch.object(ft_c, name, gather))
        # the fake all_to_all copies too (backward: the dK, dV ring, fp32, every step): pass the buffer through
        stack.enter_context(mock.patch.object(ft_c, "permute_tensor", lambda t, src_dst, group, tag="": t))
        try:
            with context_parallel(mesh, buffers=full, buffer_seq_dims=[2, 2, 2, 2]):
                q, k, v, g = full  # now this rank's shards (head-tail balance: chunks cp-1 and cp)
                try:
                    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
                    return _fwd_train_times(q, k, v, g, True, a, timer)
                finally:
                    for t in (q, k, v):
                        t.grad = None
                        t.requires_grad_(False)  # context_parallel resizes the buffers back on exit: no grad
        finally:
            # torch 2.11's context_parallel (the device image's) skips its exit when the body raises, leaving F.sdpa
            # patched with this mesh: the next CP degree's context_parallel would then keep that stale patch
            F.scaled_dot_product_attention = sdpa


def _measure(a: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dev = torch.device(a.device)  # cuda; cpu only in the test, with CPU stand-ins for the CUDA flash ops
    timer = event_timer(a.device)
    world = max(r["cp"] for r in rows)
    dist.init_process_group("fake", store=FakeStore(), rank=world - 1, world_size=world)  # the last rank of each ring

    def bf16(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=dev, dtype=torch.bfloat16)

    def sdpa_times(q_len: int, k_len: int, causal: bool) -> tuple[float, float]:
        q, k, v, g = bf16(1, a.heads, q_len, a.head_dim), *(bf16(1, a.heads, k_len, a.head_dim) for _ in range(2)), \
            bf16(1, a.heads, q_len, a.head_dim)
        q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
        return _fwd_train_times(q, k, v, g, causal, a, timer)

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        first = sdpa_times(a.local_tokens, a.local_tokens, True)
        later = sdpa_times(a.local_tokens, a.local_tokens // 2, False)
        for r in rows:
            cp = r["cp"]
            r["kernels_fwd_s"] = first[0] + (cp - 1) * later[0]
            r["kernels_train_s"] = first[1] + (cp - 1) * later[1]
            if cp == 1:
                r["fwd_s"], r["train_s"] = first
            else:
                try:
                    r["fwd_s"], r["train_s"] = _ring_times(a, r, world, timer, bf16)
                except Exception as e:  # noqa: BLE001 - a CP degree that cannot run is a result, the rest still run
                    r["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                    print(f"cp {cp}: {r['error']}", file=sys.stderr, flush=True)
            if "train_s" in r:  # each row as it is timed: a budget kill keeps what ran
                print(f"cp {cp}: fwd {r['fwd_s'] * 1e3:.2f} ms, train {r['train_s'] * 1e3:.2f} ms, flash kernels alone "
                      f"{r['kernels_train_s'] * 1e3:.2f} ms", flush=True)
            torch.cuda.empty_cache()
    dist.destroy_process_group()


def summarize(rows: list[dict[str, Any]], hbm_Bps: float) -> None:
    """Add to each timed row its rate, the time beyond its flash kernels (``overhead_train_s``) as HBM bytes per
    local token at ``hbm_Bps`` (comparable with ``model_overhead_bytes_per_token_train``), and its time per attention
    FLOP relative to the first timed row (None for all when the first row has no timing). A row with an ``error`` is
    left as it is."""
    timed = [r for r in rows if "train_s" in r]
    base = timed[0]["train_s"] / timed[0]["train_flops"] if timed and timed[0] is rows[0] else None
    for r in timed:
        r["train_tflops"] = r["train_flops"] / r["train_s"] / 1e12
        r["overhead_train_s"] = r["train_s"] - r["kernels_train_s"]
        r["overhead_bytes_per_token_train"] = r["overhead_train_s"] * hbm_Bps / r["local_tokens"]
        r["time_per_flop_rel"] = None if base is None else r["train_s"] / r["train_flops"] / base


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cps", default="1,2,4,8", help="CP degrees (comma-separated; the first is the reference)")
    p.add_argument("--local-tokens", type=int, default=32768, help="tokens per rank (even: two round-robin chunks)")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--gpu", default="h200-141gb", help="trainplan GPU name for the spec HBM and the model's figures")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--dry-run", action="store_true", help="print the shapes and the model's figures; time nothing")
    a = p.parse_args(argv)
    a.device = "cuda"
    try:
        cps = [int(c) for c in a.cps.split(",")]
    except ValueError:
        p.error(f"--cps={a.cps!r}: comma-separated positive integers, e.g. 1,2,4,8")
    if not cps or any(c < 1 for c in cps) or max(cps) % min(cps) or any(max(cps) % c for c in cps):
        p.error(f"--cps={a.cps!r}: positive integers, each dividing the largest (one fake world holds every ring)")
    if a.local_tokens < 2 or a.local_tokens % 2 or a.iters < 1 or a.warmup < 0:
        p.error("--local-tokens must be even and >= 2, --iters >= 1, --warmup >= 0")

    rows = plan(cps, a.local_tokens, a.heads, a.head_dim)
    from trainplan.model.hardware import resolve_gpu

    hbm = resolve_gpu(a.gpu).hbm_bw_Bps
    for r, m in zip(rows, model_figures(rows, a.gpu), strict=True):
        r |= m
    if not a.dry_run:
        import torch

        if not torch.cuda.is_available():
            print("bench_ring_attention: no CUDA device (torch's context parallel dispatches CUDA SDPA kernels only; "
                  "--dry-run lists the shapes)", file=sys.stderr)
            return 2
        _measure(a, rows)
        summarize(rows, hbm)

    print(f"{'cp':>3} {'seq':>8} {'calls':>5} {'TFLOP train':>11}  {'model ms':>9} {'model /FLOP':>11} "
          f"{'model B/tok':>11}" + ("" if a.dry_run else f"  {'ms':>8} {'kernels ms':>10} {'/FLOP':>6} {'B/tok':>7}"))
    for r in rows:
        line = (f"{r['cp']:>3} {r['seq_len']:>8} {len(r['calls']):>5} {r['train_flops'] / 1e12:>11.1f}  "
                f"{r['model_train_s'] * 1e3:>9.1f} {r['model_time_per_flop_rel']:>11.3f} "
                f"{r['model_overhead_bytes_per_token_train']:>11.0f}")
        if "error" in r:
            line += f"  {r['error']}"
        elif not a.dry_run:
            rel = r.get("time_per_flop_rel")
            line += (f"  {r['train_s'] * 1e3:>8.1f} {r['kernels_train_s'] * 1e3:>10.1f} "
                     f"{'n/a' if rel is None else f'{rel:.3f}':>6} {r['overhead_bytes_per_token_train']:>7.0f}")
        print(line, flush=True)
    if not a.dry_run:
        import torch

        write_results(a, rows, cudnn_version=torch.backends.cudnn.version())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
