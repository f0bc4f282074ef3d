"""LoRA (Hu et al. 2021, arXiv 2106.09685): frozen base weights, trainable low-rank adapters B·A.

``apply_lora`` swaps chosen projections for :class:`LoRALinear` *before* parallelisation, so FSDP2 shards
base weights and adapters alike (frozen and trainable parameters may share an FSDP2 unit).
Trainable parameters per adapted projection: ``r·(in + out)``; see :func:`lora_trainable_params`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from trainplan.model.arch import ModelSpec
from trainplan.model.base import ConfigError
from trainplan.model.training import LORA_TARGETS

# LoRA target name → attribute path inside a TransformerBlock
TARGET_PATHS = {"q": "attention.wq", "k": "attention.wk", "v": "attention.wv", "o": "attention.wo",
                "gate": "feed_forward.w1", "up": "feed_forward.w3", "down": "feed_forward.w2"}


class LoRALinear(nn.Module):
    """y = base(x) + (α/r)·B(A(x)); B starts at zero, so step 0 equals the base model exactly."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float | None = None):
        super().__init__()
        self.base = base
        self.base.requires_grad_(False)
        dev = base.weight.device
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features, device=dev))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank, device=dev))
        if dev.type != "meta":
            nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.scale = (alpha if alpha is not None else 2.0 * rank) / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_a.t() @ self.lora_b.t()) * self.scale


def apply_lora(model: nn.Module, rank: int, targets: tuple[str, ...] | list[str], seed: int = 0) -> None:
    """Freeze every parameter, then wrap the target projections of every block with a LoRA adapter."""
    bad = [t for t in targets if t not in LORA_TARGETS]
    if bad or not targets:
        raise ConfigError("lora_targets", list(targets), "a non-empty subset of " + ", ".join(LORA_TARGETS))
    if rank < 1:
        raise ConfigError("lora_rank", rank, "must be a positive integer")
    model.requires_grad_(False)
    torch.manual_seed(seed)
    for block in model.layers.values():
        for t in targets:
            parent_path, attr = TARGET_PATHS[t].split(".")
            parent = getattr(block, parent_path)
            setattr(parent, attr, LoRALinear(getattr(parent, attr), rank))


def lora_trainable_params(spec: ModelSpec, rank: int, targets: tuple[str, ...] | list[str]) -> int:
    """r·(in + out) per adapted projection per layer (Hu et al. 2021, §4.1)."""
    h, kv, f = spec.hidden, spec.kv_dim, spec.ffn_hidden
    shapes = {"q": (h, h), "k": (h, kv), "v": (h, kv), "o": (h, h), "gate": (h, f), "up": (h, f), "down": (f, h)}
    return spec.layers * sum(rank * sum(shapes[t]) for t in targets)
