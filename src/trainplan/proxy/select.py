"""Choose the proxy runs from the analytic candidates: explicit rules, one list per family.

1. **depth slice** — the production widths with few layers (``depth_layers``): per-layer time and memory
   are linear in depth, so the slope extrapolates to full depth;
2. **width ladder** — growing hidden size (``width_hidden``) at fixed depth: efficiency vs width;
3. **scale-out ladder** — one model on each of ``scaleout_world_sizes`` ranks (FSDP full shard);
4. **layout** — one run per layout family the planner considered, mapped to the proxy world size.

The depth, width and layout runs use the proxy world, ``nnodes`` nodes of ``nproc_per_node`` ranks (a multi-node
proxy needs the Slurm profile); the scale-out ladder places each of its world sizes on one node.

``model_impl: hf`` runs every proxy on transformers' ``LlamaForCausalLM`` instead of the harness's model; it
has no TP plan or LoRA adapter here, so the TP, TP+SP and LoRA runs are left out (and a model it cannot
express, e.g. a GELU MLP, is refused naming ``proxies.model_impl``).

On ``device: cpu`` every model is shrunk to a debug size (widths from ``width_hidden``, vocab 256, seq
from ``seq_len``): CPU runs validate bytes, FLOPs, collectives and loss parity, not H100 speed. On
``cuda`` the depth slice keeps the production widths.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pandas as pd

from trainplan.model.arch import ModelSpec, cpu_proxy_heads, hf_unsupported_reason
from trainplan.model.base import ConfigError
from trainplan.model.layout import Layout
from trainplan.model.training import TrainingSpec

CPU_VOCAB = 256


def cpu_model(model: ModelSpec, hidden: int, layers: int, seq_len: int, tp: int = 1) -> ModelSpec:
    """A debug-size model keeping the production model's kind (MLP, norm, positions, GQA group if possible).

    ``tp``: the proxy's TP degree, which must divide the KV heads too: the GQA group shrinks to the largest one
    that leaves a multiple of ``tp`` KV heads (Llama 3's group of 4 at 4 heads would leave one KV head, which
    no TP proxy can split)."""
    heads = cpu_proxy_heads(hidden)
    group = max(1, model.heads // model.kv_heads)
    fits = [g for g in range(min(group, heads), 0, -1) if heads % g == 0 and (heads // g) % max(1, tp) == 0]
    kv = heads // fits[0] if fits else heads
    return ModelSpec(name=f"{model.name}-cpu-h{hidden}-L{layers}", layers=layers, hidden=hidden, heads=heads,
                     kv_heads=kv, vocab=CPU_VOCAB, mlp=model.mlp, norm=model.norm, norm_bias=model.norm_bias,
                     pos_offset=model.pos_offset, head_bias=model.head_bias, embed_norm=model.embed_norm,
                     pos_embedding=model.pos_embedding,
                     bias=model.bias, tied_embeddings=model.tied_embeddings, max_seq_len=max(seq_len, 128))




def _proxy_layout(row: dict[str, Any] | Layout, world: int) -> Layout | None:
    """The candidate's strategy at the proxy's world size (None if it cannot be proxied)."""
    d = row.to_dict() if isinstance(row, Layout) else row
    sharding, tp, sp = d.get("sharding", "zero3"), int(d.get("tp", 1)), bool(d.get("sp", False))
    if int(d.get("pp", 1)) > 1 or int(d.get("cp", 1)) > 1 or sharding == "zero1" or d.get("offload", "none") != "none":
        return None
    tp = min(tp, world)
    if tp > 1 and world % tp:
        return None
    dp = world // tp
    if sharding == "hsdp":
        if dp < 2:
            return None
        return Layout(dp=dp, tp=tp, sp=sp and tp > 1, sharding="hsdp", shard_group=max(1, dp // 2),
                      recompute=d.get("recompute", "none"))
    if dp == 1:
        sharding = "none"  # nothing to shard over: pure TP (family "TP"/"TP+SP")
    elif tp > 1 and sharding == "none":
        sharding = "zero3"
    return Layout(dp=dp, tp=tp, sp=sp and tp > 1, sharding=sharding, recompute=d.get("recompute", "none"))


def select_proxies(candidates: pd.DataFrame, model: ModelSpec, training: TrainingSpec,
                   proxies_cfg: dict) -> list[dict[str, Any]]:
    """RUN_SPECs for the depth, width, scale-out and layout families (see the module docstring)."""
    cfg = dict(proxies_cfg)
    device = cfg.get("device", "cpu")
    if device not in ("cpu", "cuda"):
        raise ConfigError("proxies.device", device, "cpu or cuda")
    ppn, nodes = int(cfg.get("nproc_per_node", 2)), int(cfg.get("nnodes", 1))
    world = ppn * nodes
    seq = int(cfg.get("seq_len", 128 if device == "cpu" else training.seq_len))
    gb = int(cfg.get("global_batch", 4))
    widths = list(cfg.get("width_hidden", [64, 128, 256]))
    base = {"seq_len": seq, "global_batch": gb, "steps": int(cfg.get("steps", 8)), "warmup": int(cfg.get("warmup", 2)),
            "device": device, "dtype": cfg.get("dtype", "fp32" if device == "cpu" else "bf16"),
            "seed": int(cfg.get("seed", 0)), "timeout_s": int(cfg.get("timeout_s", 600)), "finetune": "full",
            "mem_limit_bytes": cfg.get("mem_limit_bytes")}
    impl = cfg.get("model_impl", "trainplan")
    if impl not in ("trainplan", "hf"):
        raise ConfigError("proxies.model_impl", impl, "trainplan or hf")
    if impl == "hf":
        why = hf_unsupported_reason(model)
        if why:
            raise ConfigError("proxies.model_impl", impl, f"{model.name} is not expressible as LlamaForCausalLM: "
                              f"{why}; use trainplan")
        base["model_impl"] = "hf"
    families = cfg.get("families", ["depth", "width", "scaleout", "layout"])
    feasible = candidates[candidates["feasible"]] if "feasible" in candidates else candidates
    if "rank" in feasible:
        feasible = feasible.sort_values("rank")
    best = _proxy_layout(feasible.iloc[0].to_dict(), world) if len(feasible) else None
    best = best or Layout(dp=world, sharding="zero3")
    if impl == "hf" and best.tp > 1:  # depth/width slices on the HF model: data-parallel only
        best = Layout(dp=world, sharding="zero3", recompute=best.recompute)
    out: list[dict[str, Any]] = []

    def sized(layers: int, hidden: int | None = None, tp: int = 1) -> ModelSpec:
        if device == "cpu":
            return cpu_model(model, hidden or widths[0], layers, seq, tp)
        return model.with_layers(layers) if hidden is None else replace(model, hidden=hidden, layers=layers,
                                                                          name=f"{model.name}-h{hidden}-L{layers}")

    def add(id_: str, family: str, m: ModelSpec, layout: Layout, ranks: int, **kw: Any) -> None:
        """One RUN_SPEC on ``ranks`` ranks: the proxy world (``nnodes`` nodes of ``nproc_per_node``) or, for the
        scale-out ladder, ``ranks`` on one node (each at most a node's GPUs: config checks it)."""
        if gb % (layout.dp * layout.micro_batch):
            return
        if impl == "hf" and (layout.tp > 1 or kw.get("finetune") == "lora"):
            return  # no TP plan / LoRA adapter for the Hugging Face model (proxy.schema refuses them)
        placed = {"nnodes": nodes, "nproc_per_node": ppn} if ranks == world else {"nnodes": 1, "nproc_per_node": ranks}
        out.append({**base, "id": id_, "family": family, "model": m.to_dict(), "layout": layout.to_dict(),
                    **placed, **kw})

    if "depth" in families:
        for L in cfg.get("depth_layers", [1, 2, 4]):
            add(f"depth-L{L}", "depth", sized(int(L), tp=best.tp), best, world)
    if "width" in families:
        for h in widths:
            add(f"width-h{h}", "width", sized(2, int(h), tp=best.tp), best, world)
    if "scaleout" in families:
        for n in cfg.get("scaleout_world_sizes", [1, 2]):
            add(f"scaleout-n{n}", "scaleout", sized(2), Layout(dp=int(n), sharding="zero3"), int(n))
    if "layout" in families:
        seen: set[str] = set()
        fams = list(dict.fromkeys(feasible["family"])) if "family" in feasible else []
        for fam in fams:
            row = feasible[feasible["family"] == fam].iloc[0].to_dict()
            lay = _proxy_layout(row, world)
            if lay is None or _kind(lay) in seen:
                continue
            seen.add(_kind(lay))
            add(f"layout-{_slug(_kind(lay))}", "layout", sized(2, tp=lay.tp), lay, world)
        for lay in _always(world, ppn):  # every family the harness supports, even if the planner dropped it
            if _kind(lay) not in seen:
                seen.add(_kind(lay))
                add(f"layout-{_slug(_kind(lay))}", "layout", sized(2, tp=lay.tp), lay, world)
        if training.finetune in ("lora", "qlora") or cfg.get("include_lora", True):
            add("layout-lora", "layout", sized(2), Layout(dp=world, sharding="zero3"), world, finetune="lora",
                lora_rank=min(training.lora_rank, 8), lora_targets=list(training.lora_targets))
    cap = cfg.get("max_proxies")
    return _round_robin(out, int(cap)) if cap else out


def _round_robin(specs: list[dict[str, Any]], cap: int) -> list[dict[str, Any]]:
    """At most ``cap`` runs, taking one from each family in turn so no family is starved."""
    by: dict[str, list[dict[str, Any]]] = {}
    for s in specs:
        by.setdefault(s["family"], []).append(s)
    picked: list[dict[str, Any]] = []
    while len(picked) < cap and any(by.values()):
        for fam in list(by):
            if by[fam] and len(picked) < cap:
                picked.append(by[fam].pop(0))
    order = {id(s): i for i, s in enumerate(specs)}
    return sorted(picked, key=lambda s: order[id(s)])


def _always(world: int, per_node: int) -> list[Layout]:
    """The families every study proxies. TP stays inside a node (``per_node`` ranks), as in production; across
    nodes the TP groups are data-parallel (FSDP×TP)."""
    lays = [Layout(dp=world, sharding="none"), Layout(dp=world, sharding="zero3"),
            Layout(dp=world, sharding="zero2")]
    if world >= 2:
        lays.append(Layout(dp=world, sharding="hsdp", shard_group=max(1, world // 2)))
    if min(world, per_node) >= 2:  # pure TP on one node, FSDP×TP across nodes: _proxy_layout's sharding rule
        lays += [_proxy_layout({"tp": per_node, "sp": sp, "sharding": "none"}, world) for sp in (False, True)]
    return lays


def _kind(lay: Layout) -> str:
    """The family plus SP (TP with and without sequence parallelism save different activations)."""
    return lay.family + ("+SP" if lay.sp else "")


def _slug(s: str) -> str:
    return "".join(c.lower() if c.isalnum() else "-" for c in s).strip("-")
