"""A Llama-architecture decoder sized from a :class:`~trainplan.model.arch.ModelSpec`.

RMSNorm (or LayerNorm), RoPE (or learned positions), grouped-query attention through
``F.scaled_dot_product_attention(is_causal=True)``, SwiGLU (or GELU) MLP, tied or untied embeddings.
Module names follow torchtitan's Llama (``tok_embeddings``, ``layers.{i}.attention.wq``, ``feed_forward.w1``,
``norm``, ``output``) so that TP plans and FSDP wrapping read the same. The parameter count equals
``ModelSpec.n_params`` exactly (tested for every preset on the meta device).

Attention heads are derived from the *local* width of ``wq``/``wk`` so that the same forward works after
tensor parallelism has split the projections column-wise (each rank holds ``heads/tp`` heads).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainplan.model.arch import ROPE_THETA, ModelSpec, hf_config_dict


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019), as in Llama; fp32 statistics."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def _norm(spec: ModelSpec) -> nn.Module:
    return RMSNorm(spec.hidden) if spec.norm == "rmsnorm" else nn.LayerNorm(spec.hidden, bias=spec.norm_bias)


def rope_cos_sin(seq_len: int, head_dim: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """cos/sin tables of rotary embeddings (Su et al. 2021, RoFormer eq. 34), shape (seq, head_dim/2)."""
    inv = 1.0 / (ROPE_THETA ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    ang = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) of x (b, s, n, d) by the position angle (interleaved, as Meta's Llama)."""
    x2 = x.unflatten(-1, (-1, 2))
    a, b = x2[..., 0], x2[..., 1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        h, kv = spec.hidden, spec.kv_dim
        qkv_bias = spec.qkv_bias
        self.head_dim = spec.head_dim
        self.rope = spec.pos_embedding == "rope"
        self.wq = nn.Linear(h, h, bias=qkv_bias)
        self.wk = nn.Linear(h, kv, bias=qkv_bias)
        self.wv = nn.Linear(h, kv, bias=qkv_bias)
        self.wo = nn.Linear(h, h, bias=spec.o_bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        q = self.wq(x).view(b, s, -1, self.head_dim)  # -1: local heads after TP
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        if self.rope:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        h, f, bias = spec.hidden, spec.ffn_hidden, spec.mlp_bias
        self.swiglu = spec.mlp == "swiglu"
        self.w1 = nn.Linear(h, f, bias=bias)  # gate (swiglu) or up (gelu)
        self.w2 = nn.Linear(f, h, bias=bias)  # down
        if self.swiglu:
            self.w3 = nn.Linear(h, f, bias=bias)  # up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x)))


class TransformerBlock(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.attention_norm = _norm(spec)
        self.attention = Attention(spec)
        self.ffn_norm = _norm(spec)
        self.feed_forward = FeedForward(spec)

    def forward(self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """Decoder-only LM: tokens (b, s) int64 → logits (b, s, vocab)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.tok_embeddings = nn.Embedding(spec.vocab, spec.hidden)
        self.embed_norm = _norm(spec) if spec.embed_norm else None  # BLOOM's word_embeddings_layernorm
        self.pos_embeddings = (nn.Embedding(spec.max_seq_len + spec.pos_offset, spec.hidden)
                               if spec.pos_embedding == "learned" else None)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(spec) for i in range(spec.layers)})
        self.norm = _norm(spec)
        self.output = None if spec.tied_embeddings else nn.Linear(spec.hidden, spec.vocab, bias=spec.head_bias)
        self.output_bias = nn.Parameter(torch.zeros(spec.vocab)) if spec.tied_embeddings and spec.head_bias else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        s = tokens.shape[1]
        h = self.tok_embeddings(tokens)
        if self.embed_norm is not None:
            h = self.embed_norm(h)
        cos = sin = None
        if self.pos_embeddings is not None:
            # (1, s) positions: under TP the table's output is sequence-sharded like the token embedding's
            h = h + self.pos_embeddings((torch.arange(s, device=tokens.device) + self.spec.pos_offset)[None])
        else:
            cos, sin = rope_cos_sin(s, self.spec.head_dim, tokens.device, h.dtype)
        for layer in self.layers.values():
            h = layer(h, cos, sin)
        h = self.norm(h)
        if self.output is not None:
            return self.output(h)
        return F.linear(h, self.tok_embeddings.weight, self.output_bias)


def init_weights(model: Transformer, seed: int) -> None:
    """Deterministic init independent of layout: N(0, 0.02) for matrices, ones for norms, zeros for biases."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
            elif name.endswith("weight"):
                p.fill_(1.0)
            else:
                p.zero_()


MODEL_IMPLS = ("trainplan", "hf")


def build_model(spec: ModelSpec, *, device: str | torch.device = "cpu", seed: int = 0,
                impl: str = "trainplan") -> nn.Module:
    """The model on ``device`` ('meta' builds it without memory), seeded-initialised when not meta.

    ``impl='trainplan'``: the harness's own :class:`Transformer`; ``impl='hf'``: transformers'
    ``LlamaForCausalLM`` of the same ModelSpec (:class:`HFCausalLM`: tokens → logits, blocks at ``.layers``).
    """
    if impl == "hf":
        return HFCausalLM(spec, device=device, seed=seed)
    if impl != "trainplan":
        raise ValueError(f"impl={impl!r}: one of {MODEL_IMPLS}")
    with torch.device(device):
        m = Transformer(spec)
    if torch.device(device).type != "meta":
        init_weights(m, seed)
    return m


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# ------------------------------------------------------------------------ Hugging Face Llama (item 2)
HF_MODEL_TYPES = {"swiglu": "llama"}  # what a ModelSpec maps onto in transformers (no GELU/LayerNorm twin)


def build_hf_llama(spec: ModelSpec, *, device: str | torch.device = "cpu", seed: int = 0,
                   attn_implementation: str = "sdpa") -> nn.Module:
    """transformers' ``LlamaForCausalLM`` of the ModelSpec, random init (no download), same seeded init rule.

    Its parameter count equals ``ModelSpec.n_params`` exactly (tested); module names are Hugging Face's
    (``model.layers.{i}.self_attn.q_proj``, ``mlp.gate_proj``, ``lm_head``), the names the production
    checkpoint and the Accelerate config's ``LlamaDecoderLayer`` wrap use.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**{k: v for k, v in hf_config_dict(spec).items() if k not in ("architectures", "model_type",
                                                                                      "_name_or_path", "torch_dtype")})
    cfg._attn_implementation = attn_implementation
    with torch.device(device):
        m = LlamaForCausalLM(cfg)
    if torch.device(device).type != "meta":
        init_weights(m, seed)
    return m


class HFCausalLM(nn.Module):
    """transformers' ``LlamaForCausalLM`` behind the harness's interface: ``forward(tokens) -> logits``, the
    decoder blocks at ``.layers`` (the same modules as ``hf.model.layers``: FSDP2/AC wrap them there)."""

    def __init__(self, spec: ModelSpec, *, device: str | torch.device = "cpu", seed: int = 0):
        super().__init__()
        self.spec = spec
        self.hf = build_hf_llama(spec, device=device, seed=seed)

    @property
    def layers(self) -> nn.ModuleList:
        return self.hf.model.layers

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.hf(input_ids=tokens, use_cache=False).logits
