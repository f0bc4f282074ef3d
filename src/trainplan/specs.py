"""The concepts of a training plan, one frozen dataclass each.

Every spec checks its own invariants at construction and raises :class:`ConfigError`, which names the
key, the value and what would be valid. Cross-spec checks (does this layout fit this model on this
cluster?) live in :func:`layout_problems`, which returns reasons rather than raising, so that the
search can keep infeasible layouts as rows with a reason.

Units: SI inside (bytes, FLOP/s, bytes/s, seconds); names carry the unit (``hbm_bytes``, ``busbw_Bps``).
This module imports neither torch nor snakemake.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

GiB = 1024**3
GB = 1000**3


class ConfigError(ValueError):
    """Bad input: names the key, the value and what is valid."""

    def __init__(self, key: str, value: Any, valid: str):
        self.key, self.value, self.valid = key, value, valid
        super().__init__(f"{key}={value!r}: {valid}")


def _positive_int(obj: object, *names: str) -> None:
    for name in names:
        v = getattr(obj, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(name, v, "must be a positive integer")


def _positive_num(obj: object, *names: str) -> None:
    for name in names:
        v = getattr(obj, name)
        if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
            raise ConfigError(name, v, "must be a positive number")


def _one_of(obj: object, name: str, allowed: tuple) -> None:
    v = getattr(obj, name)
    if v not in allowed:
        raise ConfigError(name, v, "must be one of " + ", ".join(map(str, allowed)))


# --------------------------------------------------------------------------------------------- model
MLP_KINDS = ("swiglu", "gelu")
NORM_KINDS = ("rmsnorm", "layernorm")
POS_KINDS = ("rope", "learned")
BIAS_KINDS = ("none", "qkv", "all")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer. ``mlp='swiglu'`` is Llama/Mistral/Qwen2; ``'gelu'`` is GPT/NeoX/MPT."""

    name: str = "custom"
    layers: int
    hidden: int
    heads: int
    kv_heads: int | None = None  # None → heads (multi-head attention)
    ffn_hidden: int | None = None  # None → 4·hidden (gelu) or Llama's rounding of 8/3·hidden (swiglu)
    vocab: int
    mlp: str = "swiglu"
    tied_embeddings: bool = False
    norm: str = "rmsnorm"
    pos_embedding: str = "rope"
    bias: str = "none"
    max_seq_len: int = 4096

    def __post_init__(self) -> None:
        _positive_int(self, "layers", "hidden", "heads", "vocab", "max_seq_len")
        _one_of(self, "mlp", MLP_KINDS)
        _one_of(self, "norm", NORM_KINDS)
        _one_of(self, "pos_embedding", POS_KINDS)
        _one_of(self, "bias", BIAS_KINDS)
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.ffn_hidden is None:
            if self.mlp == "gelu":
                ffn = 4 * self.hidden
            else:  # Llama: 2/3 of 4h, rounded up to a multiple of 256
                ffn = 256 * -(-int(8 * self.hidden / 3) // 256)
            object.__setattr__(self, "ffn_hidden", ffn)
        _positive_int(self, "kv_heads", "ffn_hidden")
        if self.hidden % self.heads:
            raise ConfigError("hidden", self.hidden, f"must be divisible by heads={self.heads}")
        if self.heads % self.kv_heads:
            raise ConfigError("kv_heads", self.kv_heads, f"must divide heads={self.heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    # Parameter counts: exact, checked against the proxy model's nn.Module in tests.
    @property
    def n_params_per_layer(self) -> int:
        h, f, kv = self.hidden, self.ffn_hidden, self.kv_dim
        attn = h * h + 2 * h * kv + h * h  # q, k, v, o
        mlp = (3 if self.mlp == "swiglu" else 2) * h * f
        norms = 2 * h * (2 if self.norm == "layernorm" else 1)
        if self.bias == "qkv":
            attn += h + 2 * kv
        elif self.bias == "all":
            attn += h + 2 * kv + h
            mlp += (2 if self.mlp == "swiglu" else 1) * f + h
        return attn + mlp + norms

    @property
    def n_params_embedding(self) -> int:
        """Input embedding (+ learned positions) and, if untied, the output projection."""
        emb = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        if self.pos_embedding == "learned":
            emb += self.max_seq_len * self.hidden
        return emb

    @property
    def n_params_final_norm(self) -> int:
        return self.hidden * (2 if self.norm == "layernorm" else 1)

    @property
    def n_params(self) -> int:
        return self.layers * self.n_params_per_layer + self.n_params_embedding + self.n_params_final_norm

    @property
    def n_params_nonembedding(self) -> int:
        return self.n_params - self.n_params_embedding

    def with_layers(self, layers: int) -> ModelSpec:
        """The depth slice: same widths, fewer (or more) layers."""
        return replace(self, layers=layers, name=f"{self.name}-L{layers}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelSpec:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError("model." + unknown[0], d[unknown[0]], "unknown key; valid: " + ", ".join(sorted(known)))
        try:
            return cls(**d)
        except TypeError as e:  # a missing required field
            missing = [f.name for f in fields(cls) if f.name not in d and f.default is f.default_factory]
            raise ConfigError("model." + (missing[0] if missing else "?"), None, f"required ({e})") from None


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int, seq: int,
           tied: bool = False) -> ModelSpec:
    return ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv, ffn_hidden=ffn,
                     vocab=vocab, mlp="swiglu", tied_embeddings=tied, max_seq_len=seq)


# Sources: the models' Hugging Face config.json files (meta-llama/*); debug presets are ours.
MODEL_PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
        _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
        _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
        _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
        _llama("llama3.1-8b", 32, 4096, 32, 8, 14336, 128256, 131072),
        _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
        _llama("llama3.1-70b", 80, 8192, 64, 8, 28672, 128256, 131072),
        _llama("llama3.1-405b", 126, 16384, 128, 8, 53248, 128256, 131072),
        # Tiny models that run end to end on a CPU in CI (torchtitan's debugmodel idea).
        _llama("debug", 2, 64, 4, 2, 176, 256, 128),
        _llama("debug-wide", 2, 128, 8, 4, 352, 256, 128),
    ]
}


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """A ModelSpec from a Hugging Face ``config.json`` (Llama, Mistral, Qwen2, GPT-NeoX, MPT styles)."""
    p = Path(path)
    try:
        cfg = json.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError("model", str(path), "no such file; give a preset name or a config.json path") from None
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError("model", str(path), f"not a readable JSON config.json ({e})") from None
    if not isinstance(cfg, dict):
        raise ConfigError("model", str(path), "config.json must hold a JSON object")
    mt = str(cfg.get("model_type", "llama")).lower()

    def need(*keys: str) -> Any:
        for k in keys:
            if k in cfg:
                return cfg[k]
        raise ConfigError(f"{p.name}:{keys[0]}", None, f"missing; a {mt} config.json needs it")

    name = cfg.get("_name_or_path") or p.parent.name or "hf-model"
    if mt in ("gpt_neox",):
        return ModelSpec(name=name, layers=need("num_hidden_layers"), hidden=need("hidden_size"),
                         heads=need("num_attention_heads"), ffn_hidden=need("intermediate_size"),
                         vocab=need("vocab_size"), mlp="gelu", norm="layernorm", bias="all",
                         tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                         max_seq_len=cfg.get("max_position_embeddings", 2048))
    if mt == "mpt":
        d = need("d_model")
        return ModelSpec(name=name, layers=need("n_layers"), hidden=d, heads=need("n_heads"),
                         ffn_hidden=int(cfg.get("expansion_ratio", 4) * d), vocab=need("vocab_size"),
                         mlp="gelu", norm="layernorm", tied_embeddings=True, pos_embedding="rope",
                         max_seq_len=cfg.get("max_seq_len", 2048))
    # llama, mistral, qwen2 and friends
    return ModelSpec(name=name, layers=need("num_hidden_layers"), hidden=need("hidden_size"),
                     heads=need("num_attention_heads"),
                     kv_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
                     ffn_hidden=need("intermediate_size"), vocab=need("vocab_size"), mlp="swiglu",
                     bias="qkv" if mt == "qwen2" else "none",
                     tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                     max_seq_len=cfg.get("max_position_embeddings", 4096))


def resolve_model(ref: str | dict | ModelSpec) -> ModelSpec:
    """A preset name, a path to config.json, a dict of fields, or a ModelSpec."""
    if isinstance(ref, ModelSpec):
        return ref
    if isinstance(ref, dict):
        if "preset" in ref:
            base = resolve_model(ref["preset"])
            return replace(base, **{k: v for k, v in ref.items() if k != "preset"})
        return ModelSpec.from_dict(ref)
    if isinstance(ref, str):
        if ref in MODEL_PRESETS:
            return MODEL_PRESETS[ref]
        if ref.endswith(".json") or Path(ref).exists():
            p = Path(ref)
            return model_from_hf_config(p / "config.json" if p.is_dir() else p)
    raise ConfigError("model", ref, "must be a preset (" + ", ".join(MODEL_PRESETS) + ") or a config.json path")


# ----------------------------------------------------------------------------------------------- gpu
@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    name: str
    peak_bf16_flops: float  # dense
    hbm_bytes: int  # usable by the framework
    hbm_bw_Bps: float
    source: str = ""

    def __post_init__(self) -> None:
        _positive_num(self, "peak_bf16_flops", "hbm_bytes", "hbm_bw_Bps")


# Sources: ../data/SOURCES.md (NVIDIA spec sheets; usable HBM from MLPerf v4.0 eos system file).
GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in [
        GPUSpec(name="h100-sxm-80gb", peak_bf16_flops=989e12, hbm_bytes=81559 * 1024**2, hbm_bw_Bps=3.35e12,
                source="NVIDIA H100 datasheet (dense BF16 989 TFLOP/s); 81,559 MiB usable (MLPerf v4.0 eos)"),
        GPUSpec(name="h100-pcie-80gb", peak_bf16_flops=756e12, hbm_bytes=81559 * 1024**2, hbm_bw_Bps=2.0e12,
                source="NVIDIA H100 datasheet (PCIe: dense BF16 756 TFLOP/s, 2.0 TB/s)"),
        GPUSpec(name="h200-141gb", peak_bf16_flops=989e12, hbm_bytes=143771 * 1024**2, hbm_bw_Bps=4.8e12,
                source="NVIDIA H200 datasheet (H100 compute; 141 GB HBM3e, 4.8 TB/s)"),
        GPUSpec(name="a100-80gb", peak_bf16_flops=312e12, hbm_bytes=81251 * 1024**2, hbm_bw_Bps=2.039e12,
                source="NVIDIA A100 datasheet (312 TFLOP/s BF16, 2.0 TB/s)"),
    ]
}


def resolve_gpu(name: str | GPUSpec) -> GPUSpec:
    if isinstance(name, GPUSpec):
        return name
    if name not in GPUS:
        raise ConfigError("gpu", name, "must be one of " + ", ".join(GPUS))
    return GPUS[name]


# ------------------------------------------------------------------------------------------- cluster
@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """Nodes of identical GPUs. Bandwidths are NCCL *bus* bandwidths per GPU (nccl-tests convention)."""

    nodes: int
    gpus_per_node: int
    gpu: GPUSpec
    intra_busbw_Bps: float = 360e9  # NVLink4 ring all-gather/reduce-scatter, 8×H100 (nccl-tests #212, #290)
    inter_busbw_Bps: float = 46e9  # per GPU rail, 400G IB (nccl-tests #290, #309)
    intra_latency_s: float = 30e-6  # NCCL tuning.cc / nccl-tests #232
    inter_latency_s: float = 50e-6
    nics_per_node: int = 8
    host_to_device_Bps: float = 50e9  # PCIe 5 x16, each way
    host_mem_bytes: int = 2 * 1000**4  # DGX H100: 2 TB

    def __post_init__(self) -> None:
        _positive_int(self, "nodes", "gpus_per_node", "nics_per_node")
        _positive_num(self, "intra_busbw_Bps", "inter_busbw_Bps", "intra_latency_s", "inter_latency_s",
                      "host_to_device_Bps", "host_mem_bytes")
        if not isinstance(self.gpu, GPUSpec):
            object.__setattr__(self, "gpu", resolve_gpu(self.gpu))

    @property
    def n_gpus(self) -> int:
        return self.nodes * self.gpus_per_node


# ------------------------------------------------------------------------------------------ training
FINETUNE_KINDS = ("full", "lora", "qlora")
PRECISIONS = ("bf16", "fp32")
OPTIMIZERS = ("adamw", "sgd")
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
# How the block's elementwise ops run (timing.py, docs/timing-model.md): "eager" = PyTorch eager ops
# (torchtitan / HF transformers without torch.compile), "compiled" = torch.compile (Inductor fuses the
# elementwise chains), "fused" = hand-fused kernels (Megatron-LM / Transformer Engine).
KERNEL_KINDS = ("eager", "compiled", "fused")
# Attention core: "flash" = FlashAttention/SDPA (no s×s matrix); "math" = materialised scores + softmax
# (Megatron-LM 2021/2022 before flash attention).
ATTN_IMPL_KINDS = ("flash", "math")
# What ``recompute='selective'`` keeps (memory.py, docs/analytic-model.md §3): "attention" = Megatron's
# selective recompute (reruns the attention core; Korthikanti 2022 §5), "torchtitan_op" = torchtitan's
# op-level SAC (saves every other mm output + SDPA outputs; ``_save_list`` at 9dec370), "matmul" = saves
# every mm/addmm and SDPA output (the proxy harness's policy). "auto": fused kernels → "attention", else
# "torchtitan_op" (the same assumption timing.py makes).
SAC_POLICIES = ("auto", "attention", "torchtitan_op", "matmul")
# How sequence parallelism keeps the QKV / MLP-in inputs for backward: "megatron" keeps the s/t shards and
# re-gathers in backward (Korthikanti 2022 §4.2.2); "pytorch" (DTensor SequenceParallel + Colwise) saves the
# all-gathered full-sequence input. "auto": fused kernels → "megatron", else "pytorch".
SP_IMPLS = ("auto", "megatron", "pytorch")


@dataclass(frozen=True, kw_only=True)
class TrainingSpec:
    seq_len: int
    global_batch: int  # sequences per optimizer step
    dataset_tokens: float = 10e9
    epochs: float = 1.0
    precision: str = "bf16"  # bf16 = mixed precision: bf16 compute, fp32 master weights and Adam states
    optimizer: str = "adamw"
    finetune: str = "full"
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = ("q", "k", "v", "o")
    kernels: str = "eager"  # KERNEL_KINDS; the default study runs HF transformers under Accelerate FSDP2
    attn_impl: str = "flash"  # ATTN_IMPL_KINDS
    sac_policy: str = "auto"  # SAC_POLICIES: what recompute='selective' keeps
    sp_impl: str = "auto"  # SP_IMPLS: sharded (Megatron) or gathered (PyTorch DTensor) linear inputs under SP

    def __post_init__(self) -> None:
        _positive_int(self, "seq_len", "global_batch", "lora_rank")
        _positive_num(self, "dataset_tokens", "epochs")
        _one_of(self, "kernels", KERNEL_KINDS)
        _one_of(self, "attn_impl", ATTN_IMPL_KINDS)
        _one_of(self, "sac_policy", SAC_POLICIES)
        _one_of(self, "sp_impl", SP_IMPLS)
        _one_of(self, "precision", PRECISIONS)
        _one_of(self, "optimizer", OPTIMIZERS)
        _one_of(self, "finetune", FINETUNE_KINDS)
        object.__setattr__(self, "lora_targets", tuple(self.lora_targets))
        bad = [t for t in self.lora_targets if t not in LORA_TARGETS]
        if bad or not self.lora_targets:
            raise ConfigError("lora_targets", list(self.lora_targets), "a non-empty subset of " + ", ".join(LORA_TARGETS))

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch

    @property
    def total_tokens(self) -> float:
        return self.dataset_tokens * self.epochs


# -------------------------------------------------------------------------------------------- layout
SHARDINGS = ("none", "zero1", "zero2", "zero3", "hsdp")
RECOMPUTES = ("none", "selective", "full")
OFFLOADS = ("none", "cpu")
PP_SCHEDULES = ("1f1b", "interleaved")
CP_KINDS = ("ring", "ulysses")


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
    sharding: str = "zero3"
    shard_group: int | None = None  # hsdp only: ranks per shard group (default: GPUs per node)
    recompute: str = "none"
    offload: str = "none"
    micro_batch: int = 1

    def __post_init__(self) -> None:
        _positive_int(self, "dp", "tp", "pp", "cp", "vpp", "micro_batch")
        _one_of(self, "pp_schedule", PP_SCHEDULES)
        _one_of(self, "cp_kind", CP_KINDS)
        _one_of(self, "sharding", SHARDINGS)
        _one_of(self, "recompute", RECOMPUTES)
        _one_of(self, "offload", OFFLOADS)
        if self.shard_group is not None:
            _positive_int(self, "shard_group")
        if self.pp_schedule == "1f1b" and self.vpp != 1:
            raise ConfigError("vpp", self.vpp, "must be 1 unless pp_schedule='interleaved'")
        if self.sp and self.tp == 1:
            raise ConfigError("sp", self.sp, "sequence parallelism needs tp > 1")

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def family(self) -> str:
        """The strategy family: data-parallel sharding × TP × PP (SP, CP, offload, recompute are modifiers)."""
        names = {"none": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "FSDP", "hsdp": "HSDP"}
        return "×".join([names[self.sharding]] + ["TP"] * (self.tp > 1) + ["PP"] * (self.pp > 1))

    def describe(self) -> str:
        s = f"dp{self.dp}·tp{self.tp}{'(sp)' if self.sp else ''}·pp{self.pp}"
        if self.pp > 1:
            s += f"({self.pp_schedule}{'' if self.vpp == 1 else f',v{self.vpp}'})"
        s += f"·cp{self.cp}" + (f"({self.cp_kind})" if self.cp > 1 else "")
        s += f" {self.sharding}"
        if self.sharding == "hsdp":
            s += f"/{self.shard_group}"
        return s + f" rc={self.recompute} mb={self.micro_batch}" + (" offload" if self.offload != "none" else "")

    def to_dict(self) -> dict:
        return asdict(self)

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
        import numpy as np

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
    import numpy as np

    replicas = layout.dp * layout.cp
    default_group = cluster.gpus_per_node if cluster else replicas
    g = np.asarray(0 if layout.shard_group is None else layout.shard_group)
    g = np.where(g == 0, default_group, g)  # 0 / None: the default group, one node
    out = np.where(layout.sharding == "none", 1, np.where(layout.sharding == "hsdp", np.minimum(g, replicas), replicas))
    return out.item() if np.ndim(out) == 0 else out


def grad_accum(training: TrainingSpec, layout: Layout | LayoutTable) -> Any:
    """Micro-batches per rank per optimizer step (the global batch is split over dp only)."""
    import numpy as np

    out = np.maximum(1, (training.global_batch // layout.dp) // layout.micro_batch)
    return out.item() if np.ndim(out) == 0 else out


def layout_problems(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout) -> list[str]:
    """Why this layout cannot run (empty list = structurally valid). Memory is checked elsewhere."""
    why: list[str] = []
    L = layout
    if L.world_size != cluster.n_gpus:
        why.append(f"dp·tp·pp·cp = {L.dp}·{L.tp}·{L.pp}·{L.cp} = {L.world_size}, but the cluster has "
                   f"{cluster.n_gpus} GPUs")
    if model.heads % L.tp:
        why.append(f"tp={L.tp} does not divide heads={model.heads}")
    elif model.kv_heads % L.tp and L.tp % model.kv_heads:
        why.append(f"tp={L.tp} and kv_heads={model.kv_heads}: neither divides the other")
    if model.ffn_hidden % L.tp:
        why.append(f"tp={L.tp} does not divide ffn_hidden={model.ffn_hidden}")
    if L.tp > cluster.gpus_per_node:
        why.append(f"tp={L.tp} spans nodes (gpus_per_node={cluster.gpus_per_node}); TP must stay in NVLink")
    if L.pp * L.vpp > model.layers:  # uneven stages are valid (Llama 3 405B: 126 layers on PP16, Dubey 2024 §3.3.2)
        why.append(f"pp·v = {L.pp}·{L.vpp} exceeds layers={model.layers}: a virtual stage without a layer")
    if training.global_batch % (L.dp * L.micro_batch):
        why.append(f"global_batch={training.global_batch} is not a multiple of dp·micro_batch = "
                   f"{L.dp}·{L.micro_batch}")
    elif L.pp > 1 and grad_accum(training, L) < L.pp:
        why.append(f"{grad_accum(training, L)} micro-batches per step < pp={L.pp} stages (bubble dominates)")
    if training.seq_len % (L.cp * (2 if L.cp_kind == "ring" and L.cp > 1 else 1)):
        why.append(f"seq_len={training.seq_len} not divisible by 2·cp={2 * L.cp} (ring load balancing)")
    if L.cp > 1 and L.cp_kind == "ulysses" and model.heads % (L.cp * L.tp):
        why.append(f"ulysses cp·tp = {L.cp * L.tp} does not divide heads={model.heads}")
    if L.sp and training.seq_len % L.tp:
        why.append(f"seq_len={training.seq_len} not divisible by tp={L.tp} (sequence parallelism)")
    if L.sharding == "hsdp":
        g = L.shard_group or cluster.gpus_per_node
        if (L.dp * L.cp) % g or g == L.dp * L.cp:
            why.append(f"hsdp shard_group={g} must divide dp·cp={L.dp * L.cp} and be smaller than it")
    if L.offload == "cpu" and L.sharding in ("none",):
        why.append("optimizer offload needs a ZeRO/FSDP sharding")
    return why


def check_layout(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout) -> None:
    """Raise ConfigError naming the offending key if the layout is structurally impossible."""
    why = layout_problems(model, cluster, training, layout)
    if why:
        first = why[0]
        key = "layout." + first.split("=")[0].split(" ")[0].replace("·", "").strip()
        if first.startswith("dp·tp·pp·cp"):
            key = "layout"
        raise ConfigError(key, layout.describe(), "; ".join(why))


@dataclass(frozen=True, kw_only=True)
class Study:
    """Everything the analytic model needs, bundled (what a config file resolves to)."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    layout: Layout | None = None
    extra: dict = field(default_factory=dict)
