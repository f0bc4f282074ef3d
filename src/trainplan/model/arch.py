"""The model architecture: :class:`ModelSpec`, the presets (from the models' published ``config.json``), and
reading a Hugging Face ``config.json`` (dense decoder-only families; anything else is refused by name)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from trainplan.io import InputFileError, read_json_checked
from trainplan.model.base import ConfigError, one_of

# --------------------------------------------------------------------------------------------- model
MLP_KINDS = ("swiglu", "gelu")  # swiglu = any gated 3-matrix MLP (SwiGLU, GeGLU); gelu = 2-matrix (GPT)
NORM_KINDS = ("rmsnorm", "layernorm")
POS_KINDS = ("rope", "learned", "alibi")  # only "learned" has parameters (a max_seq_len × hidden table)
# Biased linears: qkv: q, k, v only (Qwen2, StableLM); mlp: the MLP's only (GPT-J, Llama mlp_bias); o_mlp: the attention
# output projection and the MLP (GPT-Neo); all: every linear of the block.
BIAS_KINDS = ("none", "qkv", "mlp", "o_mlp", "all")
# head: one norm of head_dim features whose weights every head shares (Qwen3, Gemma 3); full: one norm over the whole q
# and the whole k projection (OLMo 2); each_head: a norm per head, each with its own weights (Cohere use_qk_norm).
QK_NORM_SCOPES = ("head", "full", "each_head")
# Upper bounds of the architecture fields: far above any published dense model, low enough that every
# product the analytic model forms stays exact in int64/float64 (no overflow, no OverflowError).
MODEL_LIMITS = {"layers": 4096, "hidden": 2**18, "heads": 4096, "kv_heads": 4096, "ffn_hidden": 2**21,
                "vocab": 2**24, "max_seq_len": 2**31, "head_dim_override": 4096, "norms_per_layer": 8,
                "sliding_window": 2**31, "pos_offset": 64}


def bounded_int(obj: object, name: str, lo: int, hi: int) -> None:
    v = getattr(obj, name)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ConfigError(name, v, f"must be an integer in {lo}..{hi}")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A dense decoder-only transformer.

    ``mlp='swiglu'`` is any gated MLP (Llama/Mistral/Qwen SwiGLU, Gemma GeGLU: three h×f matrices); ``'gelu'``
    is the 2-matrix GPT/NeoX/MPT MLP. ``head_dim_override`` is the per-head width when it is not
    ``hidden/heads`` (Gemma: 3072/16 = 192 but head_dim 256; Qwen3-0.6B: 1024/16 = 64 but 128), so the q/o
    projections are ``hidden × heads·head_dim``. ``norms_per_layer`` counts the block's norms (2; Gemma 2/3
    sandwich norms: 4); ``qk_norm`` adds a norm on q and on k, per head (``qk_norm_scope='head'``: Qwen3, Gemma 3)
    or over the whole q and k projections (``'full'``: OLMo 2), or per head with weights of its own (``'each_head'``:
    Command R+). ``norm_bias``: a LayerNorm
    has a bias as well as a weight (PyTorch's default; MPT's ``no_bias`` LayerNorms have the weight only; RMSNorm
    never has one). ``pos_offset``: rows of a learned position table beyond ``max_seq_len`` (OPT: 2, its
    positions start at 2). ``head_bias``: the LM head has a bias (GPT-J, Phi-1/2). ``embed_norm``: a norm right after
    the token embedding (BLOOM's word_embeddings_layernorm). ``sliding_window`` is
    set only when *every* layer attends within that window (Mistral v0.1): the planner models full causal
    attention, so a sequence above the window is refused (config/CLI), at or below it the two are equal.
    """

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
    head_dim_override: int | None = None  # None → hidden // heads
    qk_norm: bool = False
    qk_norm_scope: str = "head"
    norm_bias: bool = True
    head_bias: bool = False
    embed_norm: bool = False
    pos_offset: int = 0
    norms_per_layer: int = 2
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ConfigError("name", self.name, "must be a string")
        for k in ("layers", "hidden", "heads", "vocab", "max_seq_len", "norms_per_layer"):
            bounded_int(self, k, 1, MODEL_LIMITS[k])
        one_of(self, "mlp", MLP_KINDS)
        one_of(self, "norm", NORM_KINDS)
        one_of(self, "pos_embedding", POS_KINDS)
        one_of(self, "bias", BIAS_KINDS)
        one_of(self, "qk_norm_scope", QK_NORM_SCOPES)
        if self.qk_norm_scope != "head" and self.qk_norm is False:  # a setting that would be silently ignored
            raise ConfigError("qk_norm_scope", self.qk_norm_scope, "only applies with qk_norm=true")
        for k in ("tied_embeddings", "qk_norm", "norm_bias", "head_bias", "embed_norm"):
            if not isinstance(getattr(self, k), bool):
                raise ConfigError(k, getattr(self, k), "must be true or false")
        bounded_int(self, "pos_offset", 0, MODEL_LIMITS["pos_offset"])
        for k in ("head_dim_override", "sliding_window"):
            if getattr(self, k) is not None:
                bounded_int(self, k, 1, MODEL_LIMITS[k])
        hd = self.head_dim_override
        if hd is not None and self.hidden % self.heads == 0 and hd == self.hidden // self.heads:
            object.__setattr__(self, "head_dim_override", None)  # the default spelled out: one canonical spec
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.ffn_hidden is None:
            if self.mlp == "gelu":
                ffn = 4 * self.hidden
            else:  # Llama: 2/3 of 4h, rounded up to a multiple of 256
                ffn = 256 * -(-int(8 * self.hidden / 3) // 256)
            object.__setattr__(self, "ffn_hidden", ffn)
        bounded_int(self, "kv_heads", 1, MODEL_LIMITS["kv_heads"])
        bounded_int(self, "ffn_hidden", 1, MODEL_LIMITS["ffn_hidden"])
        if self.head_dim_override is None and self.hidden % self.heads:
            raise ConfigError("hidden", self.hidden, f"must be divisible by heads={self.heads} (or give head_dim)")
        if self.heads % self.kv_heads:
            raise ConfigError("kv_heads", self.kv_heads, f"must divide heads={self.heads}")

    @property
    def head_dim(self) -> int:
        return self.head_dim_override or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """Width of the q projection's output and the o projection's input: heads · head_dim."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def qk_norm_features(self) -> int:
        """Features the q and k norms scale (their weights): 2·head_dim per head-wise pair (shared by the heads),
        q_dim + kv_dim over whole projections (OLMo 2) or with per-head weights (Command R+), 0 without q/k norms."""
        if not self.qk_norm:
            return 0
        return 2 * self.head_dim if self.qk_norm_scope == "head" else self.q_dim + self.kv_dim

    @property
    def pos_params(self) -> int:
        """Parameters of the learned position table ((max_seq_len + pos_offset) × hidden); 0 for RoPE and ALiBi."""
        return (self.max_seq_len + self.pos_offset) * self.hidden if self.pos_embedding == "learned" else 0

    @property
    def params_per_norm_feature(self) -> int:
        """Parameters of a norm per normalised feature: weight, plus a bias for a biased LayerNorm."""
        return 2 if self.norm == "layernorm" and self.norm_bias else 1

    # Parameter counts: exact, checked against the proxy model's nn.Module and published counts in tests.
    @property
    def n_params_per_layer(self) -> int:
        h, f, q, kv = self.hidden, self.ffn_hidden, self.q_dim, self.kv_dim
        attn = h * q + 2 * h * kv + q * h  # q, k, v, o
        mlp = (3 if self.mlp == "swiglu" else 2) * h * f
        per_norm = self.params_per_norm_feature
        norms = self.norms_per_layer * h * per_norm + self.qk_norm_features * per_norm
        attn += (q + 2 * kv) * self.qkv_bias + h * self.o_bias
        if self.mlp_bias:
            mlp += (2 if self.mlp == "swiglu" else 1) * f + h
        return attn + mlp + norms

    @property
    def qkv_bias(self) -> bool:
        """The q, k and v projections have biases (bias kinds qkv and all)."""
        return self.bias in ("qkv", "all")

    @property
    def o_bias(self) -> bool:
        """The attention output projection has a bias (bias kinds o_mlp and all)."""
        return self.bias in ("o_mlp", "all")

    @property
    def mlp_bias(self) -> bool:
        """The MLP's linears have biases (bias kinds mlp, o_mlp and all)."""
        return self.bias in ("mlp", "o_mlp", "all")

    @property
    def n_params_embedding(self) -> int:
        """Input embedding (+ learned positions, + its norm) and, if untied, the output projection (+ its bias)."""
        return (self.vocab * (self.hidden * (1 if self.tied_embeddings else 2) + self.head_bias) + self.pos_params
                + self.n_params_embed_norm)

    @property
    def n_params_embed_norm(self) -> int:
        """The norm after the token embedding (BLOOM), 0 without one."""
        return self.hidden * self.params_per_norm_feature if self.embed_norm else 0

    @property
    def n_params_final_norm(self) -> int:
        return self.hidden * self.params_per_norm_feature

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
        d = _model_aliases(d)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known, key=str)
        if unknown:
            raise ConfigError("model." + str(unknown[0]), d[unknown[0]],
                              "unknown key; valid: " + ", ".join(sorted(known | {"head_dim"})))
        missing = [f.name for f in fields(cls) if f.name not in d and f.default is f.default_factory]
        if missing:
            raise ConfigError("model." + missing[0], None, "required (layers, hidden, heads and vocab)")
        return cls(**d)


def _model_aliases(d: dict) -> dict:
    """``head_dim`` (the Hugging Face name) is stored as ``head_dim_override``."""
    if "head_dim" in d:
        d = dict(d)
        if "head_dim_override" in d:
            raise ConfigError("model.head_dim", d["head_dim"], "give head_dim or head_dim_override, not both")
        d["head_dim_override"] = d.pop("head_dim")
    return d


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

# ------------------------------------------------------------------------ Hugging Face config.json
MAX_HF_CONFIG_BYTES = 4 * 1024**2  # published config.json files are a few KB
HF_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "gpt2",
                  "gpt_bigcode", "gpt_neox", "starcoder2", "mpt", "opt", "falcon", "cohere", "cohere2", "olmo2", "phi",
                  "gptj", "gpt_neo", "stablelm", "granite", "smollm3", "olmo3", "bloom")
_DENSE = ("trainplan plans dense decoder-only models (model_type " + ", ".join(HF_MODEL_TYPES) + ")")
# Keys whose presence means an architecture the planner does not model; checked before model_type.
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_tok")
_MULTIMODAL_KEYS = ("vision_config", "text_config", "audio_config", "vision_tower", "mm_vision_tower")
_MISSING = object()


class _HF:
    """Typed access to one config.json: every error names the file and the field."""

    def __init__(self, cfg: dict, where: str, mt: str):
        self.cfg, self.where, self.mt = cfg, where, mt

    def err(self, key: str, value: Any, valid: str) -> ConfigError:
        return ConfigError(f"{self.where}:{key}", value, valid)

    def int(self, *keys: str, default: Any = _MISSING, hi: int = 2**31, nullable: bool = False) -> Any:
        for k in keys:
            if k in self.cfg:
                v = self.cfg[k]
                if v is None and (nullable or default is not _MISSING):
                    return default if not nullable else None
                if isinstance(v, float) and v.is_integer() and abs(v) <= hi:
                    v = int(v)  # 4096.0 is 4096 (as transformers would read it)
                if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi:
                    raise self.err(k, v, f"must be an integer in 1..{hi}")
                return v
        if default is _MISSING:
            raise self.err(keys[0], None, f"missing; a {self.mt} config.json needs it")
        return default

    def bool(self, key: str, default: bool) -> bool:
        v = self.cfg.get(key, default)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self.err(key, v, "must be true or false")
        return v


def _hf_refusals(cfg: dict, where: str) -> None:
    """Refuse what the planner does not model, naming the field (before model_type is even looked at)."""
    if cfg.get("is_encoder_decoder"):
        raise ConfigError(f"{where}:is_encoder_decoder", cfg["is_encoder_decoder"],
                          f"encoder-decoder models are not modelled; {_DENSE}")
    for k in _MOE_KEYS:
        v = cfg.get(k)
        if v is not None and not (isinstance(v, int | float) and not isinstance(v, bool) and v <= 1):
            raise ConfigError(f"{where}:{k}", v, f"mixture-of-experts is not modelled (MoE planning is not "
                                                 f"supported); {_DENSE}")
    for k in _MULTIMODAL_KEYS:
        if cfg.get(k) is not None:
            raise ConfigError(f"{where}:{k}", "{...}" if isinstance(cfg[k], dict) else cfg[k],
                              "multimodal models are not modelled (the vision/audio tower is not planned); "
                              f"give the language model's own config.json; {_DENSE}")


def _hf_bias(hf: _HF, *, qkv_default: bool = False) -> str:
    """Llama-style ``attention_bias`` (q, k, v and o) and ``mlp_bias`` → a BIAS_KINDS value."""
    attn, mlp = hf.bool("attention_bias", False), hf.bool("mlp_bias", False)
    if attn and mlp:
        return "all"
    if attn:
        raise hf.err("attention_bias", True, "biases on only the attention (q, k, v, o) are not modelled; "
                                             "modelled: none, q/k/v only (Qwen2), the MLP only (mlp_bias), or every "
                                             "linear layer (attention_bias and mlp_bias both true)")
    if mlp:
        return "mlp"
    return "qkv" if qkv_default else "none"


_HF_FIELDS = {  # ModelSpec field → the config.json key it is read from, per family (errors name the key)
    "llama": {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
              "kv_heads": "num_key_value_heads", "ffn_hidden": "intermediate_size", "vocab": "vocab_size",
              "head_dim_override": "head_dim", "max_seq_len": "max_position_embeddings",
              "sliding_window": "sliding_window"},
    "gpt2": {"layers": "n_layer", "hidden": "n_embd", "heads": "n_head", "kv_heads": "n_head", "ffn_hidden": "n_inner",
             "vocab": "vocab_size", "max_seq_len": "n_positions"},
    "gpt_bigcode": {"layers": "n_layer", "hidden": "n_embd", "heads": "n_head", "kv_heads": "multi_query",
                    "ffn_hidden": "n_inner", "vocab": "vocab_size", "max_seq_len": "n_positions"},
    "opt": {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
            "kv_heads": "num_attention_heads", "ffn_hidden": "ffn_dim", "vocab": "vocab_size",
            "max_seq_len": "max_position_embeddings"},
    "falcon": {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
               "kv_heads": "num_kv_heads", "ffn_hidden": "ffn_hidden_size", "vocab": "vocab_size",
               "max_seq_len": "max_position_embeddings", "norms_per_layer": "num_ln_in_parallel_attn"},
    "gptj": {"layers": "n_layer", "hidden": "n_embd", "heads": "n_head", "kv_heads": "n_head", "ffn_hidden": "n_inner",
             "vocab": "vocab_size", "max_seq_len": "n_positions"},
    "bloom": {"layers": "n_layer", "hidden": "hidden_size", "heads": "n_head", "kv_heads": "n_head",
              "ffn_hidden": "hidden_size", "vocab": "vocab_size"},
    "gpt_neo": {"layers": "num_layers", "hidden": "hidden_size", "heads": "num_heads", "kv_heads": "num_heads",
                "ffn_hidden": "intermediate_size", "vocab": "vocab_size", "max_seq_len": "max_position_embeddings"},
    "mpt": {"layers": "n_layers", "hidden": "d_model", "heads": "n_heads", "kv_heads": "n_heads",
            "ffn_hidden": "expansion_ratio", "vocab": "vocab_size", "max_seq_len": "max_seq_len"},
}


def _hf_spec(kw: dict, where: str, mt: str) -> ModelSpec:
    """ModelSpec(**kw); a cross-field error (hidden not divisible by heads, ...) names the config.json key."""
    try:
        return ModelSpec(**kw)
    except ConfigError as e:
        keys = _HF_FIELDS.get(mt, _HF_FIELDS["llama"])
        raise ConfigError(f"{where}:{keys.get(e.key, e.key)}", e.value, e.valid) from None


def model_from_hf_dict(cfg: Any, *, where: str = "config.json", name: str | None = None) -> ModelSpec:
    """A ModelSpec from the fields of a Hugging Face ``config.json``.

    Every field of the dense families is read with transformers' default when absent (Llama 2/3.x, Mistral,
    Qwen2/3, Gemma 1/2/3, Phi-3/Phi-4, GPT-2, GPT-BigCode (StarCoder), GPT-NeoX, StarCoder2, MPT, OPT, Falcon,
    Cohere (Command R, R+) 1/2, OLMo 2/3, Phi-1/2, GPT-J, GPT-Neo, StableLM, Granite, SmolLM3, BLOOM).
    Mixture-of-experts, encoder-decoder, multimodal and unknown ``model_type`` configs are refused with one
    ConfigError naming the field.
    """
    if not isinstance(cfg, dict):
        raise ConfigError(where, type(cfg).__name__, "config.json must hold a JSON object")
    _hf_refusals(cfg, where)
    mt = cfg.get("model_type", _MISSING)
    if mt is _MISSING:
        raise ConfigError(f"{where}:model_type", None, "missing; one of " + ", ".join(HF_MODEL_TYPES))
    if mt not in HF_MODEL_TYPES:
        raise ConfigError(f"{where}:model_type", mt if isinstance(mt, str) else type(mt).__name__,
                          "not supported; " + _DENSE)
    hf = _HF(cfg, where, mt)
    raw_name = name if name is not None else cfg.get("_name_or_path")
    nm = "".join(c if c.isprintable() else "?" for c in str(raw_name or "hf-model"))[:80] or "hf-model"
    kw: dict[str, Any] = {"name": nm}
    lim = MODEL_LIMITS
    if mt == "gpt2":  # GPT-2: learned positions, LayerNorm, biased Conv1D layers, 4h GELU MLP, tied head
        h = hf.int("n_embd", hi=lim["hidden"])
        kw |= dict(layers=hf.int("n_layer", hi=lim["layers"]), hidden=h, heads=hf.int("n_head", hi=lim["heads"]),
                   ffn_hidden=hf.int("n_inner", default=4 * h, hi=lim["ffn_hidden"]),
                   vocab=hf.int("vocab_size", hi=lim["vocab"]), mlp="gelu", norm="layernorm", bias="all",
                   pos_embedding="learned", tied_embeddings=hf.bool("tie_word_embeddings", True),
                   max_seq_len=hf.int("n_positions", "n_ctx", default=1024))
        return _hf_spec(kw, where, mt)
    if mt == "gpt_bigcode":  # StarCoder 1 / SantaCoder: GPT-2 with multi-query attention (one K/V head)
        h, heads = hf.int("n_embd", hi=lim["hidden"]), hf.int("n_head", hi=lim["heads"])
        kw |= dict(layers=hf.int("n_layer", hi=lim["layers"]), hidden=h, heads=heads,
                   kv_heads=1 if hf.bool("multi_query", True) else heads,
                   ffn_hidden=hf.int("n_inner", default=4 * h, hi=lim["ffn_hidden"]),
                   vocab=hf.int("vocab_size", hi=lim["vocab"]), mlp="gelu", norm="layernorm", bias="all",
                   pos_embedding="learned", tied_embeddings=hf.bool("tie_word_embeddings", True),
                   max_seq_len=hf.int("n_positions", default=1024))
        return _hf_spec(kw, where, mt)
    if mt == "starcoder2":  # GQA + RoPE, biased LayerNorms, a 2-matrix GELU MLP; use_bias on every linear layer
        heads = hf.int("num_attention_heads", hi=lim["heads"])
        kw |= dict(layers=hf.int("num_hidden_layers", hi=lim["layers"]), hidden=hf.int("hidden_size", hi=lim["hidden"]),
                   heads=heads, kv_heads=hf.int("num_key_value_heads", default=heads, hi=lim["kv_heads"]),
                   ffn_hidden=hf.int("intermediate_size", hi=lim["ffn_hidden"]),
                   vocab=hf.int("vocab_size", hi=lim["vocab"]), mlp="gelu", norm="layernorm",
                   bias="all" if hf.bool("use_bias", True) else "none",
                   tied_embeddings=hf.bool("tie_word_embeddings", True),
                   max_seq_len=hf.int("max_position_embeddings", default=4096),
                   # every layer windowed when set (the published configs: 4096)
                   sliding_window=hf.int("sliding_window", default=None, nullable=True))
        return _hf_spec(kw, where, mt)
    if mt == "opt":  # pre-LN OPT: learned positions offset by 2, biased linears and LayerNorms, a 2-matrix ReLU MLP
        h = hf.int("hidden_size", hi=lim["hidden"])
        if hf.int("word_embed_proj_dim", default=h, hi=lim["hidden"]) != h:
            raise hf.err("word_embed_proj_dim", cfg["word_embed_proj_dim"], f"an embedding projection (≠ hidden_size={h}, "
                         "OPT-350m) is not modelled; the other OPT sizes have none")
        if not hf.bool("do_layer_norm_before", True):
            raise hf.err("do_layer_norm_before", False, "post-LayerNorm OPT (OPT-350m) is not modelled")
        if not hf.bool("layer_norm_elementwise_affine", True):
            raise hf.err("layer_norm_elementwise_affine", False, "LayerNorms without parameters are not modelled")
        if hf.bool("_remove_final_layer_norm", False):
            raise hf.err("_remove_final_layer_norm", True, "a model without its final LayerNorm is not modelled")
        kw |= dict(layers=hf.int("num_hidden_layers", hi=lim["layers"]), hidden=h,
                   heads=hf.int("num_attention_heads", hi=lim["heads"]),
                   ffn_hidden=hf.int("ffn_dim", hi=lim["ffn_hidden"]), vocab=hf.int("vocab_size", hi=lim["vocab"]),
                   mlp="gelu", norm="layernorm", bias="all" if hf.bool("enable_bias", True) else "none",
                   pos_embedding="learned", pos_offset=2, tied_embeddings=hf.bool("tie_word_embeddings", True),
                   max_seq_len=hf.int("max_position_embeddings", default=2048))
        return _hf_spec(kw, where, mt)
    if mt == "falcon":
        # Attention and MLP in parallel off the same input (parallel_attn): planned as the sequential block with the
        # same weights (same FLOPs and parameters). K/V heads: new_decoder_architecture → num_kv_heads,
        # else multi_query → 1, else all heads. LayerNorms per block: 2 unless parallel with one shared norm.
        h = hf.int("hidden_size", "n_embed", hi=lim["hidden"])
        heads = hf.int("num_attention_heads", "n_head", hi=lim["heads"])
        new_arch, parallel = hf.bool("new_decoder_architecture", False), hf.bool("parallel_attn", True)
        kv = (hf.int("num_kv_heads", default=heads, hi=lim["kv_heads"]) if new_arch
              else 1 if hf.bool("multi_query", True) else heads)
        n_ln = hf.int("num_ln_in_parallel_attn", default=2 if new_arch else 1, hi=2)
        kw |= dict(layers=hf.int("num_hidden_layers", "n_layer", hi=lim["layers"]), hidden=h, heads=heads, kv_heads=kv,
                   ffn_hidden=hf.int("ffn_hidden_size", default=4 * h, hi=lim["ffn_hidden"]),
                   vocab=hf.int("vocab_size", hi=lim["vocab"]), mlp="gelu", norm="layernorm",
                   norms_per_layer=n_ln if parallel else 2, bias="all" if hf.bool("bias", False) else "none",
                   pos_embedding="alibi" if hf.bool("alibi", False) else "rope",
                   tied_embeddings=hf.bool("tie_word_embeddings", True),
                   max_seq_len=hf.int("max_position_embeddings", default=2048))
        return _hf_spec(kw, where, mt)
    if mt in ("phi", "gptj"):
        # Phi-1/1.5/2 and GPT-J: attention and a 2-matrix GELU MLP in parallel off one LayerNorm (planned as the
        # sequential block with the same weights), partial RoPE, a biased LM head; GPT-J biases only its MLP
        gptj, k = mt == "gptj", _HF_FIELDS.get(mt, _HF_FIELDS["llama"])  # the family's config.json key names
        h, heads = hf.int(k["hidden"], hi=lim["hidden"]), hf.int(k["heads"], hi=lim["heads"])
        kw |= dict(layers=hf.int(k["layers"], hi=lim["layers"]), hidden=h, heads=heads,
                   kv_heads=heads if gptj else hf.int(k["kv_heads"], default=heads, hi=lim["kv_heads"]),
                   ffn_hidden=hf.int(k["ffn_hidden"], **({"default": 4 * h} if gptj else {}), hi=lim["ffn_hidden"]),
                   vocab=hf.int(k["vocab"], hi=lim["vocab"]), mlp="gelu", norm="layernorm", norms_per_layer=1,
                   bias="mlp" if gptj else "all", head_bias=True,
                   qk_norm=not gptj and hf.bool("qk_layernorm", False),  # Phi: one LayerNorm of head_dim for q, k
                   tied_embeddings=hf.bool("tie_word_embeddings", False),
                   max_seq_len=hf.int(k["max_seq_len"], default=2048))
        return _hf_spec(kw, where, mt)
    if mt == "gpt_neo":
        # GPT-Neo: GPT-2's block with unbiased q/k/v (bias kind o_mlp), learned positions, tied head. Its local layers
        # (attention_types, window_size 256) alternate with global ones: full attention is planned for every layer
        # (an upper bound on the local layers' attention work, as for Gemma 2's windowed layers).
        h = hf.int("hidden_size", hi=lim["hidden"])
        kw |= dict(layers=hf.int("num_layers", hi=lim["layers"]), hidden=h, heads=hf.int("num_heads", hi=lim["heads"]),
                   ffn_hidden=hf.int("intermediate_size", default=4 * h, hi=lim["ffn_hidden"]),
                   vocab=hf.int("vocab_size", hi=lim["vocab"]), mlp="gelu", norm="layernorm", bias="o_mlp",
                   pos_embedding="learned", tied_embeddings=hf.bool("tie_word_embeddings", True),
                   max_seq_len=hf.int("max_position_embeddings", default=2048))
        return _hf_spec(kw, where, mt)
    if mt == "bloom":
        # BLOOM: ALiBi, a LayerNorm after the word embedding, biased LayerNorms and linears, a 4h GELU MLP, tied head.
        # ALiBi sets no length: no context cap (max_seq_len is the planner's ceiling, as for --arch without max_seq)
        h = hf.int("hidden_size", "n_embed", hi=lim["hidden"])
        kw |= dict(layers=hf.int("n_layer", "num_hidden_layers", hi=lim["layers"]), hidden=h,
                   heads=hf.int("n_head", "num_attention_heads", hi=lim["heads"]), ffn_hidden=4 * h,
                   vocab=hf.int("vocab_size", hi=lim["vocab"]), mlp="gelu", norm="layernorm", bias="all",
                   embed_norm=True, pos_embedding="alibi", tied_embeddings=hf.bool("tie_word_embeddings", True),
                   max_seq_len=MODEL_LIMITS["max_seq_len"])
        return _hf_spec(kw, where, mt)
    if mt == "stablelm":
        # StableLM (2): biased LayerNorms, a gated SiLU MLP, partial RoPE; q/k/v biases when use_qkv_bias; one norm
        # per block when use_parallel_residual (planned as the sequential block with the same weights)
        if hf.bool("qk_layernorm", False):
            raise hf.err("qk_layernorm", True, "StableLM's per-head q/k LayerNorms (one weight per head) are not "
                                               "modelled")
        heads = hf.int("num_attention_heads", hi=lim["heads"])
        kw |= dict(layers=hf.int("num_hidden_layers", hi=lim["layers"]), hidden=hf.int("hidden_size", hi=lim["hidden"]),
                   heads=heads, kv_heads=hf.int("num_key_value_heads", default=heads, hi=lim["kv_heads"]),
                   ffn_hidden=hf.int("intermediate_size", hi=lim["ffn_hidden"]),
                   vocab=hf.int("vocab_size", hi=lim["vocab"]), mlp="swiglu", norm="layernorm",
                   norms_per_layer=1 if hf.bool("use_parallel_residual", False) else 2,
                   bias="qkv" if hf.bool("use_qkv_bias", False) else "none",
                   tied_embeddings=hf.bool("tie_word_embeddings", False),
                   max_seq_len=hf.int("max_position_embeddings", default=4096))
        return _hf_spec(kw, where, mt)
    if mt == "gpt_neox":
        kw |= dict(layers=hf.int("num_hidden_layers", hi=lim["layers"]), hidden=hf.int("hidden_size", hi=lim["hidden"]),
                   heads=hf.int("num_attention_heads", hi=lim["heads"]),
                   ffn_hidden=hf.int("intermediate_size", hi=lim["ffn_hidden"]),
                   vocab=hf.int("vocab_size", hi=lim["vocab"]), mlp="gelu", norm="layernorm", bias="all",
                   tied_embeddings=hf.bool("tie_word_embeddings", False),
                   max_seq_len=hf.int("max_position_embeddings", default=2048))
        return _hf_spec(kw, where, mt)
    if mt == "mpt":
        d = hf.int("d_model", hi=lim["hidden"])
        ratio = cfg.get("expansion_ratio", 4)
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 < ratio <= 64:
            raise hf.err("expansion_ratio", ratio, "must be a number in (0, 64]")
        # no_bias (transformers' default: true) drops the biases of every linear layer and of the LayerNorms
        no_bias = hf.bool("no_bias", True)
        kw |= dict(layers=hf.int("n_layers", hi=lim["layers"]), hidden=d, heads=hf.int("n_heads", hi=lim["heads"]),
                   ffn_hidden=max(1, int(ratio * d)), vocab=hf.int("vocab_size", hi=lim["vocab"]), mlp="gelu",
                   norm="layernorm", norm_bias=not no_bias, bias="none" if no_bias else "all",
                   tied_embeddings=True, pos_embedding="alibi", max_seq_len=hf.int("max_seq_len", default=2048))
        return _hf_spec(kw, where, mt)
    # The Llama lineage: gated MLP, RMSNorm, RoPE. transformers' per-family defaults for absent fields.
    gemma, cohere = mt.startswith("gemma"), mt.startswith("cohere")
    layers, hidden = hf.int("num_hidden_layers", hi=lim["layers"]), hf.int("hidden_size", hi=lim["hidden"])
    heads = hf.int("num_attention_heads", hi=lim["heads"])
    kw |= dict(layers=layers, hidden=hidden, heads=heads, kv_heads=hf.int("num_key_value_heads", default=heads, hi=lim["kv_heads"]),
               ffn_hidden=hf.int("intermediate_size", hi=lim["ffn_hidden"]),
               vocab=hf.int("vocab_size", hi=lim["vocab"]), mlp="swiglu",
               head_dim_override=hf.int("head_dim", default=256 if gemma else (128 if mt == "qwen3" else None),
                                        hi=lim["head_dim_override"], nullable=not (gemma or mt == "qwen3")),
               tied_embeddings=hf.bool("tie_word_embeddings", gemma or cohere or mt == "smollm3"),
               bias=_hf_bias(hf, qkv_default=mt == "qwen2") if mt != "qwen2" else "qkv",
               qk_norm=mt in ("qwen3", "gemma3_text", "olmo2", "olmo3"),
               qk_norm_scope="full" if mt in ("olmo2", "olmo3") else "head",
               norms_per_layer=4 if mt in ("gemma2", "gemma3_text") else 2,
               max_seq_len=hf.int("max_position_embeddings", default={
                   "llama": 2048, "mistral": 131072, "qwen2": 32768, "qwen3": 32768, "gemma": 8192,
                   "gemma2": 8192, "gemma3_text": 131072, "phi3": 4096, "cohere": 8192, "cohere2": 8192,
                   "olmo2": 2048, "olmo3": 2048, "granite": 2048, "smollm3": 32768}[mt]))
    if cohere:  # one weight-only LayerNorm feeds attention and MLP in parallel (planned as the sequential block)
        kw |= dict(norm="layernorm", norm_bias=False, norms_per_layer=1)
        if hf.bool("use_qk_norm", False):  # Command R+: weight-only q/k LayerNorms, a weight row per head
            kw |= dict(qk_norm=True, qk_norm_scope="each_head")
    if mt == "phi3":  # fused qkv and gate·up projections: the Llama count; the window (when set) on every layer
        kw["sliding_window"] = hf.int("sliding_window", default=None, nullable=True)
    elif mt == "mistral":  # every layer windowed (v0.1: 4096; v0.2+ null); transformers' default is 4096
        kw["sliding_window"] = hf.int("sliding_window", default=4096, nullable="sliding_window" in cfg)
    elif mt in ("qwen2", "qwen3") and hf.bool("use_sliding_window", False):
        kw["sliding_window"] = hf.int("sliding_window", default=4096)
    # Granite's embedding/residual/attention/logit multipliers scale activations, not parameters or FLOPs; SmolLM3's
    # NoPE layers only skip RoPE.
    # gemma2 / gemma3_text / cohere2 / olmo3 / smollm3 (its NoPE layers, with use_sliding_window) interleave windowed
    # and global layers: the global ones attend over the whole sequence, so full attention is modelled (an upper
    # bound on the windowed layers' attention work).
    return _hf_spec(kw, where, mt)


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """A ModelSpec from a Hugging Face ``config.json`` file (see :func:`model_from_hf_dict`)."""

    p = Path(path)
    try:
        cfg = read_json_checked(p, max_bytes=MAX_HF_CONFIG_BYTES)
    except FileNotFoundError:
        raise ConfigError("model", str(path), "no such file; give a preset name or a config.json path") from None
    except InputFileError as e:
        raise ConfigError("model", str(path), f"not a readable JSON config.json ({e})") from None
    if not isinstance(cfg, dict):
        raise ConfigError("model", str(path), "config.json must hold a JSON object")
    # a file named config.json is named after its folder (a downloaded repo); any other name after itself
    # (mistral-7b.json beside other configs: its folder names the set, not the model)
    own = p.parent.name if p.stem == "config" else p.stem
    return model_from_hf_dict(cfg, where=p.name, name=cfg.get("_name_or_path") or own or "hf-model")


# The CPU proxies' head width (proxy.select.cpu_model): a debug-width model of hidden h has max(1, h // 16) heads.
CPU_PROXY_HEAD_DIM = 16


def cpu_proxy_heads(hidden: int) -> int:
    """Attention heads of a CPU proxy model of width ``hidden`` (the config check and proxy.select agree on it)."""
    return max(1, int(hidden) // CPU_PROXY_HEAD_DIM)


def resolve_model(ref: str | dict | ModelSpec) -> ModelSpec:
    """A preset name, a path to config.json, a dict of fields, or a ModelSpec."""
    if isinstance(ref, ModelSpec):
        return ref
    if isinstance(ref, dict):
        if "preset" in ref:
            base = resolve_model(ref["preset"])
            over = _model_aliases({k: v for k, v in ref.items() if k != "preset"})
            known = {f.name for f in fields(ModelSpec)}
            unknown = sorted(set(over) - known, key=str)
            if unknown:
                raise ConfigError("model." + str(unknown[0]), over[unknown[0]],
                                  "unknown key; valid: " + ", ".join(sorted(known | {"head_dim"})))
            if "hidden" in over or "heads" in over:  # a new width: the preset's head_dim no longer applies
                over.setdefault("head_dim_override", None)
            try:
                return replace(base, **over)
            except ConfigError as e:  # a field the mapping did not give: say it came from the preset
                key = str(e.key).removeprefix("model.")
                if key in over or key not in known:
                    raise
                raise ConfigError(e.key, e.value, f"{e.valid} (kept from preset {ref['preset']}: give model.{key}, or "
                                                  "set model.preset: null for an architecture of your own)") from None
        return ModelSpec.from_dict(ref)
    if isinstance(ref, str):
        if ref in MODEL_PRESETS:
            return MODEL_PRESETS[ref]
        if "\0" not in ref and (ref.endswith(".json") or Path(ref).exists()):
            p = Path(ref)
            return model_from_hf_config(p / "config.json" if p.is_dir() else p)
        if HF_REPO_ID.fullmatch(ref):
            return _model_from_hf_cache(ref)
    shown = ref if isinstance(ref, str) and len(ref) <= 200 else (f"{ref[:200]}…" if isinstance(ref, str) else ref)
    raise ConfigError("model", shown, "must be a preset (" + ", ".join(MODEL_PRESETS) + "), a config.json path or a "
                                      "Hugging Face repo id (org/name) in the local Hugging Face cache")


# A Hugging Face model repo id (org/name): read from the local hub cache only, never from the network.
HF_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")


def _model_from_hf_cache(repo_id: str) -> ModelSpec:
    """The ``config.json`` of ``repo_id`` from the local Hugging Face hub cache (``HF_HUB_CACHE``/``HF_HOME``, as
    huggingface_hub resolves them; its ``main`` revision), named after the repo. No network access: a repo that is
    not cached is a ConfigError saying how to fetch its config."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # the launch extra (transformers) brings it
        raise ConfigError("model", repo_id, "a Hugging Face repo id needs huggingface_hub (pip install "
                                            "'trainplan[launch]'); or give the config.json path") from None
    found = try_to_load_from_cache(repo_id, "config.json")
    if not isinstance(found, str):
        from huggingface_hub.constants import HF_HUB_CACHE

        raise ConfigError("model", repo_id, f"not in the local Hugging Face cache ({HF_HUB_CACHE}); fetch its config "
                                            f"with `hf download {repo_id} config.json` (no network is used here), or "
                                            "give a config.json path")
    cfg = model_from_hf_config(found)
    return replace(cfg, name=repo_id)


# ------------------------------------------------------------------- Llama-architecture implementations
ROPE_THETA = 10000.0  # Llama 2 (Touvron et al. 2023); Llama 3 uses 500000 — irrelevant to cost


def llama_block_problems(model: ModelSpec, impl: str) -> list[str]:
    """Why a Llama-architecture implementation (``impl``, named in each reason) cannot build ``model`` exactly: the
    checks transformers' ``LlamaForCausalLM`` and torchtitan's llama3 share (SwiGLU MLP, RMSNorm, RoPE, no q/k
    norm, 2 norms per block, attention over the full sequence). Each caller adds its own (bias, head_dim, …)."""
    why = []
    if model.mlp != "swiglu":
        why.append(f"mlp={model.mlp} ({impl}: SwiGLU MLP only)")
    if model.norm != "rmsnorm":
        why.append(f"norm={model.norm} ({impl}: RMSNorm only)")
    if model.pos_embedding != "rope":
        why.append(f"pos_embedding={model.pos_embedding} ({impl}: RoPE only)")
    if model.qk_norm:
        why.append(f"qk_norm ({impl} has no q/k norm; Qwen3/Gemma 3 do)")
    if model.norms_per_layer != 2:
        why.append(f"norms_per_layer={model.norms_per_layer} ({impl} blocks have 2)")
    if model.sliding_window:
        why.append(f"sliding_window ({impl} attends over the full sequence; Mistral's model has the window)")
    return why


def torchtitan_problems(model: ModelSpec, finetune: str = "full") -> list[str]:
    """Why the launch's torchtitan job (torchtitan's Llama 3 decoder, full fine-tuning) cannot be this model /
    fine-tune exactly (empty: it can). Where it cannot, the Accelerate launch runs Hugging Face's model instead."""
    why = llama_block_problems(model, "torchtitan llama3")
    if model.bias != "none":
        why.append(f"bias={model.bias}: llama3 linears have no bias")
    if model.head_bias:
        why.append("head_bias: llama3's output projection has no bias")
    if model.embed_norm:
        why.append("embed_norm: llama3 has no norm after the token embedding")
    if getattr(model, "head_dim_override", None) not in (None, model.hidden // model.heads):
        why.append("head_dim != hidden/heads: llama3 derives head_dim from dim/n_heads")
    if finetune != "full":
        why.append(f"finetune={finetune}: the job module is written for full fine-tuning only")
    return why


def hf_unsupported_reason(spec: ModelSpec) -> str | None:
    """Why transformers' ``LlamaForCausalLM`` cannot be this ModelSpec exactly (None: it can)."""
    why = llama_block_problems(spec, "LlamaForCausalLM")
    if spec.qkv_bias != spec.o_bias:
        why.append(f"bias={spec.bias} (LlamaConfig.attention_bias biases q, k, v and o_proj together)")
    if spec.head_bias:
        why.append("head_bias (LlamaForCausalLM's lm_head has no bias)")
    if spec.embed_norm:
        why.append("embed_norm (LlamaForCausalLM has no norm after the embedding)")
    return "; ".join(why) or None


def hf_config_dict(spec: ModelSpec, *, rope_theta: float = ROPE_THETA) -> dict:
    """A Hugging Face ``config.json`` (LlamaConfig) for the ModelSpec; ``model_from_hf_config`` reads it back."""
    why = hf_unsupported_reason(spec)
    if why:
        raise ValueError(f"{spec.name}: not expressible as LlamaForCausalLM: {why}")
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "_name_or_path": spec.name,
            "hidden_size": spec.hidden, "intermediate_size": spec.ffn_hidden,
            "num_hidden_layers": spec.layers, "num_attention_heads": spec.heads,
            "num_key_value_heads": spec.kv_heads, "head_dim": spec.head_dim, "vocab_size": spec.vocab,
            "max_position_embeddings": spec.max_seq_len, "rms_norm_eps": 1e-5, "rope_theta": rope_theta,
            "tie_word_embeddings": spec.tied_embeddings, "attention_bias": spec.bias == "all",
            "mlp_bias": spec.mlp_bias, "hidden_act": "silu", "initializer_range": 0.02,
            "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32", "use_cache": False}
