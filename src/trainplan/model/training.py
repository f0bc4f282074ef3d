"""What is trained and how: :class:`TrainingSpec` (sequence, batch, tokens, precision, optimizer and its kernels,
fine-tune kind, kernel class, attention implementation, selective-recompute policy, SP implementation)."""

from __future__ import annotations

from dataclasses import dataclass

from trainplan.model.base import ConfigError, one_of, positive_int, positive_num

# ------------------------------------------------------------------------------------------ training
FINETUNE_KINDS = ("full", "lora", "qlora")
# fp8-*: bf16 mixed precision with the block linears' GEMMs in FP8 (torchao Float8Linear recipes "tensorwise" /
# "rowwise", as torchtitan's float8 converter applies them; with kernels="fused", tensorwise is Transformer
# Engine's per-tensor delayed scaling, whose casts are fused: timing.te_fp8). Attention, norms, embeddings and the
# output projection stay bf16; weights and optimizer states keep the bf16 mixed-precision layout.
PRECISIONS = ("bf16", "fp8-tensorwise", "fp8-rowwise", "fp32")
FP8_RECIPES = {"fp8-tensorwise": "tensorwise", "fp8-rowwise": "rowwise"}
OPTIMIZERS = ("adamw", "sgd")
# Which AdamW kernels run the step (timing.optimizer_s, docs/timing-model.md §7.14): "fused" = one fused kernel per
# parameter group (torch.optim.AdamW(fused=True): torchtitan's default, what trainplan.train_entry runs; Megatron's and
# DeepSpeed's FusedAdam); "foreach" = PyTorch's multi-tensor ops, one pass per elementwise op (torch.optim.AdamW's
# default on CUDA: the proxy harness). Their HBM rates on Hopper are measured (timing.stream_frac).
OPTIMIZER_IMPLS = ("fused", "foreach")
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
# How the block's elementwise ops run (timing.py, docs/timing-model.md): "eager" = PyTorch eager ops
# (torchtitan / HF transformers without torch.compile), "compiled" = torch.compile (Inductor fuses the
# elementwise chains), "fused" = hand-fused kernels (Megatron-LM / Transformer Engine).
KERNEL_KINDS = ("eager", "compiled", "fused")
# Attention core: "flash" = FlashAttention/SDPA (no s×s matrix); "math" = materialised scores + softmax
# (Megatron-LM 2021/2022 before flash attention).
ATTN_IMPL_KINDS = ("flash", "math")
# Which flash kernel PyTorch's SDPA runs (timing.attention_kernel_rel, docs/timing-model.md §7.9): "fa2" =
# FlashAttention-2 (FLASH_ATTENTION; what the PyTorch runs the H100 fit rests on used: its rate), "cudnn" = cuDNN's
# attention (CUDNN_ATTENTION; what PyTorch 2.11 dispatched to on our H200), measured faster on Hopper only.
ATTN_KERNELS = ("fa2", "cudnn")
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
# How bf16 compute reaches the weights: "bf16_params" = the GEMMs read bf16 parameters (FSDP2's
# MixedPrecisionPolicy, Megatron's and DeepSpeed's bf16 models: what every production launch runs);
# "autocast" = ``torch.autocast`` over fp32 parameters (the proxy harness on one rank or dp = 1:
# ``proxy.schema.uses_autocast``): every linear casts its fp32 weight to bf16 on every micro-batch and saves the
# copy for backward, the residual stream (embedding output, norms, residual adds) stays fp32, and each linear
# casts the fp32 norm output it reads (docs/timing-model.md §7.10, docs/analytic-model.md §3.4).
BF16_VIA = ("bf16_params", "autocast")
# Which block code the elementwise kernels are those of: "auto" = the kernel class's (torchtitan / HF for eager and
# compiled: kernel-by-kernel RMSNorm, complex RoPE, repeat_kv for GQA; Megatron/TE for fused); "harness" = the proxy
# harness's own Transformer (trainplan.proxy.model): F.rms_norm (one CUDA kernel), real-valued interleaved RoPE,
# SDPA with enable_gqa (no repeat_kv copy) (docs/timing-model.md §7.13). Internal: the GPU check and the preflight set
# it for harness runs; no study setting.
BLOCK_IMPLS = ("auto", "harness")
# Whether the caller still holds the logits while the loss runs backward (memory.logits_bytes): "held" = Hugging
# Face's CausalLMOutput (train_entry.micro_backward keeps ``out``) and the proxy harness's ``logits``; "freed" =
# torchtitan, which deletes them first (train.py at 9dec370: ``del pred`` "to avoid peaking memory"); "chunked" =
# torchtitan's ChunkedLossWrapper (the launch's torchtitan job): the head and loss run chunk by chunk along the
# sequence, each chunk's backward at once. Internal: the published torchtitan rows set "freed", the launch's torchtitan
# deviation "chunked"; no study setting.
LOGITS_AT_BACKWARD = ("held", "freed", "chunked")
# What an RMSNorm keeps for backward (memory.resolve_norm_impl): "fused" = one kernel (torch's CUDA F.rms_norm,
# torchtitan, Megatron/TE, Inductor): input + rstd; "composite" = F.rms_norm decomposed (the harness on CPU): + x·rstd;
# "upcast" = Hugging Face's LlamaRMSNorm on a bf16 stream: an fp32 copy of the input + the normalized value in the
# compute dtype + rstd. "auto": fused, except where memory.hf_norms says the Accelerate launch runs Hugging Face's
# model (upcast), while memory.SIZE_HF_NORMS is on (it is). Internal: the published torchtitan rows set
# "fused"; no study setting.
NORM_IMPL_KINDS = ("auto", "fused", "composite", "upcast")


@dataclass(frozen=True, kw_only=True)
class TrainingSpec:
    seq_len: int
    global_batch: int  # sequences per optimizer step
    dataset_tokens: float = 10e9
    epochs: float = 1.0
    precision: str = "bf16"  # bf16 = mixed precision: bf16 compute, fp32 master weights and Adam states
    optimizer: str = "adamw"
    optimizer_impl: str = "fused"  # OPTIMIZER_IMPLS: the AdamW kernels (fused in production, foreach in the harness)
    finetune: str = "full"
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = ("q", "k", "v", "o")
    kernels: str = "eager"  # KERNEL_KINDS; the default study runs HF transformers under Accelerate FSDP2
    attn_impl: str = "flash"  # ATTN_IMPL_KINDS
    attn_kernel: str = "fa2"  # ATTN_KERNELS (with attn_impl flash)
    sac_policy: str = "auto"  # SAC_POLICIES: what recompute='selective' keeps
    sp_impl: str = "auto"  # SP_IMPLS: sharded (Megatron) or gathered (PyTorch DTensor) linear inputs under SP
    bf16_via: str = "bf16_params"  # BF16_VIA: bf16 parameters (production) or autocast over fp32 ones (harness)
    block_impl: str = "auto"  # BLOCK_IMPLS: the kernel class's block code, or the proxy harness's own
    logits_at_backward: str = "held"  # LOGITS_AT_BACKWARD: logits kept (HF, harness), deleted or chunked (torchtitan)
    norm_impl: str = "auto"  # NORM_IMPL_KINDS: what a norm keeps for backward (HF's fp32 upcast under eager)

    def __post_init__(self) -> None:
        positive_int(self, "seq_len", "global_batch", "lora_rank")
        positive_num(self, "dataset_tokens", "epochs")
        one_of(self, "kernels", KERNEL_KINDS)
        one_of(self, "attn_impl", ATTN_IMPL_KINDS)
        one_of(self, "attn_kernel", ATTN_KERNELS)
        one_of(self, "sac_policy", SAC_POLICIES)
        one_of(self, "sp_impl", SP_IMPLS)
        one_of(self, "bf16_via", BF16_VIA)
        one_of(self, "block_impl", BLOCK_IMPLS)
        one_of(self, "logits_at_backward", LOGITS_AT_BACKWARD)
        one_of(self, "norm_impl", NORM_IMPL_KINDS)
        if self.bf16_via == "autocast" and (self.fp8 or self.finetune == "qlora"):
            raise ConfigError("bf16_via", self.bf16_via, "autocast over fp32 weights is the proxy harness's bf16 regime "
                              f"(full or LoRA, bf16 GEMMs); not with precision={self.precision}, finetune={self.finetune}")
        one_of(self, "precision", PRECISIONS)
        one_of(self, "optimizer", OPTIMIZERS)
        one_of(self, "optimizer_impl", OPTIMIZER_IMPLS)
        one_of(self, "finetune", FINETUNE_KINDS)
        object.__setattr__(self, "lora_targets", tuple(self.lora_targets))
        bad = [t for t in self.lora_targets if t not in LORA_TARGETS]
        if bad or not self.lora_targets or len(set(self.lora_targets)) < len(self.lora_targets):
            raise ConfigError("lora_targets", list(self.lora_targets),
                              "a non-empty subset of " + ", ".join(LORA_TARGETS) + ", each at most once")

    @property
    def fp8(self) -> str | None:
        """The FP8 recipe (tensorwise | rowwise), or None for bf16/fp32 GEMMs."""
        return FP8_RECIPES.get(self.precision)

    @property
    def half(self) -> bool:
        """bf16 activations and the mixed-precision state layout (bf16 and both FP8 recipes)."""
        return self.precision != "fp32"

    @property
    def autocast(self) -> bool:
        """bf16 compute by ``torch.autocast`` over fp32 parameters (``bf16_via='autocast'``; not with fp32)."""
        return self.half and self.bf16_via == "autocast"

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch

    @property
    def total_tokens(self) -> float:
        return self.dataset_tokens * self.epochs
