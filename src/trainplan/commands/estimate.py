"""``trainplan estimate``: memory and throughput of one layout, from flags. Imports only the analytic core (numpy):
it answers in well under a second, without pandas or torch."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from typing import Any

from trainplan.commands.common import warn
from trainplan.config import seq_len_notes
from trainplan.io import to_jsonable
from trainplan.model.arch import ModelSpec, resolve_model
from trainplan.model.base import ConfigError
from trainplan.model.efficiency import Efficiency
from trainplan.model.estimate import MAX_MICRO_BATCH, estimate, fastest_micro_batch, memory_fix
from trainplan.model.flops import adapter_params
from trainplan.model.hardware import ClusterSpec, link_default_notes, resolve_gpu
from trainplan.model.layout import Layout, batch_multiples, check_layout, check_lora_targets, shard_degree
from trainplan.model.memory import host_ram_per_node
from trainplan.model.timing import COMPUTE_PARTS, STEP_PARTS
from trainplan.model.training import LORA_TARGETS, TrainingSpec
from trainplan.published.intervals import family_class, throughput_interval

# --arch key → ModelSpec field. Integers, then the kinds, then booleans.
ARCH_KEYS = {"layers": "layers", "hidden": "hidden", "heads": "heads", "kv_heads": "kv_heads", "ffn": "ffn_hidden",
             "vocab": "vocab", "head_dim": "head_dim_override", "max_seq": "max_seq_len", "norms": "norms_per_layer",
             "pos_offset": "pos_offset",
             "mlp": "mlp", "norm": "norm", "pos": "pos_embedding", "bias": "bias", "qk_norm_scope": "qk_norm_scope",
             "tied": "tied_embeddings", "qk_norm": "qk_norm", "norm_bias": "norm_bias", "head_bias": "head_bias",
             "embed_norm": "embed_norm"}
_ARCH_BOOL = ("tied", "qk_norm", "norm_bias", "head_bias", "embed_norm")
_ARCH_STR = ("mlp", "norm", "pos", "bias", "qk_norm_scope")
# Upper bounds of the integer flags (the config schema's): beyond them a float or int64 would overflow.
INT_FLAGS = {"gpus": 2**23, "gpus_per_node": 128, "seq_len": 2**21, "micro_batch": MAX_MICRO_BATCH, "global_batch": 2**24,
             "tp": 128, "pp": 4096, "cp": 65536, "vpp": 4096}
LORA_RANK_MAX = 65536  # the config schema's training.lora_rank maximum



def parse_arch(text: str | None) -> dict[str, Any]:
    """``--arch k=v,...`` → ModelSpec fields; unknown, repeated or malformed keys are errors."""
    out: dict[str, Any] = {}
    if not text:
        return out
    if len(text) > 2000:
        raise ConfigError("arch", text, "at most 2000 characters")
    seen: set[str] = set()
    for item in text.split(","):
        if not item.strip():
            continue
        if "=" not in item:
            raise ConfigError("arch", item, "expected k=v pairs, e.g. layers=40,hidden=5120")
        k, v = (x.strip() for x in item.split("=", 1))
        if k not in ARCH_KEYS:
            raise ConfigError("arch." + k, v, "unknown key; valid: " + ", ".join(ARCH_KEYS))
        if k in seen:
            raise ConfigError("arch." + k, v, "given twice")
        seen.add(k)
        if k in _ARCH_STR:
            out[ARCH_KEYS[k]] = v
        elif k in _ARCH_BOOL:
            if v.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ConfigError("arch." + k, v, "must be true or false")
            out[ARCH_KEYS[k]] = v.lower() in ("true", "1", "yes")
        else:
            try:
                out[ARCH_KEYS[k]] = int(v)
            except ValueError:
                raise ConfigError("arch." + k, v, "must be a positive integer") from None
    return out


def _arch_model(make: Any) -> Any:
    """Build a ModelSpec from --arch values; a field's ConfigError names the --arch key."""
    try:
        return make()
    except ConfigError as e:
        back = {f: k for k, f in ARCH_KEYS.items()}
        raise ConfigError("arch." + back.get(e.key, e.key), e.value, e.valid) from None


def _lora_args(args: argparse.Namespace) -> dict[str, Any]:
    """--lora-rank / --lora-targets → TrainingSpec fields (checked here, so an error names the flag)."""
    out: dict[str, Any] = {}
    rank, targets = getattr(args, "lora_rank", None), getattr(args, "lora_targets", None)
    for flag, v in (("lora-rank", rank), ("lora-targets", targets)):
        if v is not None and args.finetune not in ("lora", "qlora"):
            raise ConfigError(flag, v, f"only applies with --finetune lora or qlora (not {args.finetune})")
    if rank is not None:
        if not 1 <= rank <= LORA_RANK_MAX:
            raise ConfigError("lora-rank", rank, f"must be an integer in 1..{LORA_RANK_MAX}")
        out["lora_rank"] = rank
    if targets is not None:
        names = [t.strip() for t in targets.split(",")]
        bad = [t for t in names if t not in LORA_TARGETS]
        if bad or len(set(names)) < len(names):
            raise ConfigError("lora-targets", targets, "comma-separated, each at most once, of " + ", ".join(LORA_TARGETS))
        out["lora_targets"] = tuple(names)
    return out


def build(args: argparse.Namespace) -> tuple[Any, Any, Any, Any]:

    if args.micro_batch == "auto":
        args.auto_micro_batch, args.micro_batch = True, 1  # build with 1; run() picks the fastest that fits
    else:
        args.auto_micro_batch = False
        try:
            args.micro_batch = int(args.micro_batch)
        except (TypeError, ValueError):
            raise ConfigError("micro-batch", args.micro_batch,
                              f"must be auto or an integer in 1..{INT_FLAGS['micro_batch']}") from None
    for key, hi in INT_FLAGS.items():
        v = getattr(args, key)
        if not 1 <= v <= hi:
            raise ConfigError(key.replace("_", "-"), v, f"must be an integer in 1..{hi}")
    for flag, v in (("model", args.model), ("arch", args.arch)):
        if v is not None and not v.strip():  # an empty value is a mistake (an unset shell variable), not the default
            raise ConfigError(flag, "(empty)", "a preset name, config.json path or repo id" if flag == "model" else
                              "k=v pairs, e.g. layers=40,hidden=5120,heads=40,vocab=32000")
    arch = parse_arch(args.arch)
    if args.model is None and arch:  # a custom architecture: --arch alone, not overrides of the default model
        missing = [k for k in ("layers", "hidden", "heads", "vocab") if ARCH_KEYS[k] not in arch]
        if missing:
            raise ConfigError("arch", args.arch, "without --model give layers, hidden, heads and vocab (missing: "
                                                 + ", ".join(missing) + ")")
        arch.setdefault("max_seq_len", args.seq_len)  # no context cap (learned positions: exactly seq_len rows)
        model = _arch_model(lambda: ModelSpec(name="custom", **arch))
    else:
        model = resolve_model(args.model or "llama2-13b")
        if arch:
            if ("hidden" in arch or "heads" in arch) and "head_dim_override" not in arch:
                arch["head_dim_override"] = None  # a new width: the preset's head_dim no longer applies
            base = model
            model = _arch_model(lambda: replace(base, **arch))
    gpu = resolve_gpu(args.gpu)
    if args.shard_group is not None and args.sharding != "hsdp":
        raise ConfigError("shard-group", args.shard_group, f"only applies to --sharding hsdp (not {args.sharding})")
    if args.shard_group is not None and not 1 <= args.shard_group <= args.gpus:
        raise ConfigError("shard-group", args.shard_group, f"must be an integer in 1..{args.gpus} (--gpus)")
    if args.cp_kind != "ring" and args.cp == 1:
        raise ConfigError("cp-kind", args.cp_kind, "only applies with --cp > 1")
    if args.pp_schedule != "1f1b" and args.pp == 1:
        raise ConfigError("pp-schedule", args.pp_schedule, "only applies with --pp > 1")
    for line in seq_len_notes(model, args.seq_len, key="seq-len"):
        warn(line)
    gpn = min(args.gpus_per_node, args.gpus)
    if args.gpus % gpn:
        raise ConfigError("gpus", args.gpus, f"must be a multiple of --gpus-per-node={args.gpus_per_node}")
    links = {}
    for flag, field in (("intra_busbw", "intra_busbw_Bps"), ("inter_busbw", "inter_busbw_Bps"),
                        ("host_bw", "host_to_device_Bps")):
        v = getattr(args, flag, None)
        if v is not None:
            if not (math.isfinite(v) and 0 < v <= 100_000):
                raise ConfigError(flag.replace("_", "-"), v, "must be a bandwidth in GB/s, in (0, 100000]")
            links[field] = v * 1e9
    cluster = ClusterSpec(nodes=args.gpus // gpn, gpus_per_node=gpn, gpu=gpu, **links)
    training = TrainingSpec(seq_len=args.seq_len, global_batch=args.global_batch, finetune=args.finetune,
                            kernels=args.kernels, attn_impl=args.attn_impl, attn_kernel=args.attn_kernel,
                            precision=args.precision, optimizer_impl=args.optimizer_impl, **_lora_args(args))
    mp = args.tp * args.pp * args.cp
    if args.gpus % mp:
        raise ConfigError("layout", f"tp·pp·cp = {args.tp}·{args.pp}·{args.cp} = {mp}",
                          f"must divide --gpus={args.gpus} (dp = gpus / (tp·pp·cp))")
    layout = Layout(dp=args.gpus // mp, tp=args.tp, pp=args.pp, cp=args.cp, sp=args.sp, sharding=args.sharding,
                    shard_group=args.shard_group,
                    recompute=args.recompute, offload=args.offload,
                    micro_batch=args.micro_batch, pp_schedule=args.pp_schedule, vpp=args.vpp, cp_kind=args.cp_kind,
                    tp_overlap=args.tp_overlap)
    if layout.sharding == "hsdp" and layout.shard_group is None:  # the default group named: hsdp/8, not hsdp/None
        layout = replace(layout, shard_group=shard_degree(layout, cluster))
    check_lora_targets(model, training, key="lora-targets")
    try:
        check_layout(model, cluster, training, layout)
    except ConfigError as e:  # auto builds with micro-batch 1: the batch, not a micro-batch nobody chose, is wrong
        if not (args.auto_micro_batch and e.key == "layout.micro_batch" and training.global_batch % layout.dp):
            raise
        raise ConfigError("global-batch", args.global_batch,
                          f"must be a multiple of dp = {layout.dp} (--gpus / (tp·pp·cp)) for any micro-batch "
                          f"(the nearest that are: {batch_multiples(training.global_batch, layout.dp)})") from None
    # after the checks: an error stays one line
    for line in link_default_notes(cluster, "--intra-busbw", "--inter-busbw", "--host-bw"):
        warn(line)
    if training.fp8 and training.kernels == "eager":
        warn(f"--precision {args.precision} with --kernels eager: torchao's FP8 casts run unfused (timing."
             f"FP8_CAST_BYTES_EAGER), usually slower than bf16; torchao's FP8 expects --kernels compiled")
    return model, cluster, training, layout


def run(args: argparse.Namespace) -> int:

    model, cluster, training, layout = build(args)
    eff = Efficiency.for_gpu(cluster.gpu)
    if args.auto_micro_batch:
        est, tried = fastest_micro_batch(model, cluster, training, layout, eff)
    else:
        est, tried = estimate(model, cluster, training, layout, eff), [layout.micro_batch]
    layout = est.layout
    js = est.to_json()
    js["micro_batch_choice"] = {"auto": args.auto_micro_batch, "chosen": layout.micro_batch, "tried": tried}
    js["interval"] = throughput_interval(js, cluster.gpu.generation, family_class(layout))
    if not est.feasible and str(js["reason"]).startswith("OOM"):  # what would fit with the same degrees
        js["fits_with"] = memory_fix(model, cluster, training, layout, eff)
    js["finetune"] = {"kind": training.finetune}
    if training.finetune != "full":  # the adapters this estimate sized (as training.lora_rank / lora_targets)
        js["finetune"].update(lora_rank=training.lora_rank, lora_targets=list(training.lora_targets),
                              adapter_params=adapter_params(model, training.lora_rank, training.lora_targets))
    if args.json:
        print(json.dumps(to_jsonable(js), indent=2, sort_keys=True))
        return 0
    print(f"{model.name} ({model.n_params / 1e9:.2f}B params) on {cluster.n_gpus}× {cluster.gpu.name}: "
          f"{layout.describe()}")
    ft = js["finetune"]
    if ft["kind"] != "full":
        print(f"{ft['kind']}: rank {ft['lora_rank']} on {','.join(ft['lora_targets'])}, "
              f"{ft['adapter_params'] / 1e6:,.1f}M trainable adapter params ({ft['adapter_params'] / model.n_params:.2%})")
    if args.auto_micro_batch:
        print(f"micro-batch auto: {layout.micro_batch} ("
              + ("the fastest that fits" if est.feasible else "none fits; the smallest")
              + f" of {', '.join(map(str, tried))}; --micro-batch N pins one)")
    mem = js["memory_gib"]
    print("memory/GPU GiB: " + ", ".join(f"{k} {v:.1f}" for k, v in mem.items())
          + f"  (HBM {js['hbm_gib']:.1f}, headroom {round(js['headroom'], 2) + 0.0:.0%})")
    if layout.offload != "none":
        host = float(host_ram_per_node(model, training, layout, cluster))
        print(f"host RAM/node (CPU offload): {host / 1e9:,.0f} GB of {cluster.host_mem_bytes / 1e9:,.0f} GB")
    b, parts = js["breakdown"], js["compute_parts"]
    inside = ", ".join(f"{COMPUTE_PARTS[k]} {v:.2f}" for k, v in parts.items() if v > 0)
    terms = [f"{name} {b[k]:.2f}" + (f" (of which {inside})" if k == "compute_s" and inside else "")
             for k, name in STEP_PARTS.items() if k != "offload_s" or b[k] > 0]  # the terms that add up to the step
    print("step s: " + ", ".join(terms))
    print(f"step {js['step_time_s']:.2f} s, {js['tokens_per_s']:.0f} tokens/s, "
          f"{js['tokens_per_s_per_gpu']:.0f} tokens/s/GPU, MFU {js['mfu']:.1%}, HFU {js['hfu']:.1%}")
    if js["hfu"] >= 1.0:
        print("note: MFU and HFU count causal attention in full (12·L·h·s per token, the PaLM / torchtitan / Megatron "
              "convention) while the kernels do half of it: above 100% the convention exceeds the peak, not the GPU")
    iv = js["interval"]
    if iv["tokens_per_s_per_gpu_p10"] is not None:
        print(f"p10–p90 {iv['tokens_per_s_per_gpu_p10']:.0f}–{iv['tokens_per_s_per_gpu_p90']:.0f} tokens/s/GPU, "
              f"MFU {iv['mfu_p10']:.1%}–{iv['mfu_p90']:.1%}: {iv['source']}")
    print("feasible" if js["feasible"] else f"NOT feasible: {js['reason']}")
    if "fits_with" in js:
        fix = js["fits_with"]
        print("fits with the same dp·tp·pp·cp: " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in
                                                              fix["changes"].items())
              + f" ({fix['memory_gib']:.1f} GiB, {fix['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU); `trainplan plan` "
              "searches every layout" if fix else
              "no sharding, recompute, offload or micro-batch fits these dp·tp·pp·cp; `trainplan plan` searches the rest")
    return 0
