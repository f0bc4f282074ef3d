"""What a proxy step measures, each device-independent and exact on CPU.

* :func:`state_bytes` — per-rank bytes of the local parameter, gradient and optimizer-state shards.
* :class:`SavedTensorTracker` — bytes saved for backward (``torch.autograd.graph.saved_tensors_hooks``),
  unique storages only, parameters excluded, attributed to the module that saved them first.
* :func:`count_flops` — ``FlopCounterMode`` plus a formula for the CPU flash-attention kernel, which torch
  does not register; the flash backward's recompute of QKᵀ is split out so model FLOPs can be compared.
* :class:`CommCounter` — a ``TorchDispatchMode`` that counts every c10d / functional collective (DDP's
  reducer, FSDP2's all_gather_into_tensor / reduce_scatter_tensor, DTensor's TP collectives) and its bytes.
"""

from __future__ import annotations

import contextlib
import re
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils.flop_counter import (
    FlopCounterMode,
    register_flop_formula,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

from trainplan.proxy.parallelize import SAVE_OPS

aten = torch.ops.aten


def _local(t: torch.Tensor) -> torch.Tensor:
    """The rank-local tensor behind a wrapper subclass (DTensor shards, AsyncCollectiveTensor)."""
    while is_traceable_wrapper_subclass(t):
        attrs, _ = t.__tensor_flatten__()
        t = getattr(t, attrs[0])
    return t


def _nbytes(t: torch.Tensor) -> int:
    t = _local(t)
    return t.numel() * t.element_size()


# -------------------------------------------------------------------------------------- model state
def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, int]:
    """Per-rank bytes of local parameter, gradient and optimizer shards (trainable and frozen split)."""
    params = grads = frozen = 0
    for p in model.parameters():
        if p.requires_grad:
            params += _nbytes(p)
        else:
            frozen += _nbytes(p)
        if p.grad is not None:
            grads += _nbytes(p.grad)
    opt = step = 0
    if optimizer is not None:
        for st in optimizer.state.values():
            for k, v in st.items():
                if torch.is_tensor(v):
                    if k == "step":
                        step += _nbytes(v)
                    else:
                        opt += _nbytes(v)
    return {"params_bytes": params, "frozen_params_bytes": frozen, "grads_bytes": grads,
            "optimizer_bytes": opt, "optimizer_step_counters_bytes": step}


# ------------------------------------------------------------------------------ saved activations
_LAYER = re.compile(r"^(?:.*\.)?layers\.(\d+)(?:\.|$)")
_WRAPPER_PARTS = ("_checkpoint_wrapped_module", "_fsdp_wrapped_module", "_orig_mod", "module")


def _clean(name: str) -> str:
    return ".".join(p for p in name.split(".") if p not in _WRAPPER_PARTS)


class SavedTensorTracker:
    """Bytes saved for backward during one forward, by module; unique storages, parameters excluded.

    A storage saved by more than one layer (e.g. the RoPE cos/sin tables, computed once per forward)
    is reported under ``shared``. Inputs held by a checkpointed (non-reentrant) module are counted for
    that module: that is what activation checkpointing keeps. Use as a context manager around forward.
    """

    def __init__(self, model: nn.Module, sac_save_ops: set | frozenset | None = None):
        self.model = model
        self.sac_save_ops = sac_save_ops  # None: the harness's policy (trainplan.proxy.parallelize.SAVE_OPS)
        self.sac_depth = 0  # > 0 while the forward runs inside a selectively checkpointed block
        self.sac_seen = False
        self.stack: list[str] = ["loss"]  # saves outside any module: the loss
        self.first: dict[int, tuple[str, int, str]] = {}  # storage ptr → (module, bytes, op label)
        self.users: dict[int, set[str]] = defaultdict(set)
        self.param_ptrs: list[set[int]] = []  # params of the modules now running (scoped: freed storages get reused)
        self._handles: list[Any] = []
        self._ctx: contextlib.ExitStack | None = None
        self.sac_stack: list[bool] = []

    def _record(self, t: torch.Tensor, label: str) -> None:
        loc = _local(t)
        if loc.device.type == "meta":
            return
        st = loc.untyped_storage()
        ptr = st.data_ptr()
        if isinstance(t, nn.Parameter) or any(ptr in ps for ps in self.param_ptrs):
            return
        mod = self.stack[-1]
        self.users[ptr].add(_layer_of(mod) or mod)
        if ptr not in self.first:
            self.first[ptr] = (mod, st.nbytes(), label)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self._record(t, "saved")
        return t

    def __enter__(self) -> SavedTensorTracker:
        names = {id(m): _clean(n) or "<root>" for n, m in self.model.named_modules()}
        for m in self.model.modules():
            name = names[id(m)]
            self._handles.append(m.register_forward_pre_hook(self._pre(name, m), with_kwargs=True))
            self._handles.append(m.register_forward_hook(self._post, always_call=True))
        self._ctx = contextlib.ExitStack()
        self._ctx.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t))
        if any(_is_selective(m) for m in self.model.modules()):
            if self.sac_save_ops is None:
                self.sac_save_ops = frozenset(SAVE_OPS)
            self._ctx.enter_context(_SACOutputs(self))
        return self

    def _pre(self, name: str, module: nn.Module):
        checkpointed = isinstance(module, CheckpointWrapper)  # fully_shard subclasses it (FSDPCheckpointWrapper)
        selective = _is_selective(module)

        def hook(mod: nn.Module, args: tuple, kwargs: dict) -> None:
            self.stack.append(name)
            self.sac_stack.append(selective)
            if selective:
                self.sac_depth += 1
            self.param_ptrs.append({_local(p).untyped_storage().data_ptr() for p in mod.parameters(recurse=False)})
            if checkpointed and torch.is_grad_enabled():
                for a in (*args, *kwargs.values()):
                    if torch.is_tensor(a):
                        self._record(a, "checkpoint-input")

        return hook

    def _post(self, *_: Any) -> None:
        self.stack.pop()
        self.param_ptrs.pop()
        if self.sac_stack.pop():
            self.sac_depth -= 1

    def __exit__(self, *exc: Any) -> None:
        assert self._ctx is not None
        self._ctx.close()
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def by_module(self) -> dict[str, int]:
        """Bytes per saving module (layer-shared storages under ``shared``)."""
        out: dict[str, int] = defaultdict(int)
        for ptr, (mod, nb, _) in self.first.items():
            key = "shared" if len(self.users[ptr]) > 1 else mod
            out[key] += nb
        return dict(out)

    def summary(self) -> dict[str, Any]:
        """Totals: per layer, per term inside a layer, and the non-layer groups (embedding, norm, output)."""
        per_layer: dict[str, int] = defaultdict(int)
        per_term: dict[str, int] = defaultdict(int)
        other: dict[str, int] = defaultdict(int)
        for mod, nb in self.by_module().items():
            lay = _layer_of(mod)
            if lay is None:
                other[_harness_name(mod).split(".")[0]] += nb
                continue
            per_layer[lay] += nb
            rest = _harness_name(_LAYER.sub("", mod, count=1)) or "block"
            per_term[rest] += nb
        n = max(len(per_layer), 1)
        # a selective checkpoint keeps its saved op outputs out of saved_tensors_hooks' reach: complete only if the
        # dispatch mode saw them (a checkpointed block it did not recognise leaves them out)
        selective = any(_is_selective(m) for m in self.model.modules())
        return {"complete": not selective or self.sac_seen, "sac_outputs_counted": self.sac_seen,
                "total_bytes": sum(per_layer.values()) + sum(other.values()),
                "per_layer_bytes": dict(per_layer),
                "mean_layer_bytes": sum(per_layer.values()) / n,
                "per_term_bytes_per_layer": {k: v / n for k, v in sorted(per_term.items())},
                "non_layer_bytes": dict(other)}


def _is_selective(module: nn.Module) -> bool:
    """A ``checkpoint_wrapper`` whose checkpoint has a ``context_fn`` (selective activation checkpointing)."""
    fn = getattr(module, "checkpoint_fn", None)
    return isinstance(module, CheckpointWrapper) and bool(getattr(fn, "keywords", {}).get("context_fn"))


class _SACOutputs(TorchDispatchMode):
    """Records the outputs of the ops a selective checkpoint MUST_SAVEs, as the tracker's saved bytes.

    SAC keeps those outputs in its own cache (``torch.utils.checkpoint``'s caching dispatch mode), out of
    ``saved_tensors_hooks``' reach; this mode sits below it on the mode stack and sees every op with its
    outputs. Only the forward inside a selectively checkpointed block counts (not the recompute).
    """

    def __init__(self, tracker: SavedTensorTracker):
        super().__init__()
        self.tracker = tracker

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        out = func(*args, **(kwargs or {}))
        tr = self.tracker
        if tr.sac_depth > 0 and torch.is_grad_enabled() and func in (tr.sac_save_ops or ()):
            tr.sac_seen = True
            for t in _tensors(out):
                tr._record(t, "sac-saved")
        return out


# transformers' Llama module names → the harness's (torchtitan's), so terms of both models read the same
_HF_NAMES = {"self_attn": "attention", "mlp": "feed_forward", "input_layernorm": "attention_norm",
             "post_attention_layernorm": "ffn_norm", "q_proj": "wq", "k_proj": "wk", "v_proj": "wv", "o_proj": "wo",
             "gate_proj": "w1", "up_proj": "w3", "down_proj": "w2", "embed_tokens": "tok_embeddings",
             "lm_head": "output", "act_fn": "act_fn"}


def _harness_name(mod: str) -> str:
    """A module path in the harness's names: the HFCausalLM wrapper prefix (``hf.``, ``hf.model.``) dropped,
    transformers' Llama names mapped (``self_attn.q_proj`` → ``attention.wq``)."""
    parts = mod.split(".")
    while parts and parts[0] in ("hf", "model"):
        parts = parts[1:]
    return ".".join(_HF_NAMES.get(p, p) for p in parts)


def _layer_of(mod: str) -> str | None:
    m = _LAYER.match(mod)
    return f"layers.{m.group(1)}" if m else None


# -------------------------------------------------------------------------------------------- FLOPs
_RECOMPUTE = {"flops": 0}


def _register_cpu_flash_formulas() -> None:
    """FLOP formulas for the CPU flash-attention kernel (torch registers only the CUDA ones)."""
    fwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    bwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    from torch.utils.flop_counter import flop_registry

    if fwd is None or fwd in flop_registry:
        return

    @register_flop_formula(fwd)
    def _fwd(query, key, value, *args, out_shape=None, **kwargs) -> int:
        return sdpa_flop_count(query, key, value)

    @register_flop_formula(bwd)
    def _bwd(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
        b, hq, sq, d = query
        _RECOMPUTE["flops"] += 2 * b * hq * sq * key[2] * d  # flash backward recomputes QKᵀ
        return sdpa_backward_flop_count(grad_out, query, key, value)


_register_cpu_flash_formulas()

# torch's own formulas for the CUDA SDPA backward kernels (flash, memory-efficient, cuDNN) count the QKᵀ they
# recompute, as the CPU one does (sdpa_backward_flop_count, "Step 1"): tracked apart the same way.
CUDA_SDPA_BACKWARD = ("_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_efficient_attention_backward",
                      "_scaled_dot_product_cudnn_attention_backward")


def _track_cuda_flash_recompute() -> None:
    from torch.utils.flop_counter import flop_registry

    for name in CUDA_SDPA_BACKWARD:
        packet = getattr(aten, name, None)
        base = flop_registry.get(packet)
        if base is None or getattr(base, "trainplan_recompute", False):
            continue

        def counted(grad_out: Any, query: Any, key: Any, *args: Any, _base: Any = base, **kwargs: Any) -> int:
            b, hq, sq, d = query.shape
            _RECOMPUTE["flops"] += 2 * b * hq * sq * key.shape[2] * d
            return _base(grad_out, query, key, *args, **kwargs)

        counted.trainplan_recompute = True  # type: ignore[attr-defined]
        flop_registry[packet] = counted


_track_cuda_flash_recompute()


class LocalFlopCounterMode(FlopCounterMode):
    """FlopCounterMode counting DTensor ops at their *local* (per-rank) shapes, not the global ones."""

    def _count_flops(self, func_packet, out, args, kwargs):  # type: ignore[override]
        from torch.utils._pytree import tree_map

        def loc(x: Any) -> Any:
            return _local(x) if torch.is_tensor(x) else x

        return super()._count_flops(func_packet, out, tree_map(loc, args), tree_map(loc, kwargs))


@contextlib.contextmanager
def count_flops() -> Iterator[dict[str, Any]]:
    """FLOPs of the enclosed work: ``total`` (as counted), ``attention_recompute``, ``by_op``."""
    out: dict[str, Any] = {}
    _RECOMPUTE["flops"] = 0
    with LocalFlopCounterMode(display=False) as fc:
        yield out
    out["total"] = int(fc.get_total_flops())
    out["attention_recompute"] = int(_RECOMPUTE["flops"])
    out["by_op"] = {str(k): int(v) for k, v in fc.get_flop_counts().get("Global", {}).items()}


# ----------------------------------------------------------------------------------- collectives
_COLL_NAMES = {
    "allreduce_": "all_reduce", "all_reduce": "all_reduce", "all_reduce_": "all_reduce",
    "allgather_": "all_gather", "_allgather_base_": "all_gather_into_tensor",
    "allgather_into_tensor_coalesced_": "all_gather_into_tensor", "all_gather_into_tensor": "all_gather_into_tensor",
    "all_gather_into_tensor_out": "all_gather_into_tensor", "all_gather_into_tensor_coalesced": "all_gather_into_tensor",
    "reduce_scatter_": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter_tensor", "reduce_scatter_tensor": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
    "alltoall_": "all_to_all", "alltoall_base_": "all_to_all", "all_to_all_single": "all_to_all",
    "broadcast_": "broadcast", "broadcast": "broadcast",
    "allreduce_coalesced_": "all_reduce", "all_reduce_coalesced": "all_reduce", "all_reduce_coalesced_": "all_reduce",
}


def _tensors(x: Any) -> Iterator[torch.Tensor]:
    if torch.is_tensor(x):
        yield x
    elif isinstance(x, list | tuple):
        for y in x:
            yield from _tensors(y)


class CommCounter(TorchDispatchMode):
    """Counts collectives and their bytes per type.

    Bytes per call are the *logical buffer* a rank contributes or receives, the nccl-tests "size":
    all-reduce → the tensor; all-gather → the gathered output; reduce-scatter → the full input.
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = defaultdict(int)
        self.bytes: dict[str, int] = defaultdict(int)
        self.enabled = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        ns = func.namespace
        if self.enabled and ns in ("c10d", "_c10d_functional"):
            kind = _COLL_NAMES.get(func._opname)
            if kind is not None:
                self.calls[kind] += 1
                first = args[0] if args else None
                if kind in ("all_gather_into_tensor",) and ns == "c10d":
                    nb = sum(_nbytes(t) for t in _tensors(args[0]))  # output tensor(s) first
                elif kind == "all_gather_into_tensor":  # functional: input, group_size
                    nb = sum(_nbytes(t) for t in _tensors(first)) * int(args[1])
                elif kind == "reduce_scatter_tensor" and ns == "c10d":
                    nb = sum(_nbytes(t) for t in _tensors(args[1]))  # (output, input)
                else:
                    nb = sum(_nbytes(t) for t in _tensors(first))
                self.bytes[kind] += nb
        return func(*args, **kwargs)

    def summary(self) -> dict[str, dict[str, int]]:
        return {k: {"calls": self.calls[k], "bytes": self.bytes[k]} for k in sorted(self.calls)}
