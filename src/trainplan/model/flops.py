"""FLOPs per token and per step (model and hardware FLOPs), MFU/HFU, and Megatron's closed forms.

Conventions (stated in the memo; see docs/analytic-model.md):

* A matmul of an (m×k) by a (k×n) matrix costs ``2·m·k·n`` FLOPs (what ``FlopCounterMode`` counts).
* **Model FLOPs per token** follow PaLM (Chowdhery 2022, App. B) and torchtitan's
  ``get_num_flop_per_token``: ``6·N_dense + 12·L·h·s``. ``N_dense`` is every parameter except the
  *input* embedding lookup (and a learned position table) — the output projection is a matmul and is
  counted (even when tied). The attention term counts causal attention as full (s² not s²/2), as
  torchtitan and Megatron do; ``h`` is the attention width ``heads·head_dim`` (= hidden for Llama).
* **Frozen-base fine-tunes** (LoRA, QLoRA) never compute the base weights' gradients, so their model FLOPs
  per token are ``4·N_dense + 12·L·h·s + 6·N_adapters`` (forward, input-gradient, attention both ways, and
  the adapters' full training); crediting them with 6·N would report work that is never done as utilisation
  (``train_flops_per_token``; MFU/HFU and ``flops_per_token`` use it).
* **Hardware FLOPs** add what activation recompute runs again (full: one more forward of the blocks;
  selective: the attention core ``QKᵀ`` and ``PV``), as Korthikanti 2022 (arXiv 2205.05198) defines HFU.

Pure functions of a :class:`~trainplan.model.arch.ModelSpec`; no torch, no numpy needed.
"""

from __future__ import annotations

from trainplan.model.arch import ModelSpec
from trainplan.model.base import ConfigError
from trainplan.model.training import TrainingSpec

ATTN_FLOP_MODES = ("full", "causal", "none")
RECOMPUTES = ("none", "selective", "full")
SAC_POLICIES = ("attention", "torchtitan_op", "matmul")  # specs.SAC_POLICIES less "auto"
CHECKPOINT_IMPLS = ("reentrant", "non_reentrant")


def _check(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(name, value, "must be one of " + ", ".join(allowed))


# ------------------------------------------------------------------------------------ parameters
def n_params_dense(model: ModelSpec) -> int:
    """Parameters that cost matmul FLOPs: all but the input embedding (+ learned positions); torchtitan."""
    n = model.n_params - model.vocab * model.hidden  # drop the input embedding lookup
    if model.tied_embeddings:  # the shared matrix is still used as the output projection
        n += model.vocab * model.hidden
    return n - model.pos_params


def n_params_blocks(model: ModelSpec) -> int:
    """Parameters of the transformer blocks only (what full recompute runs again)."""
    return model.layers * model.n_params_per_layer


def attn_width(model: ModelSpec) -> int:
    """h_attn = heads · head_dim (torchtitan's h·q); the width of QKᵀ and PV per token."""
    return model.heads * model.head_dim


# ----------------------------------------------------------------------------- per-token formulas
def model_flops_per_token(model: ModelSpec, seq_len: int, *, count_input_embedding: bool = False) -> float:
    """Model FLOPs per trained token: 6·N_dense + 12·L·h·s (PaLM App. B; torchtitan get_num_flop_per_token).

    ``count_input_embedding=True`` uses 6·N_total instead (all parameters), the convention behind older
    published MFU figures such as torchtitan docs/performance.md (Llama-2-13B, 61.1% on A100).
    """
    n = model.n_params if count_input_embedding else n_params_dense(model)
    return 6.0 * n + 12.0 * model.layers * attn_width(model) * seq_len


def lora_dims(model: ModelSpec) -> dict[str, tuple[int, int]]:
    """(in, out) features of each LoRA target projection of one block."""
    h, kv, f, q = model.hidden, model.kv_dim, model.ffn_hidden, model.q_dim  # q = heads·head_dim
    return {"q": (h, q), "k": (h, kv), "v": (h, kv), "o": (q, h), "gate": (h, f), "up": (h, f), "down": (f, h)}


def adapter_params(model: ModelSpec, rank: int, targets: tuple[str, ...]) -> int:
    """LoRA adapter parameters of the whole model: r·(in + out) per target per block (Hu 2021 §4.1); a GELU
    MLP has no ``gate``."""
    dims = lora_dims(model)
    per = sum(rank * sum(dims[t]) for t in targets if not (t == "gate" and model.mlp != "swiglu"))
    return model.layers * per


def train_flops_per_token(model: ModelSpec, training: TrainingSpec) -> float:
    """Model FLOPs per trained token for the fine-tune mode: full 6·N + 12·L·h·s; LoRA/QLoRA (frozen base,
    no weight gradients) 4·N + 12·L·h·s + 6·N_adapters."""
    s = training.seq_len
    if training.finetune == "full":
        return model_flops_per_token(model, s)
    attn = 12.0 * model.layers * attn_width(model) * s
    return 4.0 * n_params_dense(model) + attn + 6.0 * adapter_params(model, training.lora_rank, training.lora_targets)


def recompute_flops_per_token(model: ModelSpec, seq_len: int, recompute: str, *, policy: str = "attention",
                              checkpoint_impl: str = "reentrant") -> float:
    """Extra forward FLOPs per token from recompute: full 2·N_blocks+4·L·h·s, selective 4·L·h·s (Korthikanti 2022 HFU).

    ``checkpoint_impl='non_reentrant'`` (``torch.utils.checkpoint(use_reentrant=False)``, what FSDP2 /
    torchtitan / the proxies use) stops recomputing once every saved tensor is rebuilt, so the block's last
    matmul (down / fc2, ``2·h·f``) is not rerun, and counts matmul parameters only (norms cost no FLOPs).
    ``policy`` (selective): ``attention`` reruns QKᵀ and PV; ``torchtitan_op`` the unsaved mm's (wk, wo and,
    for SwiGLU, w3); ``matmul`` no matmul at all. The LM head sits outside every checkpointed block.
    """
    _check("recompute", recompute, RECOMPUTES)
    _check("policy", policy, SAC_POLICIES)
    _check("checkpoint_impl", checkpoint_impl, CHECKPOINT_IMPLS)
    h, kv, f, L = model.hidden, model.kv_dim, model.ffn_hidden, model.layers
    attn = 4.0 * L * attn_width(model) * seq_len  # forward QKᵀ + PV, causal counted as full
    if recompute == "full":
        if checkpoint_impl == "reentrant":
            return 2.0 * n_params_blocks(model) + attn
        per_tok = sum(block_matmul_flops(model, 1).values()) - 2 * h * f  # all but the last matmul
        return float(L * per_tok) + attn
    if recompute == "selective":
        if policy == "attention":
            return attn
        if policy == "torchtitan_op":  # mm #2 (wk), #4 (wo), #6 (w3; GELU's fc2 is never needed)
            return 2.0 * L * (h * kv + model.q_dim * h + (h * f if model.mlp == "swiglu" else 0))
        return 0.0
    return 0.0


def hardware_flops_per_token(model: ModelSpec, seq_len: int, recompute: str = "none") -> float:
    """Hardware FLOPs per token: model FLOPs plus the recomputed forward (Korthikanti 2022 HFU definition)."""
    return model_flops_per_token(model, seq_len) + recompute_flops_per_token(model, seq_len, recompute)




# ------------------------------------------------------------------------- exact per-matmul counts
def block_matmul_flops(model: ModelSpec, seq_len: int, micro_batch: int = 1) -> dict[str, int]:
    """Forward FLOPs of each weight matmul in one block, 2·tokens·in·out each (FlopCounterMode's 2mnk)."""
    t = seq_len * micro_batch
    h, kv, f, q = model.hidden, model.kv_dim, model.ffn_hidden, model.q_dim
    out = {"q": 2 * t * h * q, "k": 2 * t * h * kv, "v": 2 * t * h * kv, "o": 2 * t * q * h}
    if model.mlp == "swiglu":
        out |= {"gate": 2 * t * h * f, "up": 2 * t * h * f, "down": 2 * t * f * h}
    else:
        out |= {"fc1": 2 * t * h * f, "fc2": 2 * t * f * h}
    return out


def attention_core_flops(model: ModelSpec, seq_len: int, micro_batch: int = 1, mode: str = "full") -> float:
    """Forward FLOPs of QKᵀ and PV: 4·b·s²·h_attn if full (FlopCounterMode's sdpa_flop_count), half if causal."""
    _check("mode", mode, ATTN_FLOP_MODES)
    full = 4.0 * micro_batch * seq_len * seq_len * attn_width(model)
    return {"full": full, "causal": full / 2.0, "none": 0.0}[mode]


def block_forward_flops(model: ModelSpec, seq_len: int, micro_batch: int = 1, attention: str = "full") -> float:
    """Forward FLOPs of one block: its matmuls (2mnk) + the attention core counted per ``attention``.

    ``attention='full'`` matches ``torch.utils.flop_counter.FlopCounterMode`` for the CUDA flash /
    efficient / cuDNN SDPA kernels and for the CPU *math* backend (bmm's with a mask) — both count the
    full s² even with ``is_causal=True``. ``attention='none'`` matches FlopCounterMode on **CPU with the
    default SDPA dispatch** (torch 2.13): ``aten._scaled_dot_product_flash_attention_for_cpu`` has no
    flop formula registered, so only the ``aten.mm`` of the projections are counted (checked in
    tests/unit/model/test_flops.py). Elementwise ops (norms, RoPE, SiLU, softmax) are not counted by either.
    """
    return float(sum(block_matmul_flops(model, seq_len, micro_batch).values())) + attention_core_flops(
        model, seq_len, micro_batch, attention)


def lm_head_forward_flops(model: ModelSpec, seq_len: int, micro_batch: int = 1) -> float:
    """Forward FLOPs of the output projection: 2·b·s·h·V."""
    return 2.0 * micro_batch * seq_len * model.hidden * model.vocab


def model_forward_flops(model: ModelSpec, seq_len: int, micro_batch: int = 1, attention: str = "full") -> float:
    """Forward FLOPs of the whole model: L blocks + LM head (the embedding lookup costs no FLOPs)."""
    return model.layers * block_forward_flops(model, seq_len, micro_batch, attention) + lm_head_forward_flops(
        model, seq_len, micro_batch)


def model_train_step_flops(model: ModelSpec, seq_len: int, micro_batch: int = 1, attention: str = "full") -> float:
    """Forward + backward matmul FLOPs of one micro-batch: 3 × forward (backward = 2 × forward; Kaplan 2020 §2.1)."""
    return 3.0 * model_forward_flops(model, seq_len, micro_batch, attention)


def lora_train_step_flops(model: ModelSpec, seq_len: int, micro_batch: int, rank: int, targets: tuple[str, ...],
                          attention: str = "full") -> float:
    """Forward + backward matmul FLOPs of a LoRA micro-batch: frozen weights get no weight-gradient GEMM (Hu 2021 §4).

    Forward: the model's + each adapter's ``2·t·r·(in + out)``. Backward: every frozen matmul's input
    gradient (= its forward), except the first block's q/k/v, whose input needs no gradient (frozen
    embedding; assumes a q/k/v target); the attention core 2× forward; each adapter's grad B, grad (x·Aᵀ),
    grad A and grad x (the last not in the first block for q/k/v targets). Checked against FlopCounterMode.
    """
    _check("attention", attention, ATTN_FLOP_MODES)
    t = seq_len * micro_batch
    mm = block_matmul_flops(model, seq_len, micro_batch)
    fwd_mm = model.layers * sum(mm.values()) + lm_head_forward_flops(model, seq_len, micro_batch)
    core = model.layers * attention_core_flops(model, seq_len, micro_batch, attention)
    first_qkv = mm["q"] + mm["k"] + mm["v"]
    dims = lora_dims(model)
    ad_fwd = ad_bwd = 0.0
    for tg in targets:
        if tg == "gate" and model.mlp != "swiglu":
            continue
        i, o = dims[tg]
        ad_fwd += model.layers * 2.0 * t * rank * (i + o)
        ad_bwd += model.layers * 2.0 * t * rank * (2 * o + 2 * i) - (2.0 * t * rank * i if tg in ("q", "k", "v") else 0.0)
    return fwd_mm + ad_fwd + core + (fwd_mm - first_qkv) + ad_bwd + 2.0 * core


# --------------------------------------------------------------------- Megatron closed forms (GPT)
def narayanan_flops_per_iteration(B: float, s: float, L: float, h: float, V: float) -> float:
    """GPT FLOPs per iteration with full recompute: 96·B·s·l·h²·(1 + s/6h + V/16lh) (Narayanan 2021, arXiv 2104.04473, FLOPs of Table 1)."""
    return 96.0 * B * s * L * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * L * h))


def korthikanti_model_flops_per_iteration(B: float, s: float, L: float, h: float, V: float) -> float:
    """GPT model FLOPs per iteration: 72·B·L·s·h²·(1 + s/6h + V/12hL) (Korthikanti 2022, arXiv 2205.05198, MFU of Table 5)."""
    return 72.0 * B * L * s * h * h * (1.0 + s / (6.0 * h) + V / (12.0 * h * L))


def nemo_llama_model_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """NeMo's model FLOPs per token for Llama-style blocks: L·h²·(12 + 12·g/a + 18·f/h + 12·s/h + 6·V/(L·h)), g/a the
    KV-head share, f the SwiGLU width (NeMo ``nemo/utils/flops_formulas.py``, ``llama2``; its "model TFLOP/s per GPU"
    in docs/source/performance). Attention counted full, as ``model_flops_per_token``. It reproduces every Llama
    row of nemo_24.07_H100_fp8.csv (model TFLOP/s ÷ tokens/s) to 0.1% (tests/unit/published/test_nemo_longseq.py)."""
    L, h = model.layers, model.hidden
    return float(L * h * h * (12.0 + 12.0 * model.kv_heads / model.heads + 18.0 * model.ffn_hidden / h
                              + 12.0 * seq_len / h + 6.0 * model.vocab / (L * h)))


# ----------------------------------------------------------------------------------- utilisation
def mfu(tokens_per_s_per_gpu: float, model: ModelSpec, seq_len: int, peak_flops: float) -> float:
    """Model FLOPs utilisation: tokens/s/GPU · model_flops_per_token / peak (Chowdhery 2022, App. B)."""
    if not peak_flops > 0:
        raise ConfigError("peak_flops", peak_flops, "must be a positive number of FLOP/s")
    return tokens_per_s_per_gpu * model_flops_per_token(model, seq_len) / peak_flops


def hfu(tokens_per_s_per_gpu: float, model: ModelSpec, seq_len: int, peak_flops: float,
        recompute: str = "none") -> float:
    """Hardware FLOPs utilisation: counts recomputed forwards too (Korthikanti 2022 HFU definition)."""
    if not peak_flops > 0:
        raise ConfigError("peak_flops", peak_flops, "must be a positive number of FLOP/s")
    return tokens_per_s_per_gpu * hardware_flops_per_token(model, seq_len, recompute) / peak_flops
