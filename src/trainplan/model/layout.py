"""How the job is laid out: :class:`Layout` (one layout) and :class:`LayoutTable` (many, vectorised), and the
cross-spec checks (:func:`layout_problems` returns reasons; :func:`check_layout` raises)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from trainplan.model.arch import ModelSpec, torchtitan_problems
from trainplan.model.base import ConfigError, one_of, positive_int
from trainplan.model.hardware import GPUS, ClusterSpec
from trainplan.model.training import TrainingSpec

# -------------------------------------------------------------------------------------------- layout
SHARDINGS = ("none", "zero1", "zero2", "zero3", "hsdp")
RECOMPUTES = ("none", "selective", "full")
OFFLOADS = ("none", "cpu")
PP_SCHEDULES = ("1f1b", "interleaved")
CP_KINDS = ("ring", "ulysses")
TP_OVERLAPS = (False, True)


@dataclass(frozen=True, kw_only=True)
class Layout:
    """How the job is split. ``dp·tp·pp·cp`` = GPU count; ``sharding`` applies over the dp (×cp) group.

    ``sharding='zero3'`` is FSDP full shard; ``'hsdp'`` shards inside groups of ``shard_group`` ranks and
    replicates across them. ``micro_batch`` is sequences per rank per forward; gradient accumulation is
    derived from the global batch (:func:`grad_accum`).
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    sp: bool = False  # sequence parallelism with TP (Korthikanti 2022)
    pp_schedule: str = "1f1b"
    vpp: int = 1  # virtual stages per rank for the interleaved schedule
    cp_kind: str = "ring"
    # TP communication overlapped with the neighbouring GEMMs: torchtitan async TP (SymmetricMemory, needs
    # torch.compile) or Megatron --tp-comm-overlap (Transformer Engine userbuffers); only with tp > 1.
    tp_overlap: bool = False
    sharding: str = "zero3"
    shard_group: int | None = None  # hsdp only: ranks per shard group (default: GPUs per node)
    recompute: str = "none"
    offload: str = "none"
    micro_batch: int = 1

    def __post_init__(self) -> None:
        positive_int(self, "dp", "tp", "pp", "cp", "vpp", "micro_batch")
        one_of(self, "pp_schedule", PP_SCHEDULES)
        one_of(self, "cp_kind", CP_KINDS)
        one_of(self, "sharding", SHARDINGS)
        one_of(self, "recompute", RECOMPUTES)
        one_of(self, "offload", OFFLOADS)
        if self.shard_group is not None:
            positive_int(self, "shard_group")
        if self.pp_schedule == "1f1b" and self.vpp != 1:
            raise ConfigError("vpp", self.vpp, "must be 1 unless pp_schedule='interleaved'")
        if self.sp and self.tp == 1:
            raise ConfigError("sp", self.sp, "sequence parallelism needs tp > 1")
        if not isinstance(self.tp_overlap, bool):
            raise ConfigError("tp_overlap", self.tp_overlap, "must be true or false")
        if self.tp_overlap and self.tp == 1:
            raise ConfigError("tp_overlap", self.tp_overlap, "TP communication overlap needs tp > 1")

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def family(self) -> str:
        """The strategy family: data-parallel sharding × TP × PP (SP, CP, offload, recompute are modifiers)."""
        if self.world_size == 1 and self.sharding == "none":
            return "one GPU"  # nothing to replicate: calling it DDP would promise a collective that never runs
        names = {"none": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "FSDP", "hsdp": "HSDP"}
        return "×".join([names[self.sharding]] + ["TP"] * (self.tp > 1) + ["PP"] * (self.pp > 1))

    def describe(self, *, compact: bool = False) -> str:
        """``dp32·tp1·pp1·cp1 zero2 rc=none mb=1``; ``compact``: only the degrees above 1 (figure labels)."""
        degs = [f"dp{self.dp}", f"tp{self.tp}{'(sp)' if self.sp else ''}",
                f"pp{self.pp}" + (f"({self.pp_schedule}{'' if self.vpp == 1 else f',v{self.vpp}'})" if self.pp > 1
                                  else ""),
                f"cp{self.cp}" + (f"({self.cp_kind})" if self.cp > 1 else "")]
        if compact:
            degs = [d for d, n in zip(degs, (self.dp, self.tp, self.pp, self.cp), strict=True) if n > 1]
        s = "·".join(degs)
        s += " async-tp" * bool(self.tp_overlap)
        s = f"{s} {self.sharding}".lstrip()
        if self.sharding == "hsdp" and self.shard_group is not None:  # None: the default group, not yet resolved
            s += f"/{self.shard_group}"
        return s + f" rc={self.recompute} mb={self.micro_batch}" + (" offload" if self.offload != "none" else "")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_row(cls, row: Any) -> Layout:
        """The Layout of one table row (a pandas Series or a dict, e.g. a candidates.csv row): the Layout fields it
        has, numpy scalars as Python values, "True"/"False" strings as booleans, an empty / NaN / 0 shard_group as
        None. The one row → Layout mapping (search, stages, extrapolate and calibrate_gpu use it)."""
        d: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in row:
                continue
            v = row[f.name]
            v = v.item() if hasattr(v, "item") else v
            if f.name == "shard_group":
                v = None if v is None or v != v or v == 0 or v == "" else int(v)
            elif f.type in ("bool", bool) and isinstance(v, str):
                v = v.strip().lower() in ("true", "1")
            elif f.type in ("int", int) and isinstance(v, float) and v.is_integer():
                v = int(v)
            d[f.name] = v
        return cls.from_dict(d)

    @classmethod
    def from_dict(cls, d: dict) -> Layout:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError("layout." + unknown[0], d[unknown[0]], "unknown key; valid: " + ", ".join(sorted(known)))
        return cls(**d)


class LayoutTable:
    """Many layouts at once: the same attribute names as :class:`Layout`, each a numpy array.

    The analytic term functions are written with numpy broadcasting (``np.where(L.sharding == "zero3",
    ...)``), so they accept either one ``Layout`` (scalars) or a ``LayoutTable`` (arrays) unchanged.
    ``shard_group`` is always an int array here (0 = default: GPUs per node).
    """

    FIELDS = tuple(f.name for f in fields(Layout))

    def __init__(self, **cols: Any):

        n = {len(v) for v in cols.values()}
        if len(n) != 1:
            raise ValueError(f"LayoutTable columns differ in length: {n}")
        missing = set(self.FIELDS) - set(cols)
        if missing:
            raise ValueError(f"LayoutTable needs columns {sorted(missing)}")
        for k in self.FIELDS:
            v = cols[k]
            if k == "shard_group":
                v = [0 if x is None or x != x else int(x) for x in v]
            setattr(self, k, np.asarray(v))

    def __len__(self) -> int:
        return len(self.dp)

    @classmethod
    def from_layouts(cls, layouts: list[Layout]) -> LayoutTable:
        return cls(**{k: [getattr(x, k) for x in layouts] for k in cls.FIELDS})

    @classmethod
    def from_frame(cls, df: Any) -> LayoutTable:
        return cls(**{k: df[k].to_numpy() for k in cls.FIELDS})

    def row(self, i: int) -> Layout:
        d = {k: getattr(self, k)[i] for k in self.FIELDS}
        d = {k: v.item() if hasattr(v, "item") else v for k, v in d.items()}  # numpy scalar → Python
        d["shard_group"] = d["shard_group"] or None
        return Layout(**d)

    @property
    def world_size(self) -> Any:
        return self.dp * self.tp * self.pp * self.cp


def shard_degree(layout: Layout | LayoutTable, cluster: ClusterSpec | None = None) -> Any:
    """Ranks over which sharded state is split (FSDP2/HSDP shard over dp×cp, as torchtitan does).

    Works on one Layout (returns int) or a LayoutTable (returns an int array).
    """

    replicas = layout.dp * layout.cp
    default_group = cluster.gpus_per_node if cluster else replicas
    g = np.asarray(0 if layout.shard_group is None else layout.shard_group)
    g = np.where(g == 0, default_group, g)  # 0 / None: the default group, one node
    out = np.where(layout.sharding == "none", 1, np.where(layout.sharding == "hsdp", np.minimum(g, replicas), replicas))
    return out.item() if np.ndim(out) == 0 else out


def one_rank_duplicate(replicas: Any, sharding: Any, offload: Any) -> Any:
    """True where a layout repeats another: ZeRO-1/2 over one data-parallel rank (dp·cp = ``replicas`` = 1) shard
    nothing, the unsharded layout; with CPU offload ZeRO-1 is ZeRO-2 (ZeRO-Offload on one GPU, which is real and
    kept). Scalars or arrays: what the search leaves out and estimate's memory fix skips."""
    alone = np.asarray(replicas) == 1
    sharding, offload = np.asarray(sharding), np.asarray(offload)
    out = alone & (((sharding == "zero1") | (sharding == "zero2")) & (offload == "none")
                   | (sharding == "zero1") & (offload == "cpu"))
    return out.item() if np.ndim(out) == 0 else out


def nearest_multiples(global_batch: int, m: int) -> list[int]:
    """The multiples of ``m`` nearest ``global_batch`` on either side (one when the batch is below ``m``); for a
    batch that is a multiple, it and the next."""
    lo, hi = global_batch // m * m, (global_batch // m + 1) * m
    return [lo, hi] if lo > 0 else [hi]


def batch_multiples(global_batch: int, m: int) -> str:
    """:func:`nearest_multiples` as an error names them: "240, 264"."""
    return ", ".join(map(str, nearest_multiples(global_batch, m)))


def grad_accum(training: TrainingSpec, layout: Layout | LayoutTable) -> Any:
    """Micro-batches per rank per optimizer step (the global batch is split over dp only)."""

    out = np.maximum(1, (training.global_batch // layout.dp) // layout.micro_batch)
    return out.item() if np.ndim(out) == 0 else out


def torchtitan_launch(model: ModelSpec, training: TrainingSpec, layout: Layout | LayoutTable) -> Any:
    """Whether the generated launch runs this layout on torchtitan (else Accelerate + Transformers), per layout:
    torchtitan where it needs what Accelerate 1.x cannot run (TP, PP, CP, async TP) or what the launch gets from
    torchtitan (compiled kernels, FP8 rowwise), and torchtitan can build the model and fine-tune; FP8 tensorwise with
    none of TP/PP/CP goes to Accelerate (torchtitan 0.3's float8 converter is rowwise only). The one statement of the
    choice: ``launch.trainers.choose_trainer`` gives its reasons, ``memory.hf_norms`` sizes the norms it implies."""
    L = layout
    structural = ((np.asarray(L.tp) > 1) | (np.asarray(L.pp) > 1) | (np.asarray(L.cp) > 1)
                  | np.asarray(L.tp_overlap, dtype=bool))
    if torchtitan_problems(model, training.finetune):
        return np.zeros_like(structural, dtype=bool)
    if training.fp8 == "tensorwise":
        return structural
    return structural | (training.kernels == "compiled") | (training.fp8 == "rowwise")


def layout_problems(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout) -> list[str]:
    """Why this layout cannot run (empty list = structurally valid). Memory is checked elsewhere."""
    return [msg for _, _, msg in _problems(model, cluster, training, layout)]


def _problems(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
              L: Layout) -> list[tuple[str, Any, str]]:
    """(config key, its value, why) for each structural problem of layout ``L``: check_layout names the key."""
    why: list[tuple[str, Any, str]] = []
    if L.world_size != cluster.n_gpus:
        why.append(("layout", L.describe(), f"dp·tp·pp·cp = {L.dp}·{L.tp}·{L.pp}·{L.cp} = {L.world_size}, but the "
                                            f"cluster has {cluster.n_gpus} GPUs"))
    if model.heads % L.tp:
        why.append(("layout.tp", L.tp, f"tp={L.tp} does not divide heads={model.heads}"))
    elif model.kv_heads % L.tp and L.tp % model.kv_heads:
        why.append(("layout.tp", L.tp, f"tp={L.tp} and kv_heads={model.kv_heads}: neither divides the other"))
    if model.ffn_hidden % L.tp:
        why.append(("layout.tp", L.tp, f"tp={L.tp} does not divide ffn_hidden={model.ffn_hidden}"))
    if L.tp > cluster.gpus_per_node:
        why.append(("layout.tp", L.tp, f"tp={L.tp} spans nodes (gpus_per_node={cluster.gpus_per_node}); TP must "
                                       "stay in NVLink"))
    if L.pp * L.vpp > model.layers:  # uneven stages are valid (Llama 3 405B: 126 layers on PP16, Dubey 2024 §3.3.2)
        why.append(("layout.vpp" if L.vpp > 1 else "layout.pp", L.vpp if L.vpp > 1 else L.pp,
                    f"pp·v = {L.pp}·{L.vpp} exceeds layers={model.layers}: a virtual stage without a layer"))
    if training.global_batch % (L.dp * L.micro_batch):
        near = batch_multiples(training.global_batch, L.dp * L.micro_batch)
        why.append(("layout.micro_batch", L.micro_batch, f"global_batch={training.global_batch} is not a multiple "
                                                         f"of dp·micro_batch = {L.dp}·{L.micro_batch} (the nearest "
                                                         f"that are: {near})"))
    elif L.pp > 1 and grad_accum(training, L) < L.pp:
        why.append(("layout.micro_batch", L.micro_batch, f"{grad_accum(training, L)} micro-batches per step < "
                                                         f"pp={L.pp} stages (bubble dominates)"))
    ring = L.cp_kind == "ring" and L.cp > 1
    if training.seq_len % (L.cp * (2 if ring else 1)):
        why.append(("layout.cp", L.cp, f"seq_len={training.seq_len} not divisible by 2·cp={2 * L.cp} (ring load "
                                       "balancing)" if ring else
                    f"seq_len={training.seq_len} not divisible by cp={L.cp} (each rank holds seq_len/cp tokens)"))
    if L.cp > 1 and L.cp_kind == "ulysses" and model.heads % (L.cp * L.tp):
        why.append(("layout.cp", L.cp, f"ulysses cp·tp = {L.cp * L.tp} does not divide heads={model.heads}"))
    if L.sp and training.seq_len % L.tp:
        why.append(("layout.sp", L.sp, f"seq_len={training.seq_len} not divisible by tp={L.tp} (sequence "
                                       "parallelism)"))
    if L.tp_overlap and training.kernels == "eager":
        why.append(("layout.tp_overlap", L.tp_overlap,
                    "TP comm overlap needs kernels=compiled (torchtitan async TP) or fused (Megatron/TE)"))
    if L.sharding == "hsdp":
        # the default group is shard_degree's: one node's GPUs, capped at dp·cp; g == dp·cp is one shard group
        # and no replica: FSDP itself (a one-node HSDP run), so it is valid
        g = L.shard_group or shard_degree(L, cluster)
        if (L.dp * L.cp) % g:
            why.append(("layout.shard_group", g, f"hsdp shard_group={g}"
                        + ("" if L.shard_group else " (default: gpus_per_node)") + f" must divide dp·cp={L.dp * L.cp}"))
    if L.offload == "cpu" and L.sharding in ("none",):
        why.append(("layout.offload", L.offload, "optimizer offload needs a ZeRO/FSDP sharding"))
    return why


def check_precision(cluster: ClusterSpec, training: TrainingSpec) -> None:
    """A plan is timed at the BF16 (or FP8) tensor-core rate: refuse fp32. FP8 GEMMs need FP8 tensor cores: refuse an
    fp8-* precision on a GPU without them (A100). cuDNN attention's
    rate was measured on Hopper (H100/H200) only: refuse ``attn_kernel: cudnn`` on another generation."""
    if training.precision == "fp32":
        raise ConfigError("training.precision", training.precision,
                          f"bf16, fp8-tensorwise or fp8-rowwise for a plan on {cluster.gpu.name}: fp32 GEMMs (FP32 or "
                          "TF32 rates) are not modelled, so an fp32 plan would be timed at the BF16 peak (fp32 is the "
                          "CPU proxies' dtype: proxies.dtype)")
    if training.attn_kernel != "fa2" and cluster.gpu.generation != "h100":
        raise ConfigError("training.attn_kernel", training.attn_kernel,
                          f"use fa2 on {cluster.gpu.name}: the cuDNN attention rate was measured on Hopper (H100/H200) only")
    if training.attn_kernel != "fa2" and training.attn_impl != "flash":
        raise ConfigError("training.attn_kernel", training.attn_kernel,
                          f"use fa2 (the default) with attn_impl {training.attn_impl}: a flash kernel needs attn_impl: flash")
    if training.fp8 and not cluster.gpu.fp8:
        fp8_gpus = ", ".join(n for n, g in GPUS.items() if g.fp8)
        raise ConfigError("training.precision", training.precision,
                          f"{cluster.gpu.name} has no FP8 tensor cores; use bf16, or a GPU with them ({fp8_gpus})")


def check_lora_targets(model: ModelSpec, training: TrainingSpec, key: str = "training.lora_targets") -> None:
    """LoRA/QLoRA must train something: ``gate`` alone on a GELU MLP (no gate projection; flops.adapter_params skips
    it) would plan a fine-tune of zero adapter parameters."""
    if training.finetune == "full" or model.mlp == "swiglu":
        return
    if not [t for t in training.lora_targets if t != "gate"]:
        raise ConfigError(key, ",".join(training.lora_targets),
                          f"{model.name}'s {model.mlp} MLP has no gate projection, so no adapter would train; "
                          "target q, k, v, o, up (fc1) or down (fc2)")


def check_layout(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout) -> None:
    """Raise ConfigError naming the offending key if the layout is structurally impossible."""
    check_precision(cluster, training)
    why = _problems(model, cluster, training, layout)
    if why:
        key, value, _ = why[0]
        raise ConfigError(key, value, "; ".join(msg for _, _, msg in why))
