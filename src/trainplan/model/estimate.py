"""One layout end to end: structural checks, memory, time, and the ``trainplan estimate --json`` schema."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

from trainplan.model import flops, memory, timing
from trainplan.model.arch import ModelSpec
from trainplan.model.base import GiB
from trainplan.model.efficiency import Efficiency
from trainplan.model.hardware import ClusterSpec
from trainplan.model.layout import OFFLOADS, RECOMPUTES, Layout, layout_problems, one_rank_duplicate
from trainplan.model.training import TrainingSpec

__all__ = ["Estimate", "estimate", "fastest_micro_batch", "micro_batch_choices", "MEMORY_KEYS", "DEFAULT_MAX_MEM_FRAC",
           "MAX_MICRO_BATCH"]

MAX_MICRO_BATCH = 65536  # the config schema's bound of layout.micro_batch
MEMORY_KEYS = ("weights", "gradients", "optimizer", "activations", "logits", "buffers", "overhead", "total")
# Headroom verdict: a plan is feasible when its peak is at most this fraction of usable HBM (DESIGN §1).
DEFAULT_MAX_MEM_FRAC = 0.90


@dataclass(frozen=True)
class Estimate:
    model: ModelSpec
    layout: Layout
    feasible: bool
    reason: str
    memory_bytes: dict[str, float] = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)
    hbm_bytes: float = 0.0
    efficiency_source: str = "defaults"
    flops_per_token: float = 0.0  # flops.train_flops_per_token: 6N-based for full, 4N-based for LoRA/QLoRA

    @property
    def headroom_frac(self) -> float:
        total = self.memory_bytes.get("total", float("nan"))
        return 1.0 - total / self.hbm_bytes if self.hbm_bytes else float("nan")

    def to_json(self) -> dict[str, Any]:
        """The ``trainplan estimate --json`` schema (SI inside, GiB for memory as named)."""
        t = self.timing
        return {
            "feasible": self.feasible,
            "reason": self.reason,
            "model": self.model.name,
            "params": self.model.n_params,
            "flops_per_token": self.flops_per_token,
            "memory_gib": {k: self.memory_bytes[k] / GiB for k in MEMORY_KEYS if k in self.memory_bytes},
            "hbm_gib": self.hbm_bytes / GiB,
            "headroom": self.headroom_frac,
            "step_time_s": t.get("step_time_s"),
            "tokens_per_s": t.get("tokens_per_s"),
            "tokens_per_s_per_gpu": t.get("tokens_per_s_per_gpu"),
            "mfu": t.get("mfu"),
            "hfu": t.get("hfu"),
            "breakdown": {k: t[k] for k in timing.TIMING_KEYS  # seconds per step (STEP_PARTS add up to the step)
                          if k.endswith("_s") and k not in ("step_time_s", "tokens_per_s") and k in t},
            "compute_parts": {k: t[k] for k in timing.COMPUTE_PARTS if k in t},  # inside breakdown.compute_s
            "layout": self.layout.to_dict(),
            "layout_text": self.layout.describe(),
            "family": self.layout.family,
            "efficiency_source": self.efficiency_source,
        }


def estimate(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout,
             eff: Efficiency | None = None, max_mem_frac: float = DEFAULT_MAX_MEM_FRAC) -> Estimate:
    """Memory and time of one layout; structural problems or OOM give ``feasible=False`` with the reason."""
    eff = eff or Efficiency.for_gpu(cluster.gpu)
    hbm = float(cluster.gpu.hbm_bytes)
    f_tok = flops.train_flops_per_token(model, training)
    problems = layout_problems(model, cluster, training, layout)
    if problems:
        return Estimate(model=model, layout=layout, feasible=False, reason="; ".join(problems), hbm_bytes=hbm,
                        efficiency_source=eff.source, flops_per_token=f_tok)
    mem = {k: float(v) for k, v in memory.memory_breakdown(model, cluster, training, layout, eff).items()}
    tim = timing.step_time(model, cluster, training, layout, eff)
    reason = ""
    if mem["total"] > max_mem_frac * hbm:
        reason = (f"OOM: needs {mem['total'] / GiB:.1f} GiB > {max_mem_frac:.0%} of "
                  f"{hbm / GiB:.1f} GiB usable HBM")
    if layout.offload != "none":  # the host holds what offload takes off HBM
        reason = "; ".join(r for r in (reason, memory.host_ram_problem(model, cluster, training, layout,
                                                                      max_mem_frac)) if r)
    return Estimate(model=model, layout=layout, feasible=not reason, reason=reason, memory_bytes=mem, timing=tim,
                    hbm_bytes=hbm, efficiency_source=eff.source, flops_per_token=f_tok)


def micro_batch_choices(training: TrainingSpec, layout: Layout) -> list[int]:
    """Micro-batches worth trying for one layout: the divisors of the local batch (global_batch // dp sequences per
    data-parallel rank) that are powers of two, and the local batch itself (no gradient accumulation); ascending."""
    local = max(1, training.global_batch // layout.dp)
    out = {1 << k for k in range(MAX_MICRO_BATCH.bit_length()) if (1 << k) <= min(local, MAX_MICRO_BATCH)
           and local % (1 << k) == 0}
    if local <= MAX_MICRO_BATCH:
        out.add(local)
    return sorted(out)


# The flags of the memory knobs, in the order a fix is named (estimate's CLI spelling).
MEMORY_KNOBS = ("sharding", "recompute", "offload", "micro_batch")


def memory_fix(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout,
               eff: Efficiency | None = None, max_mem_frac: float = DEFAULT_MAX_MEM_FRAC) -> dict[str, Any] | None:
    """For a layout that does not fit: the fastest that does with the same parallel degrees (dp, tp, pp, cp),
    changing only the memory knobs (sharding, recompute, CPU offload, micro-batch down to 1), and what changed
    ({changes: {knob: value}, layout, memory_gib, tokens_per_s_per_gpu}); None when none of those fit either.
    What ``trainplan estimate`` suggests; the search (``trainplan plan``) also varies the degrees."""
    eff = eff or Efficiency.for_gpu(cluster.gpu)
    shardings = [layout.sharding] + [s for s in ("zero1", "zero2", "zero3") if s != layout.sharding]
    best = None
    for sh, rc, off in itertools.product(shardings, RECOMPUTES, OFFLOADS):
        if (off == "cpu" and sh == "none") or one_rank_duplicate(layout.dp * layout.cp, sh, off):
            continue  # as the search enumerates: offload needs a sharded optimizer; one-rank repeats left out
        for mb in sorted({m for m in (layout.micro_batch, 1, 2, 4) if m <= layout.micro_batch}, reverse=True):
            cand = replace(layout, sharding=sh, recompute=rc, offload=off, micro_batch=mb,
                           shard_group=None if sh != "hsdp" else layout.shard_group)
            if layout_problems(model, cluster, training, cand):
                continue
            e = estimate(model, cluster, training, cand, eff, max_mem_frac)
            if e.feasible and (best is None or e.timing["tokens_per_s_per_gpu"] > best.timing["tokens_per_s_per_gpu"]):
                best = e
    if best is None:
        return None
    js = best.to_json()
    changes = {k: getattr(best.layout, k) for k in MEMORY_KNOBS if getattr(best.layout, k) != getattr(layout, k)}
    return {"changes": changes, "layout": best.layout.describe(), "memory_gib": js["memory_gib"]["total"],
            "tokens_per_s_per_gpu": js["tokens_per_s_per_gpu"]}


def fastest_micro_batch(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout,
                        eff: Efficiency | None = None,
                        max_mem_frac: float = DEFAULT_MAX_MEM_FRAC) -> tuple[Estimate, list[int]]:
    """The layout at its fastest micro-batch that fits (``micro_batch_choices``), as the study's search picks it, and
    the micro-batches tried. When none fits, micro-batch 1 (the least activation memory), infeasible with its reason.
    Larger micro-batches amortise per-call overheads (kernel launches, per-layer collectives' latency): for a small
    model at a short sequence the difference from micro-batch 1 is large; for a 13B at 4096 tokens memory decides."""
    eff = eff or Efficiency.for_gpu(cluster.gpu)
    tried = micro_batch_choices(training, layout)
    ests = [estimate(model, cluster, training, replace(layout, micro_batch=m), eff, max_mem_frac) for m in tried]
    ok = [e for e in ests if e.feasible]
    if not ok:
        return ests[0], tried
    return max(ok, key=lambda e: e.timing["tokens_per_s_per_gpu"]), tried
