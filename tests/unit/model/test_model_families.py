"""Model families from Hugging Face config.json: every dense family the planner models has its published
parameter count; what it does not model (MoE, encoder-decoder, multimodal, unknown model_type, biases on
attention only) is refused with one ConfigError naming the field.

Each config below is the published config.json's architecture fields, typed in (source URL in the comment);
the expected count is the model's published parameter count (the Hugging Face model page / transformers'
``num_parameters()``), and ``hand_count`` recomputes it from the raw fields by a separate formula.
"""

import json
from dataclasses import replace

import pytest

from trainplan.model.arch import ModelSpec, model_from_hf_config, model_from_hf_dict, resolve_model
from trainplan.model.base import ConfigError

LLAMA = dict(model_type="llama", hidden_act="silu", rms_norm_eps=1e-5, rope_theta=10000.0)

FAMILIES = {
    # https://huggingface.co/meta-llama/Llama-2-7b-hf/blob/main/config.json
    "llama2-7b": ({**LLAMA, "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                   "num_key_value_heads": 32, "intermediate_size": 11008, "vocab_size": 32000,
                   "max_position_embeddings": 4096, "tie_word_embeddings": False}, 6_738_415_616),
    # https://huggingface.co/meta-llama/Llama-2-13b-hf/blob/main/config.json
    "llama2-13b": ({**LLAMA, "num_hidden_layers": 40, "hidden_size": 5120, "num_attention_heads": 40,
                    "num_key_value_heads": 40, "intermediate_size": 13824, "vocab_size": 32000,
                    "max_position_embeddings": 4096, "tie_word_embeddings": False}, 13_015_864_320),
    # https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json
    "llama3-8b": ({**LLAMA, "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                   "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
                   "max_position_embeddings": 8192, "tie_word_embeddings": False, "rope_theta": 500000.0},
                  8_030_261_248),
    # https://huggingface.co/meta-llama/Llama-3.1-70B/blob/main/config.json
    "llama3.1-70b": ({**LLAMA, "num_hidden_layers": 80, "hidden_size": 8192, "num_attention_heads": 64,
                      "num_key_value_heads": 8, "intermediate_size": 28672, "vocab_size": 128256,
                      "max_position_embeddings": 131072, "tie_word_embeddings": False, "attention_bias": False,
                      "mlp_bias": False, "rope_scaling": {"factor": 8.0, "rope_type": "llama3"}}, 70_553_706_496),
    # https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json (tied, head_dim given)
    "llama3.2-1b": ({**LLAMA, "num_hidden_layers": 16, "hidden_size": 2048, "num_attention_heads": 32,
                     "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 8192, "vocab_size": 128256,
                     "max_position_embeddings": 131072, "tie_word_embeddings": True}, 1_235_814_400),
    # https://huggingface.co/meta-llama/Llama-3.2-3B/blob/main/config.json
    "llama3.2-3b": ({**LLAMA, "num_hidden_layers": 28, "hidden_size": 3072, "num_attention_heads": 24,
                     "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 8192, "vocab_size": 128256,
                     "max_position_embeddings": 131072, "tie_word_embeddings": True}, 3_212_749_824),
    # https://huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json (sliding_window 4096 on every layer)
    "mistral-7b-v0.1": ({"model_type": "mistral", "num_hidden_layers": 32, "hidden_size": 4096,
                         "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
                         "vocab_size": 32000, "max_position_embeddings": 32768, "sliding_window": 4096,
                         "tie_word_embeddings": False}, 7_241_732_096),
    # https://huggingface.co/mistralai/Mistral-7B-v0.3/blob/main/config.json (no sliding window)
    "mistral-7b-v0.3": ({"model_type": "mistral", "num_hidden_layers": 32, "hidden_size": 4096,
                         "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
                         "vocab_size": 32768, "max_position_embeddings": 32768, "sliding_window": None,
                         "tie_word_embeddings": False}, 7_248_023_552),
    # https://huggingface.co/Qwen/Qwen2-7B/blob/main/config.json (q/k/v biases)
    "qwen2-7b": ({"model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584, "num_attention_heads": 28,
                  "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064,
                  "max_position_embeddings": 131072, "use_sliding_window": False, "sliding_window": 131072,
                  "tie_word_embeddings": False}, 7_615_616_512),
    # https://huggingface.co/Qwen/Qwen2-0.5B/blob/main/config.json (tied)
    "qwen2-0.5b": ({"model_type": "qwen2", "num_hidden_layers": 24, "hidden_size": 896, "num_attention_heads": 14,
                    "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
                    "max_position_embeddings": 131072, "use_sliding_window": False, "sliding_window": 131072,
                    "tie_word_embeddings": True}, 494_032_768),
    # https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json (q/k norms, head_dim 128)
    "qwen3-8b": ({"model_type": "qwen3", "num_hidden_layers": 36, "hidden_size": 4096, "num_attention_heads": 32,
                  "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936,
                  "max_position_embeddings": 40960, "attention_bias": False, "tie_word_embeddings": False,
                  "use_sliding_window": False}, 8_190_735_360),
    # https://huggingface.co/Qwen/Qwen3-0.6B/blob/main/config.json (head_dim 128 ≠ 1024/16)
    "qwen3-0.6b": ({"model_type": "qwen3", "num_hidden_layers": 28, "hidden_size": 1024, "num_attention_heads": 16,
                    "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151936,
                    "max_position_embeddings": 40960, "attention_bias": False, "tie_word_embeddings": True,
                    "use_sliding_window": False}, 596_049_920),
    # https://huggingface.co/google/gemma-7b/blob/main/config.json (head_dim 256 ≠ 3072/16; tied by default)
    "gemma-7b": ({"model_type": "gemma", "num_hidden_layers": 28, "hidden_size": 3072, "num_attention_heads": 16,
                  "num_key_value_heads": 16, "head_dim": 256, "intermediate_size": 24576, "vocab_size": 256000,
                  "max_position_embeddings": 8192, "hidden_act": "gelu"}, 8_537_680_896),
    # https://huggingface.co/google/gemma-2b/blob/main/config.json
    "gemma-2b": ({"model_type": "gemma", "num_hidden_layers": 18, "hidden_size": 2048, "num_attention_heads": 8,
                  "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 16384, "vocab_size": 256000,
                  "max_position_embeddings": 8192}, 2_506_172_416),
    # https://huggingface.co/google/gemma-2-2b/blob/main/config.json (4 norms per block)
    "gemma2-2b": ({"model_type": "gemma2", "num_hidden_layers": 26, "hidden_size": 2304, "num_attention_heads": 8,
                   "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 9216, "vocab_size": 256000,
                   "max_position_embeddings": 8192, "sliding_window": 4096}, 2_614_341_888),
    # https://huggingface.co/google/gemma-2-9b/blob/main/config.json
    "gemma2-9b": ({"model_type": "gemma2", "num_hidden_layers": 42, "hidden_size": 3584, "num_attention_heads": 16,
                   "num_key_value_heads": 8, "head_dim": 256, "intermediate_size": 14336, "vocab_size": 256000,
                   "max_position_embeddings": 8192, "sliding_window": 4096}, 9_241_705_984),
    # https://huggingface.co/google/gemma-2-27b/blob/main/config.json
    "gemma2-27b": ({"model_type": "gemma2", "num_hidden_layers": 46, "hidden_size": 4608, "num_attention_heads": 32,
                    "num_key_value_heads": 16, "head_dim": 128, "intermediate_size": 36864, "vocab_size": 256000,
                    "max_position_embeddings": 8192, "sliding_window": 4096}, 27_227_128_320),
    # https://huggingface.co/google/gemma-3-1b-pt/blob/main/config.json (4 norms + q/k norms)
    "gemma3-1b": ({"model_type": "gemma3_text", "num_hidden_layers": 26, "hidden_size": 1152,
                   "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 6912,
                   "vocab_size": 262144, "max_position_embeddings": 32768, "sliding_window": 512}, 999_885_952),
    # https://huggingface.co/openai-community/gpt2/blob/main/config.json (learned positions, biases, tied)
    "gpt2": ({"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "n_inner": None,
              "vocab_size": 50257, "n_positions": 1024, "activation_function": "gelu_new"}, 124_439_808),
    # https://huggingface.co/EleutherAI/pythia-160m/blob/main/config.json (GPT-NeoX, untied)
    "pythia-160m": ({"model_type": "gpt_neox", "num_hidden_layers": 12, "hidden_size": 768,
                     "num_attention_heads": 12, "intermediate_size": 3072, "vocab_size": 50304,
                     "max_position_embeddings": 2048, "tie_word_embeddings": False}, 162_322_944),
}


def hand_count(c: dict) -> int:
    """Published-count formula straight from the raw config.json fields (independent of ModelSpec)."""
    mt = c["model_type"]
    if mt == "gpt2":
        h, L, V = c["n_embd"], c["n_layer"], c["vocab_size"]
        block = (3 * h * h + 3 * h) + (h * h + h) + (h * 4 * h + 4 * h) + (4 * h * h + h) + 2 * 2 * h
        return L * block + V * h + c["n_positions"] * h + 2 * h
    if mt == "gpt_neox":
        h, L, V, f = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["intermediate_size"]
        block = (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h
        return L * block + 2 * V * h + 2 * h
    h, L, V, f = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["intermediate_size"]
    a, kv = c["num_attention_heads"], c["num_key_value_heads"]
    d = c.get("head_dim") or h // a
    q_out, kv_out = a * d, kv * d
    block = h * q_out + 2 * h * kv_out + q_out * h + 3 * h * f
    block += (4 if mt in ("gemma2", "gemma3_text") else 2) * h
    block += 2 * d if mt in ("qwen3", "gemma3_text") else 0
    block += q_out + 2 * kv_out if mt == "qwen2" else 0
    tied = c.get("tie_word_embeddings", mt.startswith("gemma"))
    return L * block + (1 if tied else 2) * V * h + h


@pytest.mark.parametrize("name", list(FAMILIES))
def test_published_parameter_count(name, tmp_path):
    cfg, published = FAMILIES[name]
    assert hand_count(cfg) == published  # the formula reproduces the published number
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**cfg, "_name_or_path": name}))
    m = model_from_hf_config(p)
    assert m.n_params == published, f"{name}: {m.n_params:,} != {published:,}"
    assert m.name == name
    assert resolve_model(str(p)).n_params == published
    assert resolve_model(str(tmp_path)).n_params == published  # a directory holding config.json


def test_head_dim_is_honoured_everywhere_it_counts():
    cfg, _ = FAMILIES["gemma-7b"]
    m = model_from_hf_dict(cfg)
    assert m.head_dim == 256 and m.q_dim == 4096 and m.kv_dim == 4096 and m.hidden == 3072
    from trainplan.model.flops import attn_width

    assert attn_width(m) == 16 * 256  # QKᵀ/PV width: heads · head_dim, not hidden
    # head_dim equal to hidden/heads is the default spelled out: the same spec as without it
    a = model_from_hf_dict(FAMILIES["llama3.2-1b"][0])
    b = model_from_hf_dict({k: v for k, v in FAMILIES["llama3.2-1b"][0].items() if k != "head_dim"})
    assert a == b and a.head_dim_override is None


def test_sliding_window_recorded_only_when_every_layer_is_windowed():
    assert model_from_hf_dict(FAMILIES["mistral-7b-v0.1"][0]).sliding_window == 4096
    assert model_from_hf_dict(FAMILIES["mistral-7b-v0.3"][0]).sliding_window is None
    assert model_from_hf_dict(FAMILIES["qwen2-7b"][0]).sliding_window is None  # use_sliding_window false
    assert model_from_hf_dict(FAMILIES["gemma2-9b"][0]).sliding_window is None  # interleaved with global layers
    swa = {**FAMILIES["qwen2-7b"][0], "use_sliding_window": True, "sliding_window": 4096}
    assert model_from_hf_dict(swa).sliding_window == 4096


def test_config_model_mapping_accepts_head_dim():
    m = resolve_model({"layers": 2, "hidden": 3072, "heads": 16, "head_dim": 256, "vocab": 1000})
    assert m.head_dim == 256 and m.q_dim == 4096
    with pytest.raises(ConfigError, match="head_dim"):
        ModelSpec(layers=2, hidden=3072, heads=16, vocab=10, head_dim_override=0)


MIXTRAL = {"model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000, "num_local_experts": 8,
           "num_experts_per_tok": 2, "sliding_window": None}


@pytest.mark.parametrize("cfg, field", [
    (MIXTRAL, "num_local_experts"),  # https://huggingface.co/mistralai/Mixtral-8x7B-v0.1 (46.7B total)
    ({**FAMILIES["qwen2-7b"][0], "model_type": "qwen2_moe", "num_experts": 60}, "num_experts"),
    ({**FAMILIES["llama2-7b"][0], "model_type": "deepseek_v3", "n_routed_experts": 256}, "n_routed_experts"),
    ({"model_type": "t5", "is_encoder_decoder": True, "d_model": 512}, "is_encoder_decoder"),
    ({"model_type": "gemma3", "text_config": {"hidden_size": 2560}, "vision_config": {}}, "vision_config"),
    ({"model_type": "mamba", "num_hidden_layers": 64, "hidden_size": 2560}, "model_type"),  # state space, not attention
    ({"model_type": "bert"}, "model_type"),
    ({"num_hidden_layers": 2}, "model_type"),
    ({**FAMILIES["llama2-7b"][0], "attention_bias": True}, "attention_bias"),
    ({**FAMILIES["qwen3-8b"][0], "attention_bias": True}, "attention_bias"),
    ({**FAMILIES["llama2-7b"][0], "num_hidden_layers": "32"}, "num_hidden_layers"),
    ({**FAMILIES["llama2-7b"][0], "hidden_size": 10**30}, "hidden_size"),
    ({**FAMILIES["llama2-7b"][0], "vocab_size": True}, "vocab_size"),
    ({**FAMILIES["gpt2"][0], "n_layer": None}, "n_layer"),
    ({"model_type": "stablelm", "qk_layernorm": True, "num_hidden_layers": 40, "hidden_size": 5120,
      "num_attention_heads": 32, "intermediate_size": 13824, "vocab_size": 100352}, "qk_layernorm"),  # StableLM 2 12B
])
def test_unmodelled_architectures_refused_naming_the_field(cfg, field):
    with pytest.raises(ConfigError) as e:
        model_from_hf_dict(cfg)
    assert e.value.key == f"config.json:{field}", e.value
    assert "\n" not in str(e.value)


def test_gpt2_is_planned_not_reported_missing_num_hidden_layers():
    m = model_from_hf_dict(FAMILIES["gpt2"][0])
    assert (m.mlp, m.norm, m.pos_embedding, m.bias, m.tied_embeddings, m.max_seq_len) == (
        "gelu", "layernorm", "learned", "all", True, 1024)


def test_mpt_uses_alibi_positions():
    m = model_from_hf_dict({"model_type": "mpt", "d_model": 4096, "n_layers": 32, "n_heads": 32,
                            "expansion_ratio": 4, "vocab_size": 50432, "max_seq_len": 2048})
    assert m.pos_embedding == "alibi" and m.n_params_embedding == 50432 * 4096  # alibi has no parameters


# Families whose reference configs are transformers' own config-class defaults (no number typed in here), with the
# switches that change the count: transformers builds each on the meta device and counts its parameters.
REFERENCE_DEFAULTS = {
    "phi3": {},  # Phi3Config(): Phi-3-mini's shape (fused qkv and gate·up)
    "phi3-gqa": {"model_type": "phi3", "num_key_value_heads": 8, "tie_word_embeddings": True},
    "starcoder2": {},  # GQA, biased linears and LayerNorms, 2-matrix GELU MLP, tied
    "starcoder2-nobias": {"model_type": "starcoder2", "use_bias": False, "tie_word_embeddings": False},
    "gpt_bigcode": {},  # multi-query: one K/V head
    "gpt_bigcode-mha": {"model_type": "gpt_bigcode", "multi_query": False, "n_inner": 2048},
    "mpt": {},  # no_bias: LayerNorms with a weight only, no linear biases
    "opt": {},  # OPT-125m's shape: learned positions with 2 extra rows, biases, ReLU MLP, tied
    "opt-nobias": {"model_type": "opt", "enable_bias": False, "tie_word_embeddings": False},
    "falcon": {},  # Falcon-7B's shape: parallel attention, multi-query, one LayerNorm per block, 71 heads
    "falcon-new": {"model_type": "falcon", "new_decoder_architecture": True, "hidden_size": 8192,  # 40B's shape
                   "num_attention_heads": 128, "num_kv_heads": 8, "num_hidden_layers": 60},
    "falcon-rw": {"model_type": "falcon", "parallel_attn": False, "multi_query": False, "bias": True, "alibi": True},
    "cohere": {},  # Command R's shape: one weight-only LayerNorm per (parallel) block, tied
    "cohere-gqa": {"model_type": "cohere", "num_key_value_heads": 8, "tie_word_embeddings": False},
    "cohere-qk-norm": {"model_type": "cohere", "use_qk_norm": True, "num_key_value_heads": 8},  # Command R+: a q/k
    # LayerNorm weight row per head (qk_norm_scope each_head)
    "cohere2": {},  # interleaved windowed / global layers: full attention planned (the global layers' work)
    "olmo2": {},  # q/k RMSNorms over the whole projections, norms after attention and MLP
    "olmo2-gqa": {"model_type": "olmo2", "num_key_value_heads": 8, "tie_word_embeddings": True},
    "phi": {},  # Phi-2's shape: parallel block, one biased LayerNorm, every linear and the LM head biased
    "phi-qk": {"model_type": "phi", "qk_layernorm": True, "num_key_value_heads": 8},
    "gptj": {},  # GPT-J-6B's shape: biases on the MLP and the LM head only
    "llama-mlp-bias": {"model_type": "llama", "mlp_bias": True},  # bias kind 'mlp' (was refused)
    "gpt_neo": {},  # GPT-Neo 1.3B's shape: unbiased q/k/v, biased o and MLP (bias kind o_mlp), learned positions, tied
    "gpt_neo-125m": {"model_type": "gpt_neo", "num_layers": 12, "hidden_size": 768, "num_heads": 12,
                     "attention_types": [[["global", "local"], 6]], "attention_layers": ["global", "local"] * 6},
    "stablelm": {},  # StableLM-3B-4E1T's shape: biased LayerNorms, gated SiLU MLP, untied
    "stablelm-qkv-parallel": {"model_type": "stablelm", "use_qkv_bias": True, "use_parallel_residual": True,
                              "num_key_value_heads": 8},  # q/k/v biases; one LayerNorm per (parallel) block
    "granite": {},  # Llama's shape with activation multipliers (no parameters)
    "granite-bias": {"model_type": "granite", "attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True},
    "smollm3": {},  # Llama-shaped, GQA, tied; NoPE layers have no parameters
    "olmo3": {},  # OLMo 2's block (q/k norms over the whole projections, post-norms)
    "olmo3-gqa": {"model_type": "olmo3", "num_key_value_heads": 8},
    "bloom": {},  # ALiBi, a LayerNorm after the word embedding (embed_norm), biases everywhere, tied
    "bloom-560m": {"model_type": "bloom", "n_layer": 24, "hidden_size": 1024, "n_head": 16},  # 559,214,592
}


def _transformers_count(cfg: dict) -> int:
    """Parameters of transformers' own model for ``cfg``, built on the meta device (no memory, no weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    c = AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "rope_scaling"})  # rope_scaling: no params
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(c)
    return sum(p.numel() for p in m.parameters())


def _reference_config(name: str) -> dict:
    from transformers import AutoConfig

    over = dict(REFERENCE_DEFAULTS[name])
    mt = over.pop("model_type", name)
    return {**AutoConfig.for_model(mt).to_dict(), **over, "model_type": mt}


@pytest.mark.parametrize("name", list(FAMILIES) + list(REFERENCE_DEFAULTS))
def test_count_equals_transformers_reference_implementation(name):
    """An independent check of every count: transformers' model class for the same config.json, on meta."""
    cfg = FAMILIES[name][0] if name in FAMILIES else _reference_config(name)
    m = model_from_hf_dict(cfg)
    assert m.n_params == _transformers_count(cfg), name
    from trainplan.model import memory

    per = memory.layer_matmul_params_per_rank(m, 1) + memory.layer_other_params_per_rank(m, 1)
    assert float(per) == m.n_params_per_layer


def test_new_families_read_their_architecture():
    sc2 = model_from_hf_dict({**_reference_config("starcoder2"), "sliding_window": 4096})
    assert (sc2.mlp, sc2.norm, sc2.bias, sc2.pos_embedding, sc2.kv_heads, sc2.sliding_window) == (
        "gelu", "layernorm", "all", "rope", 2, 4096)
    big = model_from_hf_dict(_reference_config("gpt_bigcode"))
    assert (big.kv_heads, big.pos_embedding, big.bias, big.tied_embeddings) == (1, "learned", "all", True)
    phi = model_from_hf_dict({**_reference_config("phi3"), "sliding_window": 2047})
    assert (phi.mlp, phi.norm, phi.sliding_window, phi.tied_embeddings) == ("swiglu", "rmsnorm", 2047, False)
    olmo = model_from_hf_dict(_reference_config("olmo2-gqa"))
    assert (olmo.qk_norm, olmo.qk_norm_scope, olmo.qk_norm_features) == (True, "full", olmo.q_dim + olmo.kv_dim)
    gptj = model_from_hf_dict(_reference_config("gptj"))
    assert (gptj.bias, gptj.head_bias, gptj.norms_per_layer, gptj.tied_embeddings) == ("mlp", True, 1, False)
    phi = model_from_hf_dict(_reference_config("phi-qk"))
    assert (phi.bias, phi.head_bias, phi.qk_norm, phi.qk_norm_scope, phi.kv_heads) == ("all", True, True, "head", 8)
    mpt = model_from_hf_dict(_reference_config("mpt"))
    assert (mpt.norm, mpt.norm_bias, mpt.bias) == ("layernorm", False, "none")
    # transformers' MptModel hard-codes no_bias and a 4h MLP (every MPT checkpoint on the Hub has both); llm-foundry's
    # own MPT, which trained them, honours the two fields, and so does the planner
    biased = model_from_hf_dict({**_reference_config("mpt"), "no_bias": False, "expansion_ratio": 3})
    assert (biased.norm_bias, biased.bias, biased.ffn_hidden) == (True, "all", 3 * biased.hidden)


def test_opt_and_falcon_read_their_architecture():
    opt = model_from_hf_dict(_reference_config("opt"))
    assert (opt.pos_embedding, opt.pos_offset, opt.max_seq_len, opt.mlp, opt.bias, opt.tied_embeddings) == (
        "learned", 2, 2048, "gelu", "all", True)
    assert opt.n_params_embedding == (opt.vocab + opt.max_seq_len + 2) * opt.hidden
    f7 = model_from_hf_dict(_reference_config("falcon"))
    assert (f7.kv_heads, f7.norms_per_layer, f7.bias, f7.pos_embedding, f7.head_dim) == (1, 1, "none", "rope", 64)
    f40 = model_from_hf_dict(_reference_config("falcon-new"))
    assert (f40.kv_heads, f40.norms_per_layer) == (8, 2)
    rw = model_from_hf_dict(_reference_config("falcon-rw"))
    assert (rw.kv_heads, rw.norms_per_layer, rw.bias, rw.pos_embedding) == (rw.heads, 2, "all", "alibi")


def test_cohere_reads_its_weight_only_layernorm():
    m = model_from_hf_dict(_reference_config("cohere"))
    assert (m.norm, m.norm_bias, m.norms_per_layer, m.mlp, m.tied_embeddings) == ("layernorm", False, 1, "swiglu", True)
    assert model_from_hf_dict(_reference_config("cohere2")).sliding_window is None
    rplus = model_from_hf_dict({**_reference_config("cohere"), "use_qk_norm": True})  # Command R+
    assert (rplus.qk_norm, rplus.qk_norm_scope, rplus.qk_norm_features) == (True, "each_head", rplus.q_dim + rplus.kv_dim)
    with pytest.raises(ConfigError) as e:
        model_from_hf_dict({**_reference_config("cohere"), "attention_bias": True})  # q/k/v/o only: not modelled
    assert e.value.key == "config.json:attention_bias"


@pytest.mark.parametrize("over, field", [
    ({"word_embed_proj_dim": 512}, "word_embed_proj_dim"),  # OPT-350m's projection
    ({"do_layer_norm_before": False}, "do_layer_norm_before"),  # OPT-350m's post-LN
    ({"layer_norm_elementwise_affine": False}, "layer_norm_elementwise_affine"),
])
def test_opt_variants_it_does_not_model_are_refused_by_field(over, field):
    with pytest.raises(ConfigError) as e:
        model_from_hf_dict({**_reference_config("opt"), **over})
    assert e.value.key == f"config.json:{field}"


def test_layernorm_without_bias_counts_its_weight_only():
    """MPT's no_bias LayerNorm: one parameter per feature (the 7B's published 6,649,286,656 would be 266,240
    higher with biased norms); RMSNorm has no bias whatever norm_bias says."""
    kw = dict(layers=32, hidden=4096, heads=32, vocab=50432, mlp="gelu", norm="layernorm", pos_embedding="alibi",
              tied_embeddings=True)
    a, b = ModelSpec(**kw), ModelSpec(**kw, norm_bias=False)
    assert a.n_params - b.n_params == (2 * 32 + 1) * 4096
    r = dict(kw, norm="rmsnorm")
    assert ModelSpec(**r).n_params == ModelSpec(**r, norm_bias=False).n_params
    with pytest.raises(ConfigError, match="norm_bias"):
        ModelSpec(**kw, norm_bias="no")


@pytest.mark.parametrize("name", list(FAMILIES))
def test_memory_parameter_terms_match_the_count(name):
    """Weights/gradients/optimizer memory rest on per-rank parameter counts: at tp=1 they add up to the
    exact block count (head_dim, sandwich norms and q/k norms included)."""
    from trainplan.model import memory

    m = model_from_hf_dict(FAMILIES[name][0])
    per = memory.layer_matmul_params_per_rank(m, 1) + memory.layer_other_params_per_rank(m, 1)
    assert float(per) == m.n_params_per_layer


def test_lora_dims_use_the_attention_width():
    from trainplan.model.flops import lora_dims

    m = model_from_hf_dict(FAMILIES["gemma-7b"][0])
    assert lora_dims(m)["q"] == (3072, 4096) and lora_dims(m)["o"] == (4096, 3072)


def test_qk_norm_scopes_split_and_save_as_their_weights_and_statistics():
    """Under TP, shared per-head q/k norm weights (Qwen3) are replicated; whole-projection (OLMo 2) and per-head-own
    (Command R+) weights are split with q and k. Statistics: one per head unless the norm spans the projection."""
    from trainplan.model import memory

    base = ModelSpec(layers=2, hidden=512, heads=8, kv_heads=4, vocab=100, norm="layernorm", norm_bias=False,
                     qk_norm=True)
    shared, full, own = (replace(base, qk_norm_scope=k) for k in ("head", "full", "each_head"))
    blocks = base.norms_per_layer * base.hidden
    assert memory.layer_other_params_per_rank(shared, 4) == blocks + 2 * base.head_dim
    assert memory.layer_other_params_per_rank(own, 4) == memory.layer_other_params_per_rank(full, 4) == (
        blocks + base.q_dim / 4 + base.kv_dim / 4)
    q, kv = base.q_dim / 4, base.kv_dim / 4
    stats = 2 * 4  # LayerNorm: mean and rstd in fp32
    assert memory._qk_norm_bytes(own, 2, "fused", False, q, kv) == (q + kv) * 2 + (q + kv) / base.head_dim * stats
    assert memory._qk_norm_bytes(full, 2, "fused", False, q, kv) == (q + kv) * 2 + 2 * stats


def _hf_cache_snapshot(cache, repo_id: str, cfg: dict, rev: str = "0123456789abcdef0123456789abcdef01234567"):
    """A Hugging Face hub cache entry as huggingface_hub lays it out: refs/main → snapshots/<rev>/config.json."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(rev)
    snap = repo / "snapshots" / rev
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(cfg))


def test_hugging_face_repo_id_read_from_the_local_cache_only(tmp_path, monkeypatch):
    """``--model org/name`` reads that repo's config.json from the local hub cache (HF_HUB_CACHE), named after the
    repo; a repo that is not cached is one ConfigError saying how to fetch it (no network)."""
    pytest.importorskip("huggingface_hub")
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path))
    cfg, published = FAMILIES["qwen2-7b"]
    _hf_cache_snapshot(tmp_path, "Qwen/Qwen2-7B", cfg)
    m = resolve_model("Qwen/Qwen2-7B")
    assert (m.name, m.n_params) == ("Qwen/Qwen2-7B", published)
    with pytest.raises(ConfigError) as e:
        resolve_model("Qwen/Qwen2-72B")
    assert e.value.key == "model" and "hf download Qwen/Qwen2-72B config.json" in str(e.value)
    with pytest.raises(ConfigError, match="repo id"):
        resolve_model("not a model")
