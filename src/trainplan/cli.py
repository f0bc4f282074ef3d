"""The ``trainplan`` command: plan, estimate, validate; proxy/launch/preflight are delegated lazily.

Bad input becomes ONE line on stderr, ``trainplan: error: <key>=<value>: <what is valid>``, exit code 2,
no traceback. ``estimate`` imports only the analytic core (numpy), so it answers in well under a second.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, NoReturn

from trainplan.model.base import ConfigError

__all__ = ["main"]

DELEGATED = {"proxy": ("trainplan.proxy.command", "run one proxy training job (see `trainplan proxy --help`)"),
             "launch": ("trainplan.launch.artifacts", "write Accelerate/torchrun/sbatch launch artifacts"),
             "preflight": ("trainplan.launch.preflight", "one-node preflight check before the real run"),
             "ingest": ("trainplan.launch.ingest", "a trainer's step log -> a calibration record (and day-1 checks)")}
# --arch key → ModelSpec field. Integers, then the kinds, then booleans.
ARCH_KEYS = {"layers": "layers", "hidden": "hidden", "heads": "heads", "kv_heads": "kv_heads", "ffn": "ffn_hidden",
             "vocab": "vocab", "head_dim": "head_dim_override", "max_seq": "max_seq_len", "norms": "norms_per_layer",
             "mlp": "mlp", "norm": "norm", "pos": "pos_embedding", "bias": "bias",
             "tied": "tied_embeddings", "qk_norm": "qk_norm"}
_ARCH_BOOL = ("tied", "qk_norm")
_ARCH_STR = ("mlp", "norm", "pos", "bias")
ARCH_HELP = ("architecture k=v,...: layers, hidden, heads, vocab (all four needed without --model); kv_heads, ffn, "
             "head_dim (when not hidden/heads), max_seq (context window; omitted without --model = no cap), "
             "norms (norms per block, default 2), mlp (swiglu|gelu), norm (rmsnorm|layernorm), "
             "pos (rope|learned|alibi), bias (none|qkv|all), tied (true|false), qk_norm (true|false). "
             "GPT-2 small: layers=12,hidden=768,heads=12,vocab=50257,mlp=gelu,norm=layernorm,pos=learned,"
             "bias=all,tied=true,max_seq=1024")
# Upper bounds of the integer flags (the config schema's): beyond them a float or int64 would overflow.
INT_FLAGS = {"gpus": 2**23, "gpus_per_node": 128, "seq_len": 2**21, "micro_batch": 65536, "global_batch": 2**24,
             "tp": 128, "pp": 4096, "cp": 65536, "vpp": 4096}


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"trainplan: error: {_clean(message, 400)}\n")
        raise SystemExit(2)


def _clean(x: object, limit: int = 200) -> str:
    """One printable line: control characters escaped, long values cut."""
    s = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(x))
    return s if len(s) <= limit else s[:limit] + "…"


def _fmt(e: ConfigError) -> str:
    return f"trainplan: error: {_clean(e.key, 100)}={_clean(e.value)}: {_clean(e.valid, 600)}"


def _warn(line: str) -> None:
    sys.stderr.write(f"trainplan: warning: {_clean(line, 600)}\n")


# ------------------------------------------------------------------------------------------ estimate
def _parse_arch(text: str | None) -> dict[str, Any]:
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


def _build(args: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    from trainplan.config import seq_len_notes
    from trainplan.model.arch import ModelSpec, resolve_model
    from trainplan.model.hardware import ClusterSpec, resolve_gpu
    from trainplan.model.layout import Layout, check_layout
    from trainplan.model.training import TrainingSpec

    for key, hi in INT_FLAGS.items():
        v = getattr(args, key)
        if not 1 <= v <= hi:
            raise ConfigError(key.replace("_", "-"), v, f"must be an integer in 1..{hi}")
    arch = _parse_arch(args.arch)
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
    for line in seq_len_notes(model, args.seq_len, key="seq-len"):
        _warn(line)
    gpn = min(args.gpus_per_node, args.gpus)
    if args.gpus % gpn:
        raise ConfigError("gpus", args.gpus, f"must be a multiple of --gpus-per-node={args.gpus_per_node}")
    cluster = ClusterSpec(nodes=args.gpus // gpn, gpus_per_node=gpn, gpu=gpu)
    training = TrainingSpec(seq_len=args.seq_len, global_batch=args.global_batch, finetune=args.finetune,
                            kernels=args.kernels, attn_impl=args.attn_impl, precision=args.precision)
    mp = args.tp * args.pp * args.cp
    if args.gpus % mp:
        raise ConfigError("layout", f"tp·pp·cp = {args.tp}·{args.pp}·{args.cp} = {mp}",
                          f"must divide --gpus={args.gpus} (dp = gpus / (tp·pp·cp))")
    layout = Layout(dp=args.gpus // mp, tp=args.tp, pp=args.pp, cp=args.cp, sp=args.sp, sharding=args.sharding,
                    shard_group=args.shard_group, recompute=args.recompute, offload=args.offload,
                    micro_batch=args.micro_batch, pp_schedule=args.pp_schedule, vpp=args.vpp, cp_kind=args.cp_kind,
                    tp_overlap=args.tp_overlap)
    check_layout(model, cluster, training, layout)
    return model, cluster, training, layout


def _cmd_estimate(args: argparse.Namespace) -> int:
    from trainplan.model.efficiency import Efficiency
    from trainplan.model.estimate import estimate

    model, cluster, training, layout = _build(args)
    est = estimate(model, cluster, training, layout, Efficiency.for_gpu(cluster.gpu))
    js = est.to_json()
    if args.json:
        from trainplan.io import to_jsonable

        print(json.dumps(to_jsonable(js), indent=2, sort_keys=True))
        return 0
    print(f"{model.name} ({model.n_params / 1e9:.2f}B params) on {cluster.n_gpus}× {cluster.gpu.name}: "
          f"{layout.describe()}")
    mem = js["memory_gib"]
    print("memory/GPU GiB: " + ", ".join(f"{k} {v:.1f}" for k, v in mem.items())
          + f"  (HBM {js['hbm_gib']:.1f}, headroom {js['headroom']:.0%})")
    print(f"step {js['step_time_s']:.2f} s, {js['tokens_per_s']:.0f} tokens/s, "
          f"{js['tokens_per_s_per_gpu']:.0f} tokens/s/GPU, MFU {js['mfu']:.1%}, HFU {js['hfu']:.1%}")
    print("feasible" if js["feasible"] else f"NOT feasible: {js['reason']}")
    return 0


# ---------------------------------------------------------------------------------------------- plan
def _console() -> Any:
    """A rich Console whose broken pipe (``trainplan plan | head -1``) ends like estimate's: quietly, exit 0
    (rich's own default exits 1)."""
    from rich.console import Console

    con = Console(width=None if sys.stdout.isatty() else 200)

    def broken_pipe() -> None:
        con.quiet = True
        raise BrokenPipeError

    con.on_broken_pipe = broken_pipe
    return con


def _cmd_plan(args: argparse.Namespace) -> int:
    from rich.table import Table

    from trainplan.config import default_config_path, load_config
    from trainplan.search.layouts import family_verdicts, search, technique_verdicts

    if not 1 <= args.top <= 100_000:
        raise ConfigError("top", args.top, "must be an integer in 1..100000")
    _check_out_path("csv", args.csv)
    cfg = load_config(args.config if args.config is not None else default_config_path())
    eff = cfg.efficiency  # the generation's fitted Efficiency with the config's overrides (config.build_efficiency)
    df = search(cfg.model, cfg.cluster, cfg.training, eff, cfg.search)
    if args.csv:
        _write_csv_arg("csv", df, args.csv)
    con = _console()
    feas = df[df["feasible"]]
    t = Table(title=f"{cfg.model.name} on {cfg.cluster.n_gpus}× {cfg.cluster.gpu.name}, seq {cfg.training.seq_len}, "
                    f"global batch {cfg.training.global_batch}: {len(feas)} feasible of {len(df)} layouts")
    for c in ("#", "layout", "family", "tok/s/GPU", "MFU", "step s", "weights", "grads", "optim", "activ",
              "total GiB", "headroom"):
        t.add_column(c, justify="left" if c in ("layout", "family") else "right")
    for _, r in feas.head(args.top).iterrows():
        t.add_row(str(r["rank"]), r["layout_text"], r["family"], f"{r['tokens_per_s_per_gpu']:.0f}", f"{r['mfu']:.1%}",
                  f"{r['step_time_s']:.2f}", f"{r['mem_weights_gib']:.1f}", f"{r['mem_gradients_gib']:.1f}",
                  f"{r['mem_optimizer_gib']:.1f}", f"{r['mem_activations_gib']:.1f}", f"{r['mem_total_gib']:.1f}",
                  f"{r['headroom_frac']:.0%}")
    con.print(t)
    con.print("[bold]Why each family loses[/bold] (data-parallel sharding × TP × PP; best layout of each):")
    for _, v in family_verdicts(df).iterrows():
        con.print(f"  [bold]{v['family']}[/bold] ({v['verdict']}): {v['line']}", highlight=False)
    con.print("[bold]What each technique buys[/bold] (best layout with it vs without it):")
    for _, v in technique_verdicts(df).iterrows():
        con.print(f"  [bold]{v['technique']}[/bold]: {v['line']}", highlight=False)
    if not len(feas):  # say why in one line: the commonest kinds of first reason (numbers aside), an example each
        first = df["reason"].astype(str).str.split(";").str[0].str.strip()
        kind = first.str.replace(r"\d+(\.\d+)?", "#", regex=True)
        top = kind.value_counts().head(3)
        _warn(f"no feasible layout of {len(df)}; commonest reasons: "
              + "; ".join(f"{first[kind == k].iloc[0]} (and alike: {n} layouts)" for k, n in top.items()))
    return 0


def _check_out_path(key: str, path: str | None) -> None:
    """An output file path the command will write: refused before any work if it cannot be a file."""
    if path is None:
        return
    if not path or "\0" in path:
        raise ConfigError(key, path, "a file path")
    if os.path.isdir(path):
        raise ConfigError(key, path, "is a directory; give a file path")
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):  # the first existing ancestor must be a directory
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ConfigError(key, path, f"cannot write: {parent} is not a directory")


def _write_csv_arg(key: str, df: Any, path: str) -> None:
    from trainplan.io import write_csv

    try:
        write_csv(df, path)
    except OSError as e:
        raise ConfigError(key, path, f"cannot write: {e.strerror or e}") from None


# ------------------------------------------------------------------------------------------ validate
def _cmd_validate(args: argparse.Namespace) -> int:
    from rich.table import Table

    from trainplan.published.validate import heldout_rows, mape_table, validate_all

    _check_out_path("csv", args.csv)
    t = args.h100_peak_tflops
    if t is not None and not (math.isfinite(t) and 0 < t <= 100_000):
        raise ConfigError("h100-peak-tflops", t, "a finite number of TFLOP/s in (0, 100000]")
    if args.heldout:
        return _print_heldout(heldout_rows(), args.csv)
    peak = None if args.h100_peak_tflops is None else args.h100_peak_tflops * 1e12
    df = validate_all(h100_peak_flops=peak)
    if args.csv:
        _write_csv_arg("csv", df, args.csv)
    con = _console()
    for table, g in df.groupby("table", sort=False):
        t = Table(title=table)
        for c in ("row", "metric", "published", "predicted", "err %", "in MAPE", "note"):
            t.add_column(c, justify="left" if c in ("row", "metric", "note") else "right")
        for _, r in g.iterrows():
            t.add_row(r["row"], r["metric"], f"{r['published']:.4g}", f"{r['predicted']:.4g}", f"{r['err_pct']:+.1f}",
                      "yes" if r["in_mape"] else "no", r["note"])
        con.print(t)
    m = Table(title="MAPE per table (rows the model speaks to)")
    for c in ("table", "metric", "MAPE %", "bias %", "rows"):
        m.add_column(c)
    for _, r in mape_table(df).iterrows():
        m.add_row(r["table"], r["metric"], f"{r['mape_pct']:.1f}", f"{r['bias_pct']:+.1f}", str(r["rows"]))
    con.print(m)
    return 0


def _print_heldout(rows: Any, csv: str | None) -> int:
    """Leave one table out per GPU generation: each table predicted by its generation's Efficiency refitted on
    the generation's other tables; then the bias per family class and the interval's empirical coverage."""
    from rich.table import Table

    from trainplan.published.validate import family_bias, interval_coverage

    if csv:
        _write_csv_arg("csv", rows, csv)
    con = _console()
    t = Table(title="Held-out error per published table (its generation's Efficiency refitted without it)")
    for c in ("held out", "gen", "metric", "fitted on", "rows", "MAPE %", "bias %", "worst %"):
        t.add_column(c, justify="right" if c in ("rows", "MAPE %", "bias %", "worst %") else "left")
    for (table, gen, metric, fit_on), g in rows.groupby(["table", "generation", "metric", "held_out_fit"], sort=False):
        e = g["err_pct"]
        t.add_row(table, gen, metric, fit_on, str(len(g)), f"{e.abs().mean():.1f}", f"{e.mean():+.1f}",
                  f"{e.abs().max():.1f}")
    con.print(t)
    f = Table(title="Held-out bias per family class (FSDP/ZeRO = data parallel only; TP; PP; CP)")
    for c in ("gen", "family", "rows", "bias %", "MAPE %", "worst %"):
        f.add_column(c, justify="left" if c in ("gen", "family") else "right")
    for r in family_bias(rows).itertuples():
        f.add_row(r.generation, r.family, str(r.rows), f"{r.bias_pct:+.1f}", f"{r.mape_pct:.1f}", f"{r.worst_abs_pct:.1f}")
    con.print(f)
    for gen, g in rows.groupby("generation", sort=True):
        cov = interval_coverage(g)
        con.print(f"{gen}: p10–p90 interval from the other held-out errors of the family (or generation) holds "
                  f"{cov['measured']:.0%} of {cov['n']} held-out rows (nominal {cov['nominal']:.0%})")
    return 0


# ---------------------------------------------------------------------------------------------- main
def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="trainplan", description="Plan, prove and cost a distributed LLM fine-tune.",
                formatter_class=argparse.RawDescriptionHelpFormatter,
                epilog="example:\n  trainplan estimate --model llama2-13b --gpus 32 --tp 2 --sp --json")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    raw = argparse.RawDescriptionHelpFormatter
    pl = sub.add_parser("plan", help="rank every layout for a study config", formatter_class=raw,
                        epilog="example:\n  trainplan plan config/config.yaml --top 10 --csv candidates.csv")
    pl.add_argument("config", nargs="?", default=None,
                    help="study config YAML (default: the embedded default study, config/config.yaml of the repository)")
    pl.add_argument("--top", type=int, default=10, help="how many layouts to show (default 10)")
    pl.add_argument("--csv", help="also write every candidate to this CSV")
    es = sub.add_parser("estimate", help="memory and throughput of one layout", formatter_class=raw,
                        epilog="example:\n  trainplan estimate --model llama2-13b --gpu h100-sxm-80gb --gpus 32 "
                               "--seq-len 4096 --global-batch 256 --tp 2 --sp --recompute selective --json")
    es.add_argument("--model", help="preset name (llama2-13b, ...) or a Hugging Face config.json path")
    es.add_argument("--arch", help=ARCH_HELP + " (with --model: overrides of that model)")
    es.add_argument("--gpu", default="h100-sxm-80gb", help="GPU name (default h100-sxm-80gb)")
    es.add_argument("--gpus", type=int, default=32, help="total GPUs (default 32)")
    es.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8, at most 128)")
    es.add_argument("--seq-len", type=int, default=4096,
                    help="tokens per sequence (above the model's max_seq_len: a warning, as with RoPE scaling)")
    es.add_argument("--micro-batch", type=int, default=1, help="sequences per rank per forward")
    es.add_argument("--global-batch", type=int, default=256, help="sequences per optimizer step")
    es.add_argument("--tp", type=int, default=1)
    es.add_argument("--pp", type=int, default=1)
    es.add_argument("--cp", type=int, default=1)
    es.add_argument("--sp", action="store_true", help="sequence parallelism (needs --tp > 1)")
    es.add_argument("--tp-overlap", action="store_true",
                    help="overlap TP communication with GEMMs: torchtitan async TP (--kernels compiled) or Megatron "
                         "--tp-comm-overlap (--kernels fused); needs --tp > 1")
    es.add_argument("--pp-schedule", default="1f1b", help="1f1b | interleaved")
    es.add_argument("--vpp", type=int, default=1, help="virtual stages per rank (interleaved)")
    es.add_argument("--cp-kind", default="ring", help="ring | ulysses")
    es.add_argument("--sharding", default="zero3", help="none | zero1 | zero2 | zero3 | hsdp")
    es.add_argument("--shard-group", type=int, default=None, help="hsdp shard group size (default GPUs per node)")
    es.add_argument("--recompute", default="none", help="none | selective | full")
    es.add_argument("--offload", default="none", help="none | cpu")
    es.add_argument("--finetune", default="full", help="full | lora | qlora")
    es.add_argument("--precision", default="bf16", choices=("bf16", "fp8-tensorwise", "fp8-rowwise", "fp32"),
                    help="as training.precision: bf16 mixed precision (default), the block linears' GEMMs in FP8 "
                         "(torchao tensorwise / rowwise recipes; H100/H200 only), or fp32")
    es.add_argument("--kernels", default="eager", choices=("eager", "compiled", "fused"),
                    help="elementwise kernels, as training.kernels in the study config: eager (PyTorch eager, "
                         "default), compiled (torch.compile), fused (Megatron / Transformer Engine)")
    es.add_argument("--attn-impl", default="flash", choices=("flash", "math"),
                    help="attention core, as training.attn_impl: flash (default) or math (materialised scores)")
    es.add_argument("--json", action="store_true", help="print the estimate as JSON")
    va = sub.add_parser("validate", help="predicted vs published tables, MAPE per table", formatter_class=raw,
                        epilog="example:\n  trainplan validate --csv validation.csv\n  trainplan validate --heldout\n"
                               "  trainplan validate --h100-peak-tflops 835")
    va.add_argument("--csv", help="also write the comparison rows to this CSV")
    va.add_argument("--heldout", action="store_true",
                    help="leave one published table out: refit the Efficiency on the others, predict it")
    va.add_argument("--h100-peak-tflops", type=float, default=None,
                    help="peak BF16 TFLOP/s for torchtitan's 96 GB / 500 W H100s (default 989, the SXM spec; "
                         "torchtitan puts it between NVL 835 and SXM 989)")
    for name, (_, help_) in DELEGATED.items():
        sub.add_parser(name, help=help_, add_help=False)
    return p


def _quiet_broken_pipe() -> int:
    """``trainplan estimate | head -1``: the reader left; stop quietly (no BrokenPipeError at exit)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (captured in tests)
        pass
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in DELEGATED:
            import importlib

            mod = importlib.import_module(DELEGATED[argv[0]][0])
            rc = int(mod.main(argv[1:]) or 0)
        else:
            try:
                args = _parser().parse_args(argv)
            except SystemExit as e:  # a usage error (one line already written) or --help: a code, not an exit
                return e.code if isinstance(e.code, int) else 2
            handler = {"plan": _cmd_plan, "estimate": _cmd_estimate, "validate": _cmd_validate}[args.cmd]
            rc = handler(args)
        sys.stdout.flush()  # inside the try: a closed pipe surfaces here, not at interpreter exit
        return rc
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except ConfigError as e:
        sys.stderr.write(_fmt(e) + "\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("trainplan: interrupted\n")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
