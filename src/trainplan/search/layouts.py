"""Enumerate every valid layout, evaluate them vectorised, rank, mark the Pareto front, explain losers.

``search()`` returns one row per enumerated layout (the columns of ``analytic/candidates.csv`` in
docs/ARCHITECTURE.md). Infeasible layouts stay as rows with ``feasible=False`` and a ``reason``.
Options (all optional; the config's ``search:`` section): tp, pp, cp, vpp, micro_batch (lists of ints),
sp (list of bools), pp_schedule, cp_kind, sharding, recompute, offload (lists of names), shard_group
(list of ints; default: divisors of dp·cp), max_mem_frac (float).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import fields, replace
from typing import Any

import numpy as np
import pandas as pd

from trainplan.model import memory, timing
from trainplan.model.arch import ModelSpec
from trainplan.model.base import ConfigError, GiB
from trainplan.model.efficiency import Efficiency
from trainplan.model.estimate import DEFAULT_MAX_MEM_FRAC, MEMORY_KEYS
from trainplan.model.hardware import ClusterSpec
from trainplan.model.layout import (
    CP_KINDS,
    OFFLOADS,
    PP_SCHEDULES,
    RECOMPUTES,
    SHARDINGS,
    Layout,
    LayoutTable,
    batch_multiples,
    grad_accum,
    nearest_multiples,
    one_rank_duplicate,
    shard_degree,
)
from trainplan.model.training import TrainingSpec

__all__ = ["best_row", "describe_rows", "family_layout", "refit_as_launched", "row_layout", "runner_up_index", "shards_alike", "shards_alike_mask", "pinned_options", "search", "tie_order", "enumerate_layouts", "family_verdicts", "technique_verdicts", "structural_reasons", "OPTION_KEYS",
           "infeasible_summary", "require_feasible"]

OPTION_KEYS = ("tp", "pp", "cp", "vpp", "micro_batch", "sp", "pp_schedule", "cp_kind", "sharding", "recompute",
               "offload", "shard_group", "max_mem_frac", "tp_overlap")
_NAMED = {"pp_schedule": PP_SCHEDULES, "cp_kind": CP_KINDS, "sharding": SHARDINGS, "recompute": RECOMPUTES,
          "offload": OFFLOADS}


# torchtitan's async TP runs only under torch.compile (its SymmetricMemory fused ops are Inductor passes);
# Megatron's --tp-comm-overlap needs Transformer Engine: neither exists for eager PyTorch.
ASYNC_TP_NEEDS = "TP comm overlap needs kernels=compiled (torchtitan async TP) or fused (Megatron/TE)"
ASYNC_TP_TECHNIQUE = "TP comm overlap (async TP)"  # its row in the technique table


def _divisors(n: int) -> list[int]:
    """Divisors of ``n`` in increasing order, in O(√n) (``nodes: 1e8`` must not loop 10⁸ times)."""
    small, large = [], []
    k = 1
    while k * k <= n:
        if n % k == 0:
            small.append(k)
            if k * k != n:
                large.append(n // k)
        k += 1
    return small + large[::-1]


# The config schema's names (config/config.schema.yaml `search:`) → search option names.
CONFIG_ALIASES = {"shardings": "sharding", "recomputes": "recompute", "offloads": "offload",
                  "micro_batches": "micro_batch", "max_hbm_frac": "max_mem_frac", "pp_schedules": "pp_schedule",
                  "cp_kinds": "cp_kind", "shard_groups": "shard_group", "tp_overlaps": "tp_overlap"}
_MAX_KEYS = {"max_tp": "tp", "max_pp": "pp", "max_cp": "cp"}
_IGNORED = ("top_k",)  # used by the CLI and the workflow, not by the enumeration


def _opts(cluster: ClusterSpec, options: dict[str, Any] | None) -> dict[str, Any]:
    o: dict[str, Any] = {}
    caps: dict[str, int] = {}
    for k, v in (options or {}).items():
        if k in _IGNORED:
            continue
        if k in _MAX_KEYS:
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError("search." + k, v, "must be a positive integer")
            caps[_MAX_KEYS[k]] = v
            continue
        o[CONFIG_ALIASES.get(k, k)] = v
    for k in o:
        if k not in OPTION_KEYS:
            raise ConfigError("search." + k, o[k], "unknown option; valid: " + ", ".join(
                (*OPTION_KEYS, *CONFIG_ALIASES, *_MAX_KEYS, *_IGNORED)))
    n = cluster.n_gpus
    out: dict[str, Any] = {
        "tp": [d for d in _divisors(cluster.gpus_per_node)], "pp": [d for d in _divisors(n) if d <= 16],
        "cp": [d for d in _divisors(n) if d <= 16], "vpp": [2, 4], "micro_batch": [1, 2, 4, 8], "sp": [False, True],
        "tp_overlap": [False, True],
        "pp_schedule": list(PP_SCHEDULES), "cp_kind": list(CP_KINDS), "sharding": list(SHARDINGS),
        "recompute": list(RECOMPUTES), "offload": list(OFFLOADS), "shard_group": None,
        "max_mem_frac": DEFAULT_MAX_MEM_FRAC,
    }
    for k, v in o.items():
        if v is None:
            continue
        if k == "max_mem_frac":
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 1:
                raise ConfigError("search.max_mem_frac", v, "must be a fraction in (0, 1]")
            out[k] = float(v)
            continue
        vals = list(v) if isinstance(v, list | tuple) else [v]
        if not vals:
            raise ConfigError("search." + k, v, "must be a non-empty list")
        for x in vals:
            if k in _NAMED and x not in _NAMED[k]:
                raise ConfigError("search." + k, x, "must be one of " + ", ".join(_NAMED[k]))
            if k in ("sp", "tp_overlap") and not isinstance(x, bool):
                raise ConfigError("search." + k, x, "must be true or false")
            if k not in _NAMED and k not in ("sp", "tp_overlap") and (isinstance(x, bool) or not isinstance(x, int) or x < 1):
                raise ConfigError("search." + k, x, "must be a list of positive integers")
        out[k] = vals
    for k, cap in caps.items():
        out[k] = [x for x in out[k] if x <= cap] or [1]
    return out


def enumerate_layouts(cluster: ClusterSpec, options: dict[str, Any] | None = None) -> LayoutTable:
    """Every layout whose degrees multiply to the GPU count (and that ``Layout()`` would accept)."""
    o = _opts(cluster, options)
    n = cluster.n_gpus
    par: list[tuple] = []  # dp, tp, pp, cp, sp, sched, vpp, cp_kind, tp_overlap
    for tp, pp, cp in itertools.product(o["tp"], o["pp"], o["cp"]):
        if n % (tp * pp * cp):
            continue
        dp = n // (tp * pp * cp)
        sps = [s for s in o["sp"] if not (s and tp == 1)]
        scheds = [("1f1b", 1)] if pp == 1 else [(s, v) for s in o["pp_schedule"]
                                                 for v in ([1] if s == "1f1b" else o["vpp"])]
        kinds = ["ring"] if cp == 1 else o["cp_kind"]
        if pp == 1 and "1f1b" not in o["pp_schedule"] and "interleaved" in o["pp_schedule"]:
            scheds = [("1f1b", 1)]
        tpo = [False] if tp == 1 else o["tp_overlap"]
        par += [(dp, tp, pp, cp, s, sc, v, k, a) for s in sps for sc, v in scheds for k in kinds for a in tpo]
    if not par:
        raise ConfigError("search", {k: o[k] for k in ("tp", "pp", "cp")},
                          f"no tp·pp·cp combination divides the {n} GPUs")
    shard: list[tuple[str, int]] = []
    for s in o["sharding"]:
        if s == "hsdp":
            groups = o["shard_group"] or [g for g in _divisors(n) if 1 < g < n]
            shard += [("hsdp", int(g)) for g in groups]
        else:
            shard.append((s, 0))
    rest = list(itertools.product(o["recompute"], o["offload"], o["micro_batch"]))
    P = np.array(par, dtype=object)
    S = np.array(shard, dtype=object)
    R = np.array(rest, dtype=object)
    ip, is_, ir = (a.ravel() for a in np.meshgrid(np.arange(len(P)), np.arange(len(S)), np.arange(len(R)),
                                                  indexing="ij"))
    cols = {
        "dp": P[ip, 0].astype(int), "tp": P[ip, 1].astype(int), "pp": P[ip, 2].astype(int),
        "cp": P[ip, 3].astype(int), "sp": P[ip, 4].astype(bool), "pp_schedule": P[ip, 5].astype(str),
        "vpp": P[ip, 6].astype(int), "cp_kind": P[ip, 7].astype(str), "tp_overlap": P[ip, 8].astype(bool), "sharding": S[is_, 0].astype(str),
        "shard_group": S[is_, 1].astype(int), "recompute": R[ir, 0].astype(str), "offload": R[ir, 1].astype(str),
        "micro_batch": R[ir, 2].astype(int),
    }
    keep = ~((cols["offload"] == "cpu") & (cols["sharding"] == "none"))  # offload needs a sharded optimizer
    keep &= (cols["sharding"] != "hsdp") | (cols["shard_group"] < cols["dp"] * cols["cp"])
    keep &= ~one_rank_duplicate(cols["dp"] * cols["cp"], cols["sharding"], cols["offload"])
    return LayoutTable(**{k: v[keep] for k, v in cols.items()})


def structural_reasons(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, L: LayoutTable) -> np.ndarray:
    """specs.layout_problems, vectorised: one reason string per row ('' = structurally valid)."""
    s, n = training.seq_len, len(L)
    dpcp = L.dp * L.cp
    g = np.where(L.shard_group == 0, shard_degree(L, cluster), L.shard_group)
    checks = [
        (L.world_size != cluster.n_gpus, f"dp·tp·pp·cp != {cluster.n_gpus} GPUs"),
        (model.heads % L.tp != 0, "tp={tp} does not divide heads=" + str(model.heads)),
        ((model.kv_heads % L.tp != 0) & (L.tp % model.kv_heads != 0), "tp={tp} and kv_heads=" + str(model.kv_heads)
         + ": neither divides the other"),
        (model.ffn_hidden % L.tp != 0, "tp={tp} does not divide ffn_hidden=" + str(model.ffn_hidden)),
        (L.tp > cluster.gpus_per_node, "tp={tp} spans nodes; TP must stay in NVLink"),
        (L.pp * L.vpp > model.layers, "pp·v = {pp}·{vpp} exceeds layers=" + str(model.layers)),
        (training.global_batch % (L.dp * L.micro_batch) != 0,
         "global_batch=" + str(training.global_batch) + " is not a multiple of dp·micro_batch = {dp}·{micro_batch}"
         " (the nearest that are: {gb_near})"),
        ((L.pp > 1) & (grad_accum(training, L) < L.pp), "fewer micro-batches per step than pp={pp} stages"),
        ((L.cp_kind == "ring") & (L.cp > 1) & (s % (2 * L.cp) != 0),
         "seq_len=" + str(s) + " not divisible by 2·cp (ring load balancing)"),
        (s % L.cp != 0, "seq_len=" + str(s) + " not divisible by cp"),
        ((L.cp > 1) & (L.cp_kind == "ulysses") & (model.heads % (L.cp * L.tp) != 0),
         "ulysses cp·tp does not divide heads=" + str(model.heads)),
        (L.sp & (s % L.tp != 0), "seq_len not divisible by tp={tp}"),
        (np.full(n, training.kernels == "eager") & L.tp_overlap.astype(bool), ASYNC_TP_NEEDS),
        ((L.sharding == "hsdp") & (dpcp % g != 0), "hsdp shard_group must divide dp·cp"),
        ((L.offload == "cpu") & (L.sharding == "none"), "optimizer offload needs a ZeRO/FSDP sharding"),
    ]
    out = np.full(n, "", dtype=object)
    for mask, msg in checks:
        idx = np.nonzero(mask & (out == ""))[0]
        if len(idx) == 0:
            continue
        if "{" in msg:
            vals = {k: getattr(L, k)[idx] for k in ("tp", "pp", "vpp", "dp", "micro_batch")}
            vals["gb_near"] = [batch_multiples(training.global_batch, int(m))  # either side of global_batch
                               for m in vals["dp"] * vals["micro_batch"]]
            out[idx] = [msg.format(**{k: v[i] for k, v in vals.items()}) for i in range(len(idx))]
        else:
            out[idx] = msg
    return out


def _per_unique(df: pd.DataFrame, cols: list[str], fn: Any) -> np.ndarray:
    """Apply ``fn(row_dict) -> str`` once per unique combination of ``cols``; map back to every row."""
    codes = df.groupby(cols, sort=False).ngroup().to_numpy()  # numbered in order of first appearance
    uniques = df[cols].drop_duplicates().to_dict("records")  # the same order
    return np.array([fn(u) for u in uniques], dtype=object)[codes]


_SHARD_NAMES = {"none": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "FSDP", "hsdp": "HSDP"}


def _family_of(r: dict) -> str:
    """Layout.family for one combination of the fields it depends on (see :attr:`Layout.family`)."""
    if r["sharding"] == "none" and r["dp"] * r["tp"] * r["pp"] * r["cp"] == 1:
        return "one GPU"
    parts = [_SHARD_NAMES[r["sharding"]]]
    if r["tp"] > 1:
        parts.append("TP")
    if r["pp"] > 1:
        parts.append("PP")
    return "×".join(parts)


def _family(df: pd.DataFrame) -> np.ndarray:
    """Layout.family, vectorised over the frame's columns."""
    return _per_unique(df, ["sharding", "tp", "pp", "dp", "cp"], _family_of)


# Techniques that modify a family: each gets a verdict "with vs without" (technique_verdicts).
TECHNIQUES: dict[str, Any] = {
    "sequence parallelism (SP)": lambda d: d["sp"].astype(bool),
    ASYNC_TP_TECHNIQUE: lambda d: (d["tp_overlap"].astype(bool) if "tp_overlap" in d
                                            else pd.Series(False, index=d.index)),
    "context parallelism (CP)": lambda d: d["cp"] > 1,
    "optimizer offload to CPU": lambda d: d["offload"] != "none",
    "selective recompute": lambda d: d["recompute"] == "selective",
    "full recompute": lambda d: d["recompute"] == "full",
    "interleaved pipeline": lambda d: d["pp_schedule"] == "interleaved",
    "micro-batch > 1": lambda d: d["micro_batch"] > 1,
}


# How a technique is named inside another technique's verdict ("… (that layout also uses TP, CP)").
TECHNIQUE_SHORT = {"sequence parallelism (SP)": "SP", ASYNC_TP_TECHNIQUE: "async TP", "context parallelism (CP)": "CP",
                   "optimizer offload to CPU": "CPU offload", "selective recompute": "selective recompute",
                   "full recompute": "full recompute", "interleaved pipeline": "interleaved PP",
                   "micro-batch > 1": "micro-batch > 1"}


TECHNIQUE_NEEDS = {"sequence parallelism (SP)": ("TP",), ASYNC_TP_TECHNIQUE: ("TP",), "interleaved pipeline": ("PP",)}
NEEDS_DEGREE = {"TP": "tp", "PP": "pp"}  # the layout column a prerequisite needs above 1


def _also_uses(df: pd.DataFrame, with_idx: Any, without_idx: Any, technique: str) -> list[str]:
    """What the best layout with ``technique`` uses that the best without it does not, besides the technique and
    what it needs (TECHNIQUE_NEEDS: SP needs TP): TP, PP and the other techniques. A verdict's cause ("mostly exposed comm") may be theirs, not the technique's (the
    best micro-batch-2 layout that fits may need CP to fit)."""
    pair = df.loc[[with_idx, without_idx]]
    out = [name for name, col in (("TP", "tp"), ("PP", "pp")) if col in pair
           and pair[col].iloc[0] > 1 and not pair[col].iloc[1] > 1 and name not in TECHNIQUE_NEEDS.get(technique, ())]
    for name, sel in TECHNIQUES.items():
        on = sel(pair)
        if name != technique and bool(on.iloc[0]) and not bool(on.iloc[1]):
            out.append(TECHNIQUE_SHORT.get(name, name))
    return out


def _complexity(df: pd.DataFrame) -> pd.Series:
    """Simplicity tie-break: count of non-default techniques in use (fewer is simpler)."""
    return ((df["tp"] > 1).astype(int) + (df["pp"] > 1) + (df["cp"] > 1) + df["sp"].astype(int)
            + (df["vpp"] > 1) + (df["tp_overlap"].astype(int) if "tp_overlap" in df else 0) + (df["offload"] != "none") + (df["recompute"] != "none") + (df["sharding"] == "hsdp"))


def row_layout(row: Any) -> Layout:
    """The :class:`Layout` of one candidates row (``Layout.from_row``)."""
    return Layout.from_row(row)


def _pareto(tput: np.ndarray, head: np.ndarray) -> np.ndarray:
    """Non-dominated rows for (max tokens/s, max headroom)."""
    order = np.lexsort((-head, -tput))
    best_head = -np.inf
    out = np.zeros(len(tput), dtype=bool)
    for i in order:
        if head[i] > best_head:
            out[i] = True
            best_head = head[i]
    return out


def pinned_options(options: dict[str, Any] | None, layout: Layout | None) -> dict[str, Any]:
    """Search options with a pinned layout's fields (config ``layout:``) as single values: the search then ranks
    that layout alone (dp follows from the GPU count). What the study, ``trainplan plan`` and the sensitivity
    search all use, so they agree."""
    out = dict(options or {})
    if layout is not None:
        out.update({k: v for k, v in layout.to_dict().items() if k != "dp"})
    return out


def tie_gap(a: float, b: float) -> float:
    """The gap between two speeds in the tie rule's own measure (:func:`tie_order`): the slower one's shortfall as a
    fraction of the faster one's. A tie is a gap under TIE_FRAC."""
    return 1.0 - min(a, b) / max(a, b)


def tie_pct(gap: float) -> str:
    """A gap under TIE_FRAC as a percentage, to two decimals, or more where two would round up to the threshold
    itself: 0.4959% is "0.496%", never "0.50%" next to "a tie (under 0.5%)"."""
    v = 100 * abs(float(gap))
    for d in (2, 3, 4):
        if round(v, d) < 100 * TIE_FRAC:
            return f"{v:.{d}f}%"
    return f"{v:.4f}%"


def tie_order(tput: np.ndarray, headroom: np.ndarray, complexity: np.ndarray, tie: float | None = None) -> np.ndarray:
    """Rank order with ties: positions into arrays already sorted by throughput (descending), then headroom.

    Greedy: of the layouts not yet ranked, those within ``tie`` (TIE_FRAC) of the fastest are a tie, and the next
    rank goes to the one with the most memory headroom (within HEADROOM_TIE of HBM: a tie too), then the fewest
    techniques, then the fastest. A 0.01% faster ZeRO-1 no longer beats ZeRO-2 with 12 GiB more headroom:
    throughput is a model prediction with intervals of several percent, so a difference under TIE_FRAC decides
    nothing."""
    tie = TIE_FRAC if tie is None else tie
    n = len(tput)
    if n == 0:
        return np.zeros(0, dtype=int)
    tput = np.asarray(tput, dtype=float)
    if np.any(np.diff(tput) > 0):
        raise ValueError("tie_order: throughput must be sorted in descending order")
    # each position's tie band ends where throughput drops below (1 - tie) of its own: the band of the fastest row
    # not yet ranked (``start``); a ranked row gets headroom -inf and complexity +inf, so one max and one argmin over
    # the band pick the next row (argmin: the first, i.e. fastest, of the fewest techniques among the roomiest)
    ends = np.searchsorted(-tput, -(1.0 - tie) * tput, side="right")
    room = np.array(headroom, dtype=float)
    techniques = np.array(complexity, dtype=float)
    order = np.empty(n, dtype=int)
    start, end = 0, int(ends[0])
    for k in range(n):
        if end - start == 1:
            j = start
        else:
            band = room[start:end]
            j = start + int(np.where(band >= band.max() - HEADROOM_TIE, techniques[start:end], np.inf).argmin())
        order[k] = j
        room[j], techniques[j] = -np.inf, np.inf
        if j == start and k + 1 < n:
            while room[start] == -np.inf:
                start += 1
            end = int(ends[start])
    return order


# launch.artifacts.launched_speed's columns of a study's candidates: the modelled step time as planned over as
# launched (NaN: not modelled, or not feasible), the trainer's words for what changes it, and the short words of what
# the launch changes with no step-time model ("" where none: torchtitan's all-gather CP, FSDP2's whole-model offload)
LAUNCH_TPS_RATIO, LAUNCH_TPS_WHY, LAUNCH_UNTIMED = "launch_tps_ratio", "launch_tps_why", "launch_untimed"
# A launch whose step time the planner cannot model ranks as this much slower than its modelled speed: a layout that
# runs as modelled wins unless the untimed one is faster by more than this. 5% is the per-family bias #12 holds the
# timing model to on held-out H100 runs; a difference inside it between a launch the model times and one it does not
# is not evidence for the one it does not (docs/timing-model.md, "Launches the model cannot time").
UNTIMED_MARGIN = 0.05


def _ratio(r: Any) -> float:
    x = r.get(LAUNCH_TPS_RATIO)
    return 1.0 if x is None or x != x else float(x)


def launched_tps(rows: Any, col: str = "tokens_per_s") -> Any:
    """``col`` (``tokens_per_s`` or ``tokens_per_s_per_gpu``) of candidates rows (a frame, a row or a dict) at the
    speed of what the launch runs: times LAUNCH_TPS_RATIO where the table has it and it is modelled, the plan's
    figure elsewhere. What the search ranks on and every comparison between layouts uses (a launch that trains an
    FP8 plan in bf16 is as slow as bf16); the columns themselves stay the plan's."""
    if isinstance(rows, pd.DataFrame):
        v = rows[col].astype(float)
        return v * rows[LAUNCH_TPS_RATIO].astype(float).fillna(1.0) if LAUNCH_TPS_RATIO in rows else v
    return float(rows[col]) * _ratio(rows)


def untimed(rows: Any) -> Any:
    """Whether the launch of candidates rows (a frame: a bool array; a row or dict: a bool) changes something whose
    step time is not modelled (LAUNCH_UNTIMED)."""
    if isinstance(rows, pd.DataFrame):
        if LAUNCH_UNTIMED not in rows:
            return np.zeros(len(rows), dtype=bool)
        return rows[LAUNCH_UNTIMED].fillna("").astype(str).str.len().to_numpy() > 0
    x = rows.get(LAUNCH_UNTIMED)
    return isinstance(x, str) and bool(x)


def rank_tps(rows: Any, col: str = "tokens_per_s") -> Any:
    """The speed the search ranks on: :func:`launched_tps`, less UNTIMED_MARGIN where the launch's step time is not
    modelled (:func:`untimed`)."""
    return launched_tps(rows, col) * np.where(untimed(rows), 1.0 - UNTIMED_MARGIN, 1.0)


def launch_changes_speed(r: Any) -> bool:
    """Whether what the launch runs for candidates row ``r`` has a modelled speed other than the plan's."""
    return abs(_ratio(r) - 1.0) > 1e-9


def ranked(feas: pd.DataFrame) -> pd.DataFrame:
    """Feasible layouts (tokens_per_s, headroom_frac, complexity columns) in the search's tie-aware rank order, on
    the speed of what the launch runs (:func:`rank_tps`: :func:`launched_tps`, less UNTIMED_MARGIN where that launch
    is not timed); the search ranks its candidates with it, and the memory fallback reranks what still fits at an
    error with it."""
    feas = feas.assign(_speed=rank_tps(feas)).sort_values(["_speed", "headroom_frac", "complexity"],
                                                              ascending=[False, False, True], kind="stable")
    return feas.iloc[tie_order(feas["_speed"].to_numpy(), feas["headroom_frac"].to_numpy(),
                               feas["complexity"].to_numpy())].drop(columns="_speed")


def search(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, eff: Efficiency | None = None,
           options: dict[str, Any] | None = None, *, mem_scale: float = 1.0) -> pd.DataFrame:
    """Every enumerated layout with memory, time, feasibility and rank (analytic/candidates.csv).

    ``mem_scale``: an error of the memory model as a factor on every modelled peak (the sensitivity's
    ``memory_x``); the fit test holds ``mem_scale`` × peak to ``max_mem_frac`` of usable HBM, the memory columns
    stay the model's."""
    if not (isinstance(mem_scale, int | float) and math.isfinite(mem_scale) and mem_scale > 0):
        raise ValueError(f"mem_scale={mem_scale!r}: must be a positive finite factor")
    eff = eff or Efficiency.for_gpu(cluster.gpu)
    o = _opts(cluster, options)
    L = enumerate_layouts(cluster, options)
    if impossible_techniques(cluster, training, options):  # async TP under eager: none of those rows could run
        keep = ~L.tp_overlap.astype(bool)
        if keep.any():  # (all of them would leave nothing to say why: keep them then)
            L = LayoutTable(**{k: getattr(L, k)[keep] for k in LayoutTable.FIELDS})
    df = pd.DataFrame({k: getattr(L, k) for k in LayoutTable.FIELDS})
    reason = structural_reasons(model, cluster, training, L)
    ok = reason == ""
    idx = np.nonzero(ok)[0]
    sub = LayoutTable(**{k: getattr(L, k)[idx] for k in LayoutTable.FIELDS})
    cols: dict[str, np.ndarray] = {}
    for k in MEMORY_KEYS:
        cols["mem_" + k + "_gib"] = np.full(len(df), np.nan)
    for k in (*timing.TIMING_KEYS, *timing.COMPUTE_PARTS):
        cols[k] = np.full(len(df), np.nan)
    if len(idx):
        mem = memory.memory_breakdown(model, cluster, training, sub, eff)
        for k in MEMORY_KEYS:
            if k in mem:
                cols["mem_" + k + "_gib"][idx] = np.broadcast_to(np.asarray(mem[k], dtype=float), len(idx)) / GiB
        tim = timing.step_time(model, cluster, training, sub, eff)
        for k in (*timing.TIMING_KEYS, *timing.COMPUTE_PARTS):
            cols[k][idx] = tim[k]
    df = pd.concat([df, pd.DataFrame(cols)], axis=1)
    hbm_gib = cluster.gpu.hbm_bytes / GiB
    df["headroom_frac"] = 1.0 - df["mem_total_gib"] / hbm_gib
    need = df["mem_total_gib"].to_numpy() * mem_scale
    oom = ok & (need > o["max_mem_frac"] * hbm_gib)
    oom_idx = np.nonzero(oom)[0]
    scaled = f" (× {mem_scale:.3g}, the memory model's error)" if mem_scale != 1.0 else ""
    reason[oom_idx] = [f"OOM: needs {x:.1f} GiB{scaled} > {o['max_mem_frac']:.0%} of {hbm_gib:.1f} GiB"
                       for x in need[oom_idx]]
    off = np.nonzero(ok & (df["offload"].to_numpy() != "none"))[0]  # the host holds what offload takes off HBM
    if len(off):
        host = memory.host_ram_problem(model, cluster, training,
                                       LayoutTable(**{k: getattr(L, k)[off] for k in LayoutTable.FIELDS}),
                                       o["max_mem_frac"])
        reason[off] = [("; ".join(x for x in (r, h) if x)) for r, h in zip(reason[off], host, strict=True)]
    df["feasible"] = reason == ""
    df["reason"] = reason
    df["family"] = _family(df)
    df["layout_text"] = describe_rows(df)
    df["complexity"] = _complexity(df)
    df["grad_accum"] = np.maximum(1, training.global_batch // df["dp"] // df["micro_batch"])
    return _rank(df)


def _rank(df: pd.DataFrame) -> pd.DataFrame:
    """``rank`` (1 = chosen, 0 = infeasible) and ``pareto`` of the feasible rows, the table sorted by rank."""
    feas = ranked(df[df["feasible"]])
    df["rank"] = 0
    df.loc[feas.index, "rank"] = np.arange(1, len(feas) + 1)
    df["pareto"] = False
    if len(feas):
        df.loc[feas.index, "pareto"] = _pareto(launched_tps(feas).to_numpy(), feas["headroom_frac"].to_numpy())
    df["_r"] = np.where(df["rank"] > 0, df["rank"], np.iinfo(np.int64).max)
    return df.sort_values(["_r"], kind="stable").drop(columns="_r").reset_index(drop=True)


# refit_as_launched's reasons: the launch would not fit it, cannot run it, runs it as another row's layout
LAUNCH_OOM, LAUNCH_NO_RUN, LAUNCH_AS = "OOM as launched (", "cannot run as launched (", "launched as "
LAUNCH_AS_MISFIT = ", which does not fit: "  # after LAUNCH_AS's layout, where that layout is out itself


def refit_as_launched(df: pd.DataFrame, peak_of: Any, cluster: ClusterSpec, options: dict[str, Any] | None,
                      top: int, ruled_out: Sequence[tuple[Any, Any]] = (), *, mem_scale: float = 1.0) -> pd.DataFrame:
    """``df`` (a :func:`search` result) with the layouts whose launch would not fit ruled out and the rest reranked.

    ``peak_of(row)`` → ``(GiB or None, how, runs)``: the modelled peak of what the launch runs for that layout
    (``launch.artifacts.launched_peak``: QLoRA as LoRA over a bf16 base, torchtitan's gathered K/V under CP, ...),
    None where it runs the plan or has no memory model (the plan's peak, already held to the limit, stands), a few
    words on what differs, and whether the trainer can run it at all (no: reason ``cannot run as launched (how)``).
    A layout whose launched peak × ``mem_scale`` (the memory model's error, as in :func:`search`) is above the
    search's limit (``max_mem_frac`` of ``options``, 90%, of usable HBM) becomes infeasible, reason
    ``OOM as launched (how): needs …``. ``ruled_out``: (mask, reason or one reason per row) pairs, the rows the
    launch is known not to run as named, decided for the whole table at once and ruled out first (Accelerate's
    no-PP: ``cannot run as launched (…)``; a layout its trainer runs as another row's: ``launched as …``).

    Sizing a launch takes milliseconds, so only the layouts the study names are judged: the ``top`` ranks, each
    family's best and each technique's best with and without it (:func:`technique_verdicts`). Ruling one out and
    reranking can bring another, not yet judged, into those places (the tie bands move), so this repeats until
    every named layout has been judged and fits as launched; a layout further down keeps its planned verdict."""
    frac = float(_opts(cluster, options)["max_mem_frac"])
    hbm_gib = cluster.gpu.hbm_bytes / GiB
    df = df.copy()
    gone_any = False
    for mask, why in ruled_out:
        gone = df["feasible"].astype(bool).to_numpy() & np.asarray(mask, dtype=bool)
        if gone.any():
            df.loc[gone, "reason"] = why if isinstance(why, str) else np.asarray(why, dtype=object)[gone]
            df["feasible"] = df["reason"].astype(str) == ""
            gone_any = True
    if gone_any or (LAUNCH_TPS_RATIO in df and (df[LAUNCH_TPS_RATIO].fillna(1.0) != 1.0).any()) or untimed(df).any():
        df = _rank(df)  # (search ranked on the plan's speed)
    judged: set[str] = set()
    while True:
        feas = df[df["feasible"].astype(bool)]
        named = set(feas.sort_values("rank", kind="stable")["layout_text"].head(top))
        named |= {str(best_row(g)["layout_text"]) for _, g in feas.groupby("family", sort=False)}
        if len(feas):
            tech = technique_verdicts(df)
            named |= {str(t) for c in ("best_with", "best_without") if c in tech for t in tech[c] if isinstance(t, str)}
        todo = [i for i in feas.index[feas["layout_text"].isin(named - judged)]]
        if not todo:
            return df
        out = False
        for idx in todo:
            r = df.loc[idx]
            judged.add(str(r["layout_text"]))
            peak, how, runs = peak_of(r)
            if not runs or (peak is not None and peak * mem_scale > frac * hbm_gib):
                scaled = f" (× {mem_scale:.3g}, the memory model's error)" if mem_scale != 1.0 else ""
                df.loc[idx, "reason"] = (f"{LAUNCH_NO_RUN}{how})" if not runs else f"{LAUNCH_OOM}{how}): needs "
                                         f"{peak * mem_scale:.1f} GiB{scaled} > {frac:.0%} of {hbm_gib:.1f} GiB")
                out = True
        if out:
            df["feasible"] = df["reason"].astype(str) == ""
            df = _rank(df)


def describe_rows(df: pd.DataFrame) -> list[str]:
    """Layout.describe(), vectorised: the string of each part is built once per unique combination."""
    def par(r: dict) -> str:
        x = f"dp{r['dp']}·tp{r['tp']}{'(sp)' if r['sp'] else ''}·pp{r['pp']}"
        if r["pp"] > 1:
            x += f"({r['pp_schedule']}{'' if r['vpp'] == 1 else ',v' + str(r['vpp'])})"
        return (x + f"·cp{r['cp']}" + (f"({r['cp_kind']})" if r["cp"] > 1 else "")
                + (" async-tp" if r["tp_overlap"] else ""))

    def shard(r: dict) -> str:
        return " " + r["sharding"] + (f"/{r['shard_group']}" if r["sharding"] == "hsdp" else "")

    def rest(r: dict) -> str:
        return f" rc={r['recompute']} mb={r['micro_batch']}" + (" offload" if r["offload"] != "none" else "")

    a = _per_unique(df, ["dp", "tp", "sp", "pp", "pp_schedule", "vpp", "cp", "cp_kind", "tp_overlap"], par)
    b = _per_unique(df, ["sharding", "shard_group"], shard)
    c = _per_unique(df, ["recompute", "micro_batch", "offload"], rest)
    return [x + y + z for x, y, z in zip(a, b, c, strict=True)]


def infeasible_summary(df: pd.DataFrame) -> str | None:
    """None when the search found a layout that fits; else one line saying why not: an empty search space, or the
    commonest kinds of first reason (numbers aside) with an example of each."""
    if not len(df):
        return ("the search space has no layout: each combination of the search lists (or of the pinned layout) is "
                "ruled out before sizing (e.g. offload needs a sharding other than none; tp, pp, cp must divide the "
                "GPUs)")
    if df["feasible"].astype(bool).any():
        return None
    first = df["reason"].astype(str).str.split(";").str[0].str.strip()
    kind = first.str.replace(r"\d+(\.\d+)?", "#", regex=True)
    top = kind.value_counts().head(3)
    return (f"no feasible layout of {len(df)}; commonest reasons: "
            + "; ".join(f"{first[kind == k].iloc[0]} (and alike: {n} layouts)" for k, n in top.items()))


def require_feasible(df: pd.DataFrame, pinned: Layout | None = None) -> None:
    """ConfigError unless ``df`` (a ``search`` result) holds a feasible layout: what a study needs before any of its
    jobs runs (cost, launch and memo all need a chosen layout). Names the pinned ``layout``, else ``search``."""
    why = infeasible_summary(df)
    if why is None:
        return
    if pinned is not None:
        raise ConfigError("layout", pinned.describe(), f"must fit; {why}")
    raise ConfigError("search", f"{len(df)} layouts", f"needs one that fits; {why}; change the model, cluster, "
                                                      "training batch or the search lists")


def _layout_columns(r: pd.Series) -> dict[str, Any]:
    """The :class:`Layout` fields of a candidates row, prefixed ``layout.`` (families.csv: the best layout as a
    Layout, not only its text), where the row has them."""
    if not {"dp", "tp", "pp", "cp", "sharding"} <= set(r.index):
        return {}
    return {f"layout.{k}": v for k, v in Layout.from_row(r).to_dict().items()}


def family_layout(row: Any) -> Layout | None:
    """The best layout of a families.csv row (:func:`family_verdicts`'s ``layout.*`` columns); None without them
    (an infeasible family, or a table written before they were)."""
    names = list(row.keys())  # a Series or a dict (iterating a Series gives its values)
    fields = {k.removeprefix("layout."): row[k] for k in names if str(k).startswith("layout.")}
    if not fields or any(v is None or v != v for k, v in fields.items() if k != "shard_group"):
        return None
    return Layout.from_row(fields)


def family_verdicts(df: pd.DataFrame) -> pd.DataFrame:
    """One row per family: its best layout (text and ``layout.*`` fields) and why it loses to the chosen one (OOM /
    slower by x% and the cause)."""
    feas = df[df["feasible"]]
    best = best_row(feas)
    rows = []
    for fam, g in df.groupby("family", sort=False):
        gf = g[g["feasible"]]
        if len(gf) == 0:
            oom = g["reason"].str.startswith(("OOM", "host RAM"))  # HBM, or the host RAM its offload needs
            no_run = g["reason"].str.startswith(LAUNCH_NO_RUN)  # what would fit, the launch's trainer cannot run
            runs_as = g["reason"].str.startswith(LAUNCH_AS)  # ... or runs as another family's layout
            if no_run.any() or runs_as.any():
                simplest = g[no_run if no_run.any() else runs_as].sort_values(["complexity", "cp", "micro_batch"],
                                                                              kind="stable").iloc[0]
                verdict, line = "infeasible", f"{simplest['layout_text']}: {simplest['reason']}"
            elif oom.any():
                r = g[oom].sort_values("mem_total_gib").iloc[0]  # the leanest on HBM, whichever limit it hits
                verdict, line = "OOM", f"every layout runs out of memory; the leanest ({r['layout_text']}) {r['reason']}"
            else:  # the reason of the family's simplest layout (dp alone, micro-batch 1), not the commonest one
                simplest = g.sort_values(["complexity", "cp", "micro_batch"], kind="stable").iloc[0]
                verdict, line = "infeasible", f"{simplest['layout_text']}: {simplest['reason']}"
            rows.append({"family": fam, "best_layout": "", "tokens_per_s_per_gpu": np.nan,
                         "tokens_per_s_per_gpu_launched": np.nan, "mem_total_gib": np.nan,
                         "rank": np.nan, "verdict": verdict, "line": line})
            continue
        r = best_row(gf)
        tps = launched_tps(r, "tokens_per_s_per_gpu")
        if best is not None and r.name == best.name:
            verdict, line = "chosen", f"best overall: {tps:,.0f} tokens/s/GPU{_as_launched(r)}"
        else:
            slower = 1.0 - launched_tps(r) / launched_tps(best)
            extra = step_time_growth(r, best, comm="comm-bound")
            cause = max(extra, key=lambda k: extra[k])
            # faster, or a tie: only the margin on its untimed launch put it below (slower beyond a tie: the cause)
            slow_untimed = slower < TIE_FRAC and untimed(r) and not untimed(best)
            if slow_untimed:
                cause = (f"its launch's step time is not modelled ({r[LAUNCH_UNTIMED]}); the search ranks it "
                         f"{UNTIMED_MARGIN:.0%} slower than modelled")
                extra[cause] = 0.0
            elif slower < TIE_FRAC:
                cause = f"a tie on time (under {TIE_FRAC:.1%}): ranked lower on headroom or simplicity"
                extra[cause] = 0.0
            tie = slower < TIE_FRAC and not slow_untimed
            verdict = ("not timed as launched" if slow_untimed else "bubble" if cause == "bubble"
                       else "ties" if tie else f"slower by {slower:.0%}")
            if tie:  # in the tie rule's own measure
                gap = tie_gap(launched_tps(r), launched_tps(best))
                head = f"{'slower' if slower >= 0 else 'faster'} by {tie_pct(gap)}"
            else:
                head = f"slower by {slower:.1%}" if slower >= 0 else f"faster by {-slower:.1%}"
            connector = "but " if slow_untimed else "" if tie else "mostly "
            line = (f"{head} ({tps:,.0f} vs {launched_tps(best, 'tokens_per_s_per_gpu'):,.0f} "
                    f"tokens/s/GPU{_as_launched(r, best)}), {connector}{cause}"
                    + (f": +{extra[cause]:.2f} s/step" if slower >= TIE_FRAC and not slow_untimed else ""))
        rows.append({"family": fam, "best_layout": r["layout_text"], "tokens_per_s_per_gpu": r["tokens_per_s_per_gpu"],
                     "tokens_per_s_per_gpu_launched": tps,
                     "mem_total_gib": r["mem_total_gib"], "rank": r.get("rank", np.nan),
                     "verdict": verdict, "line": line, **_layout_columns(r)})
    out = pd.DataFrame(rows)
    key = "rank" if out["rank"].notna().any() else "tokens_per_s_per_gpu"
    return out.sort_values(key, ascending=key == "rank", na_position="last", kind="stable").reset_index(drop=True)


def _as_launched(*rows: Any) -> str:
    """Where the launch changes the modelled speed of any of ``rows`` (candidates rows): that the figures are
    those of what runs, and for each such row what changes and its speed as planned; else nothing."""
    moved = [r for r in rows if launch_changes_speed(r)]
    if not moved:
        return ""
    whys = list(dict.fromkeys(str(r.get(LAUNCH_TPS_WHY)) for r in moved))
    planned = " and ".join(f"{r['tokens_per_s_per_gpu']:,.0f}" for r in moved)
    if len(whys) == 1:
        return f" as launched; {whys[0]}, {planned} as planned"
    return " as launched; " + "; ".join(f"{r.get(LAUNCH_TPS_WHY)} ({r['tokens_per_s_per_gpu']:,.0f} as planned)"
                                        for r in moved)


def shards_alike(a: Layout, b: Layout) -> bool:
    """``a`` is ``b`` but for how the data-parallel states are sharded (``sharding``, ``shard_group``): the same
    parallelism, recompute, offload and micro-batch."""
    return replace(a, sharding=b.sharding, shard_group=b.shard_group) == b


def shards_alike_mask(df: pd.DataFrame, b: Layout) -> np.ndarray:
    """:func:`shards_alike` of every row of ``df`` against ``b``, vectorised over the Layout columns as
    ``Layout.from_row`` reads them (a field without a column is its default; "True"/"False" strings are booleans):
    a study's 40k candidates in milliseconds instead of a Layout per row."""
    same = np.ones(len(df), dtype=bool)
    for f in fields(Layout):
        if f.name in ("sharding", "shard_group"):
            continue
        want = getattr(b, f.name)
        if f.name not in df:
            same &= f.default == want
            continue
        col = df[f.name]
        if isinstance(want, bool) and not pd.api.types.is_bool_dtype(col):
            col = col.map(lambda v: v.strip().lower() in ("true", "1") if isinstance(v, str) else bool(v))
        same &= (col == want).to_numpy(dtype=bool)
    return same


def runner_up_index(chosen: Layout, chosen_tps: float, others: list[tuple[Layout, float]]
                    ) -> tuple[int | None, list[int]]:
    """The runner-up strategy among ``others``, the best layout of each other family (best first, with its
    throughput): its position, and the positions passed over before it as equivalents of the chosen layout, a
    family whose best layout ties with it (within TIE_FRAC of ``chosen_tps``) and only shards the states
    differently (:func:`shards_alike`; HSDP's best against FSDP's at the same parallelism and micro-batch).
    Such a layout is no day-1 fallback: if the chosen one runs slow, so does it. When every other family is one,
    the best of them (and none passed over); ``(None, [])`` without others. The one rule page 1's runner-up
    (``report.memo.runner_up``) and the comparable-runs table (``prediction.production``) apply."""
    if not others:
        return None, []
    same = [shards_alike(lay, chosen) and tps >= (1.0 - TIE_FRAC) * chosen_tps for lay, tps in others]
    pick = next((i for i, s in enumerate(same) if not s), 0)
    return pick, [i for i in range(pick) if same[i]]


def runner_up_row(feas: pd.DataFrame) -> pd.Series | None:
    """The runner-up strategy of a study's feasible candidates (rank and Layout columns): the best layout of each
    family after the chosen one's, by rank, through :func:`runner_up_index` on the speeds of what the launch runs;
    None without another family. The rule page 1 (``report.memo.runner_up``, on families.csv), the comparable-runs
    table (``prediction.production``) and the preflight's switch (``launch.preflight``) apply."""
    if not len(feas):
        return None
    feas = feas.sort_values("rank", kind="stable") if "rank" in feas else feas
    best = feas.iloc[pd.Series(_family(feas)).drop_duplicates().index]  # each sharding × TP × PP's best, best first
    chosen = best.iloc[0]
    others = [(Layout.from_row(r), r) for _, r in best.iloc[1:].iterrows()]
    pick = runner_up_index(Layout.from_row(chosen), launched_tps(chosen),
                           [(lay, launched_tps(r)) for lay, r in others])[0]
    return None if pick is None else others[pick][1]


def group_infeasible(rows: list[dict[str, Any]], key: str = "line") -> list[dict[str, Any]]:
    """Family verdict rows (dicts, in order) with the families ruled out for one reason merged into one row: its
    ``family`` names them all and its ``key`` text keeps the simplest layout's degrees (24 GPUs, batch 256: DDP,
    ZeRO-1, ZeRO-2, FSDP and HSDP all fail as dp24). :func:`family_verdicts` writes such lines "layout: reason";
    other rows pass unchanged. What the memo's alternatives table and ``trainplan plan`` print."""
    out: list[dict[str, Any]] = []
    by_reason: dict[str, dict[str, Any]] = {}
    for r in rows:
        text = str(r.get(key) or "")
        if str(r.get("verdict")) != "infeasible" or ": " not in text:
            out.append(r)
            continue
        where, reason = text.split(": ", 1)
        if reason in by_reason:
            by_reason[reason]["family"] += f", {r['family']}"
            continue
        r = {**r, key: f"{where.split()[0]}: {reason}"}
        by_reason[reason] = r
        out.append(r)
    return out


def batch_alternative(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, eff: Efficiency | None,
                      options: dict[str, Any] | None, best_tps_per_gpu: float,
                      searcher: Any = None) -> dict[str, Any] | None:
    """When ``global_batch`` does not divide over the GPUs, every layout with dp = n_gpus is ruled out (24 GPUs,
    256 sequences: no pure data parallelism). The best layout at the nearest global batches that do divide (the
    multiples of n_gpus either side), if one is clearly faster (> TIE_FRAC) than ``best_tps_per_gpu``: {global_batch,
    other (the other multiple), layout, family, tokens_per_s_per_gpu, gain_frac}. None when the batch divides or
    nothing nearby is faster. Changing the batch is a training choice (learning rate, steps), not the planner's.
    ``searcher``: the study's search (``launch.artifacts.plan_search``, which rules out what the launch could not
    run or fit); default :func:`search`. Speeds are those of what the launch runs (:func:`launched_tps`), as the
    search ranks them: ``best_tps_per_gpu`` too."""
    searcher = searcher or search
    n, gb = cluster.n_gpus, training.global_batch
    if gb % n == 0 or not best_tps_per_gpu:
        return None
    found = []
    for b in nearest_multiples(gb, n):
        d = searcher(model, cluster, replace(training, global_batch=b), eff, options)
        r = best_row(d[d["feasible"]])
        if r is not None:
            tps = launched_tps(r, "tokens_per_s_per_gpu")
            found.append({"global_batch": int(b), "layout": str(r["layout_text"]), "family": str(r["family"]),
                          "tokens_per_s_per_gpu": tps, "gain_frac": tps / best_tps_per_gpu - 1.0})
    if not found:
        return None
    top = max(found, key=lambda x: (x["gain_frac"], -abs(x["global_batch"] - gb)))
    if top["gain_frac"] <= TIE_FRAC:
        return None
    others = [x["global_batch"] for x in found if x is not top and x["gain_frac"] > TIE_FRAC]
    return top | {"other": others[0] if others else None, "configured": int(gb)}


def best_row(feas: pd.DataFrame) -> pd.Series | None:
    """The best row of a set of feasible layouts: the lowest rank (search's tie-aware order), or, in a frame
    without ranks, the fastest, then the most headroom, then the simplest (the order tie_order starts from)."""
    if not len(feas):
        return None
    if "rank" in feas and (feas["rank"] > 0).all():
        return feas.loc[feas["rank"].idxmin()]
    if "tokens_per_s" in feas:
        feas = feas.assign(_speed=rank_tps(feas))
    keys = [k for k in ("_speed", "headroom_frac", "complexity") if k in feas]
    return feas.sort_values(keys, ascending=[k == "complexity" for k in keys], kind="stable").iloc[0].drop(
        "_speed", errors="ignore")


TIE_FRAC = 0.005  # |Δ throughput| below this is a tie (the ranking then falls to headroom and simplicity)
HEADROOM_TIE = 0.01  # headroom differences below 1% of HBM (~0.8 GiB on an H100) are a tie too


def step_time_growth(r: pd.Series, o: pd.Series, comm: str = "exposed comm") -> dict[str, float]:
    """Seconds per step by which each term of layout ``r`` exceeds layout ``o``'s: bubble, exposed communication,
    optimizer/offload, and compute split into its named parts (timing.COMPUTE_PARTS) and the rest: the layout's
    GEMMs, attention and elementwise kernels (smaller or more of them: TP/CP splits, micro-batch size)."""
    parts = {name: float(np.nan_to_num(r.get(k, 0.0)) - np.nan_to_num(o.get(k, 0.0)))
             for k, name in timing.COMPUTE_PARTS.items()}
    kernels = r["compute_s"] - o["compute_s"] - sum(parts.values())
    out = {"bubble": r["bubble_s"] - o["bubble_s"], comm: r["comm_exposed_s"] - o["comm_exposed_s"],
           "compute (GEMMs, attention, elementwise kernels)": kernels, **parts,
           "optimizer/offload": r["optimizer_s"] + r["offload_s"] - o["optimizer_s"] - o["offload_s"]}
    if launch_changes_speed(r) or launch_changes_speed(o):  # what the launch runs instead (torchtitan's bf16 for an FP8 plan): its own term
        def launch_s(x: Any) -> float:
            return float(x["step_time_s"]) * (1.0 / _ratio(x) - 1.0)

        out["what the launch runs instead of the plan"] = launch_s(r) - launch_s(o)
    return out


def _extra_cause(r: pd.Series, o: pd.Series) -> str:
    """The step-time term that grows most from layout ``o`` to layout ``r``."""
    extra = step_time_growth(r, o)
    return max(extra, key=lambda k: extra[k])


# The FP8 day-1 loss check (launch.ingest.check_loss_parity, the sbatch's day1-loss-parity mode): FP8_LOSS_STEPS
# steps of the FP8 run and of a bf16 run from the same weights and data; the mean loss of the last quarter of the steps
# within FP8_LOSS_MAX_REL of bf16's. A window's mean, not one step's loss: one batch moves the loss by more than 1%.
FP8_LOSS_STEPS = 200
FP8_LOSS_MAX_REL = 0.01
FP8_RISK = ("risk for a fine-tune: loss divergence from the bf16 run (FP8's 3-bit mantissa on small updates); "
            f"day-1 check: {FP8_LOSS_STEPS} steps in FP8 and in bf16 from the same weights and data, the mean loss of "
            f"the last {FP8_LOSS_STEPS // 4} within {FP8_LOSS_MAX_REL:.0%} of bf16's")


def fp8_technique_rows(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout,
                       eff: Efficiency) -> list[dict[str, Any]]:
    """The FP8 rows of the technique table for the chosen layout: each recipe (torchao's; tensorwise under
    ``kernels=fused`` is Transformer Engine's delayed scaling) against bf16 on the same layout (speed-up; memory
    unchanged: the bf16 mixed-precision states stay and the FP8 copies are made per GEMM), with the
    risk for a fine-tune. Empty on GPUs without FP8 tensor cores. The recommendation stays on the configured
    precision: FP8 is used only when ``training.precision`` opts in."""
    if not cluster.gpu.fp8:
        return []
    base = replace(training, precision="bf16")
    b = timing.step_time(model, cluster, base, layout, eff)["tokens_per_s_per_gpu"]
    mem = float(memory.memory_breakdown(model, cluster, base, layout, eff)["total"]) / 2**30
    eager = training.kernels == "eager"  # torchao's casts unfused (timing.FP8_CAST_BYTES_EAGER): say what compile gives
    compiled = replace(base, kernels="compiled")
    b_compiled = timing.step_time(model, cluster, compiled, layout, eff)["tokens_per_s_per_gpu"] if eager else None
    rows = []
    for recipe in ("fp8-tensorwise", "fp8-rowwise"):
        t = replace(training, precision=recipe)
        f = timing.step_time(model, cluster, t, layout, eff)["tokens_per_s_per_gpu"]
        delta = f / b - 1.0
        verdict = f"buys {delta:+.1%}" if delta > TIE_FRAC else ("ties" if delta >= -TIE_FRAC else f"costs {-delta:.1%}")
        used = training.precision == recipe
        note = ("opted in by training.precision; " if used else "not used: bf16 unless the study opts in; ") + FP8_RISK
        compiled_note = ""
        if eager:
            fc = timing.step_time(model, cluster, replace(compiled, precision=recipe), layout,
                                  eff)["tokens_per_s_per_gpu"]
            compiled_note = (f"eager: torchao's casts run unfused; under torch.compile (training.kernels: compiled) "
                             f"{fc:,.0f} vs {b_compiled:,.0f} tokens/s/GPU for compiled bf16 "
                             f"({fc / b_compiled - 1.0:+.1%})")
            note = compiled_note + "; " + note
        stack = "Transformer Engine" if timing.te_fp8(t) else "torchao Float8"
        rows.append({"technique": f"FP8 matmuls ({recipe.split('-')[1]}, {stack})", "used_by_best": used,
                     "best_with": layout.describe() + f" {recipe}", "tokens_per_s_per_gpu_with": f,
                     "best_without": layout.describe() + " bf16", "tokens_per_s_per_gpu_without": b,
                     "delta_frac": delta, "verdict": verdict, "note": note,
                     "line": f"{verdict} ({f:,.0f} vs {b:,.0f} tokens/s/GPU, memory {mem:.1f} GiB either way); {note}",
                     "mem_total_gib": mem, "fp8": True, "compiled_note": compiled_note, "risk": FP8_RISK})
    return rows


def impossible_techniques(cluster: ClusterSpec, training: TrainingSpec,
                          options: dict[str, Any] | None = None) -> dict[str, str]:
    """Techniques the search's options allow that no layout of this study can use, with why (structural): async TP
    under eager kernels. ``search`` leaves their layouts out (22,680 of the default study's 54,288 candidates were
    such rows, every one infeasible); ``technique_verdicts(impossible=...)`` still gives the technique its row."""
    o = _opts(cluster, options)
    if training.kernels == "eager" and True in o["tp_overlap"] and any(t > 1 for t in o["tp"]):
        return {ASYNC_TP_TECHNIQUE: ASYNC_TP_NEEDS}
    return {}


def technique_verdicts(df: pd.DataFrame, extra: list[dict[str, Any]] | None = None,
                       impossible: dict[str, str] | None = None) -> pd.DataFrame:
    """One row per technique (SP, CP, offload, recompute, ...): best feasible layout with it vs without it.

    Families are coarse (data-parallel sharding × TP × PP); this says what each modifier buys or costs.
    Columns: technique, used_by_best, best_with, tokens_per_s_per_gpu_with, best_without,
    tokens_per_s_per_gpu_without, delta_frac (with ÷ without − 1), verdict (needed / buys x% / ties / costs x% /
    never fits: every layout with it runs out of memory / not possible here: a structural reason), note (why, in
    a few words), line (one sentence), compiled_note (FP8 rows of an eager study: what torch.compile would give),
    risk (FP8 rows: the risk for a fine-tune and its day-1 check). ``impossible`` (impossible_techniques): techniques
    the search did not enumerate, and why no layout can use them ("not possible here"). Other techniques no
    enumerated layout uses are left out.
    """
    feas = df[df["feasible"]]
    top = feas.loc[[best_row(feas).name]] if len(feas) else feas
    rows = []
    for name, sel in TECHNIQUES.items():
        with_t = df[sel(df)]
        if len(with_t) == 0 and name in (impossible or {}) and len(feas):
            o = best_row(feas)
            rows.append({"technique": name, "used_by_best": False, "best_with": "",
                         "tokens_per_s_per_gpu_with": np.nan, "best_without": o["layout_text"],
                         "tokens_per_s_per_gpu_without": launched_tps(o, "tokens_per_s_per_gpu"), "delta_frac": np.nan,
                         "verdict": "not possible here", "note": impossible[name],
                         "line": "no layout of this study can use it: " + impossible[name]})
            continue
        if len(with_t) == 0:
            continue
        wf, without = with_t[with_t["feasible"]], feas[~sel(feas)]
        for need in TECHNIQUE_NEEDS.get(name, ()):  # against the layouts that could use it: SP among TP layouts
            col = NEEDS_DEGREE[need]
            could = without[np.asarray(without[col]) > 1] if col in without else without
            without = could if len(could) else without  # none without it has TP: against the best overall
        used = bool(sel(top).iloc[0]) if len(top) else False
        r, o = best_row(wf), best_row(without)
        gpu = "tokens_per_s_per_gpu"
        row = {"technique": name, "used_by_best": used,  # figures at the speed of what the launch runs
               "best_with": r["layout_text"] if r is not None else "",
               "tokens_per_s_per_gpu_with": launched_tps(r, gpu) if r is not None else np.nan,
               "best_without": o["layout_text"] if o is not None else "",
               "tokens_per_s_per_gpu_without": launched_tps(o, gpu) if o is not None else np.nan,
               "delta_frac": launched_tps(r) / launched_tps(o) - 1.0 if r is not None and o is not None else np.nan}
        delta = row["delta_frac"]
        launched = _as_launched(*(x for x in (r, o) if x is not None))
        also, instead = ((_also_uses(df, r.name, o.name, name), _also_uses(df, o.name, r.name, name))
                         if r is not None and o is not None else ([], []))
        also_text = "; ".join(([f"that layout also uses {', '.join(also)}"] if also else [])
                              + ([f"the best without it uses {', '.join(instead)}"] if instead else []))
        also_text = f" ({also_text})" if also_text else ""
        if r is None:
            # the commonest reason among the layouts that use it, not counting another technique's prerequisite
            # (async TP's kernels: half the enumerated TP layouts of an eager study carry it)
            reasons = with_t["reason"].astype(str)
            own = reasons[reasons != ASYNC_TP_NEEDS] if name != ASYNC_TP_TECHNIQUE else reasons
            why = str((own if len(own) else reasons).value_counts().index[0])
            renamed = with_t[reasons.str.startswith(LAUNCH_AS)]
            plain = renamed["reason"].astype(str)  # one change (this technique's), onto a layout that fits
            plain = renamed[~plain.str.contains("; ", regex=False) & ~plain.str.contains(LAUNCH_AS_MISFIT, regex=False)]
            renamed = plain if len(plain) else renamed
            if len(renamed):  # the launch replaces it (TP without SP, full recompute for selective): say so, on
                # the fastest such layout, not the commonest reason (a LoRA study's many PP rows, which cannot run)
                fast = renamed.loc[renamed["tokens_per_s"].astype(float).idxmax()]
                why = f"{fast['layout_text']} is {fast['reason']}"
            memory_bound = why.startswith(("OOM", "host RAM"))
            row["verdict"], row["note"] = ("never fits" if memory_bound else "not possible here"), why
            row["line"] = ("every layout using it runs out of memory: " if memory_bound else
                           "no layout of this study can use it: ") + why
        elif o is None:
            row["verdict"], row["note"] = "needed", "no feasible layout without it"
            row["line"] = "needed: no feasible layout without it"
        elif delta > TIE_FRAC:
            row["verdict"] = f"buys {delta:+.1%}"
            row["note"] = (f"cuts {_extra_cause(o, r)}{also_text}" + ("; the chosen layout uses it" if used else "")
                           + (f"; its launch's step time is not modelled ({r[LAUNCH_UNTIMED]}): ranked "
                              f"{UNTIMED_MARGIN:.0%} slower" if untimed(r) and not used else ""))
            row["line"] = (f"buys {delta:+.1%} ({row[gpu + '_with']:,.0f} vs {row[gpu + '_without']:,.0f} "
                           f"tokens/s/GPU{launched}): {row['note']}")
        elif delta >= -TIE_FRAC:
            row["verdict"] = "ties"
            row["note"] = "the chosen layout uses it" if used else "not worth the extra complexity"
            row["line"] = f"ties ({delta:+.1%}): best with it {row[gpu + '_with']:,.0f} tokens/s/GPU{launched}; {row['note']}"
        else:
            row["verdict"], row["note"] = f"costs {-delta:.1%}", f"mostly {_extra_cause(r, o)}{also_text}"
            row["line"] = (f"costs {-delta:.1%} at best ({row[gpu + '_with']:,.0f} vs "
                           f"{row[gpu + '_without']:,.0f} tokens/s/GPU{launched}), {row['note']}")
        rows.append(row)
    return pd.DataFrame(rows + list(extra or []),
                        columns=["technique", "used_by_best", "best_with", "tokens_per_s_per_gpu_with",
                                 "best_without", "tokens_per_s_per_gpu_without", "delta_frac", "verdict",
                                 "note", "line", "compiled_note", "risk"])
