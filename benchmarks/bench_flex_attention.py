"""FlexAttention against SDPA's FlashAttention-2 on one GPU: the kernel torchtitan 0.3 attends with (§7.17).

torchtitan 0.3 refuses SDPA for language models: every torchtitan launch attends with FlexAttention under
block-causal (per-document) masks, and its CP is one FlexAttention call per rank over all-gathered K and V
(``launch.trainers.torchtitan_settings``' deviations). The planner times SDPA's FlashAttention-2 over one causal mask,
and keeps that time for the torchtitan launch: per-document masks only remove work, and FlexAttention's rate against
FA2 is what this measures. Per sequence length (Llama-2-13B attention: 40 heads × 128, bf16, ``--tokens`` per call),
the median forward and forward + backward of:

* ``fa2``: ``F.scaled_dot_product_attention(is_causal=True)`` under the FLASH_ATTENTION backend (the plan's kernel);
* ``flex causal``: ``torch.compile(flex_attention)`` with a causal ``create_block_mask``: the same score pairs, so
  its time over fa2's is the kernel ratio;
* ``flex documents``: the same with a per-document causal mask, documents of ``--doc-tokens`` packed back to back:
  the work such masks remove (its rate is over its own unmasked pairs);
* ``flex cp<N>``, for each of ``--cps`` at the longest sequence: the last rank of torchtitan's all-gather CP, its
  head-tail-balanced local queries (chunks N−1 and N of 2N) against every key, causal in global positions, one
  call: seq²/(2N) pairs, as each rank's share (the all-gather itself is communication, not timed here).

Work is counted as score pairs (the causal half of a square counts s²/2, the convention of
``benchmarks/bench_attention_backends.py`` and ``trainplan.model.flops``), 4 FLOPs per pair and head feature
forward, 3× that for forward + backward. Each row's ``time_per_pair_rel_fa2`` is its time per pair over fa2's at
the same sequence (at the longest one for the CP rows): 1.0 = FA2's rate. A case that cannot run is recorded with its
error, and the rest still run; the JSON is rewritten after each case, so a budget kill keeps what ran. They run in
the order of their worth (each FlexAttention case compiles its own kernels): every fa2, every flex causal, the CP
rows, the per-document rows.

    python benchmarks/bench_flex_attention.py --out flex_attention.json     # CUDA (FlexAttention trains on GPUs only)
    python benchmarks/bench_flex_attention.py --dry-run                     # the cases and their work
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_hbm_stream import event_timer, write_results  # noqa: E402  (a sibling script, not a package)


def head_tail_positions(seq: int, cp: int, rank: int) -> list[int]:
    """Global positions of ``rank``'s queries under head-tail load balancing (torch's ``_HeadTailLoadBalancer``,
    torchtitan's default): chunks ``rank`` and ``2·cp − 1 − rank`` of ``2·cp`` equal chunks."""
    c = seq // (2 * cp)
    return list(range(rank * c, (rank + 1) * c)) + list(range((2 * cp - 1 - rank) * c, (2 * cp - rank) * c))


def plan(seqs: list[int], tokens: int, cps: list[int], doc_tokens: int, heads: int,
         head_dim: int) -> list[dict[str, Any]]:
    """The cases, each with its shape and work: batch, queries and keys per sequence, score pairs per sequence
    and head, forward and training FLOPs of the call."""
    def case(name: str, s: int, queries: int, pairs: float, cp: int = 1, doc: int | None = None) -> dict[str, Any]:
        return {"case": name, "seq": s, "batch": tokens // s, "queries": queries, "keys": s, "cp": cp,
                "doc_tokens": doc, "pairs": pairs}

    # in the order of their worth, each FlexAttention case compiling its own kernels (a budget cut keeps the first):
    # FA2 (no compile), the kernel ratio at each sequence, the all-gather CP rank, then the per-document masks
    longest = max(seqs)
    return [r | {"heads": heads, "head_dim": head_dim, "fwd_flops": 4.0 * r["batch"] * heads * r["pairs"] * head_dim,
                 "train_flops": 12.0 * r["batch"] * heads * r["pairs"] * head_dim} for r in
            [case("fa2", s, s, s * s / 2) for s in seqs]
            + [case("flex causal", s, s, s * s / 2) for s in seqs]
            + [case(f"flex cp{cp}", longest, longest // cp, longest * longest / (2 * cp), cp=cp) for cp in cps]
            + [case("flex documents", s, s, ((s // doc_tokens) * doc_tokens**2 + (s % doc_tokens) ** 2) / 2,
                    doc=doc_tokens) for s in seqs]]  # whole documents, then the last one cut short


def mask_mod_of(r: dict[str, Any], device: str) -> Any:
    """The case's FlexAttention mask_mod over (local query index, key index), None for fa2."""
    import torch

    if r["case"] == "fa2":
        return None
    if r["cp"] > 1:
        pos = torch.tensor(head_tail_positions(r["seq"], r["cp"], r["cp"] - 1), device=device)
        return lambda b, h, q, kv: pos[q] >= kv
    if r["doc_tokens"]:
        d = r["doc_tokens"]
        return lambda b, h, q, kv: (q >= kv) & (q // d == kv // d)
    return lambda b, h, q, kv: q >= kv


def _time_case(a: argparse.Namespace, r: dict[str, Any], flex: Any, timer: Any) -> None:
    """Time one case: its median forward (no grad) and, off CPU, forward + backward, into ``r``."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask

    def bf16(*shape: int, grad: bool = False) -> torch.Tensor:
        return torch.randn(*shape, device=a.device, dtype=torch.bfloat16, requires_grad=grad and not a.forward_only)

    b, h, d = r["batch"], r["heads"], r["head_dim"]
    q, k, v = (bf16(b, h, n, d, grad=True) for n in (r["queries"], r["keys"], r["keys"]))
    g = bf16(b, h, r["queries"], d)
    if r["case"] == "fa2":
        def call() -> torch.Tensor:
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        mask = create_block_mask(mask_mod_of(r, a.device), None, None, r["queries"], r["keys"], device=a.device)
        r["mask_density"] = float(1.0 - mask.sparsity() / 100.0)

        def call() -> torch.Tensor:
            return flex(q, k, v, block_mask=mask)

    def fwd() -> None:
        with torch.no_grad():
            call()

    def train() -> None:
        q.grad = k.grad = v.grad = None
        call().backward(g)

    r["fwd_s"] = statistics.median(timer(fwd, a.warmup, a.iters))
    if not a.forward_only:
        r["train_s"] = statistics.median(timer(train, a.warmup, a.iters))


def _measure(a: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    timer = event_timer(a.device)
    # each case's shape and mask_mod is a recompile of the one compiled function: past dynamo's recompile limit (8) it
    # would fall back, silently, to flex_attention's eager path (the full score matrix), and the later cases would time
    # that. Room for every case, forward and backward, and an error instead of the fallback.
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 4 * len(rows)))
    if hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit"):
        torch._dynamo.config.fail_on_recompile_limit_hit = True
    flex = torch.compile(flex_attention, dynamic=False)
    for r in rows:
        try:
            _time_case(a, r, flex, timer)
            print(f"{r['case']:<15} seq {r['seq']:>6} q {r['queries']:>6}: fwd {r['fwd_s'] * 1e3:8.2f} ms"
                  + ("" if a.forward_only else f", train {r['train_s'] * 1e3:8.2f} ms"), flush=True)
        except Exception as e:  # noqa: BLE001 - a case that cannot run is a result, the rest still run
            r["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            print(f"{r['case']:<15} seq {r['seq']:>6}: {r['error']}", file=sys.stderr, flush=True)
        if a.device == "cuda":
            torch.cuda.empty_cache()
        summarize(rows, a.peak_tflops)
        write_results(a, rows)  # after every case: a budget kill keeps what ran (each case compiles its kernels)


def summarize(rows: list[dict[str, Any]], peak_tflops: float) -> None:
    """Each timed row's TFLOP/s and fraction of peak, and its time per score pair over fa2's at the same sequence
    (the longest for the CP rows): ``time_per_pair_rel_fa2``, forward and training (None where fa2 did not run)."""
    for kind in ("fwd", "train"):
        ref = {r["seq"]: r[f"{kind}_s"] / (r["batch"] * r["pairs"]) for r in rows
               if r["case"] == "fa2" and f"{kind}_s" in r}
        for r in rows:
            if f"{kind}_s" not in r:
                continue
            r[f"{kind}_tflops"] = r[f"{kind}_flops"] / r[f"{kind}_s"] / 1e12
            r[f"{kind}_frac_of_peak"] = r[f"{kind}_tflops"] / peak_tflops
            per_pair = r[f"{kind}_s"] / (r["batch"] * r["pairs"])
            r[f"{kind}_time_per_pair_rel_fa2"] = per_pair / ref[r["seq"]] if r["seq"] in ref else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seqs", default="4096,16384", help="sequence lengths (comma-separated)")
    p.add_argument("--tokens", type=int, default=32768, help="batch × seq per call")
    p.add_argument("--cps", default="2,4,8", help="CP degrees of the all-gather rows, at the longest sequence")
    p.add_argument("--doc-tokens", type=int, default=1024, help="document length of the per-document mask")
    p.add_argument("--heads", type=int, default=40)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense BF16 peak (H100/H200 SXM: 989)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="cpu: forward only (FlexAttention has no CPU backward), for the test; never a GPU figure")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--dry-run", action="store_true", help="list the cases and their work; time nothing")
    a = p.parse_args(argv)
    try:
        seqs = [int(s) for s in a.seqs.split(",")]
        cps = [int(c) for c in a.cps.split(",")] if a.cps else []
    except ValueError:
        p.error(f"--seqs={a.seqs!r} / --cps={a.cps!r}: comma-separated positive integers")
    bad = [s for s in seqs if s < 128 or s % 128 or a.tokens % s]
    if bad:
        p.error(f"--seqs={a.seqs!r}: each a multiple of 128 (FlexAttention's block) that divides --tokens={a.tokens}")
    if any(c < 2 or max(seqs) % (2 * c) for c in cps):
        p.error(f"--cps={a.cps!r}: each ≥ 2, with the longest sequence {max(seqs)} a multiple of 2·cp (two "
                "head-tail chunks)")
    if a.doc_tokens < 1 or a.iters < 1 or a.warmup < 0:
        p.error("--doc-tokens and --iters must be >= 1, --warmup >= 0")
    a.forward_only = a.device == "cpu"

    rows = plan(seqs, a.tokens, cps, a.doc_tokens, a.heads, a.head_dim)
    if a.dry_run:
        for r in rows:
            print(f"{r['case']:<15} batch {r['batch']:>3} × q {r['queries']:>6} × k {r['keys']:>6}: "
                  f"{r['train_flops'] / 1e12:8.2f} TFLOP forward + backward")
        return 0
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        print("bench_flex_attention: no CUDA device (--dry-run lists the cases)", file=sys.stderr)
        return 2
    _measure(a, rows)
    kind = "fwd" if a.forward_only else "train"
    print(f"{'case':<15} {'seq':>6} {'queries':>7} {'TFLOP/s':>8} {'÷ FA2 per pair':>14}")
    for r in rows:
        rel = r.get(f"{kind}_time_per_pair_rel_fa2")
        print(f"{r['case']:<15} {r['seq']:>6} {r['queries']:>7} "
              + (r["error"] if "error" in r else f"{r[kind + '_tflops']:>8.1f} {'n/a' if rel is None else f'{rel:.3f}':>14}"),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
