"""``trainplan plan``: rank every layout of a study config (the analytic model only; no Snakemake)."""

from __future__ import annotations

import argparse

from rich.table import Table

from trainplan.commands.common import check_out_path, console, warn, write_csv_arg
from trainplan.config import default_config_path, load_config
from trainplan.launch.artifacts import plan_search
from trainplan.model.base import ConfigError
from trainplan.model.efficiency import Efficiency
from trainplan.published.intervals import error_pool, family_class, heldout_errors_by_family, interval_bounds
from trainplan.search.layouts import (
    LAUNCH_TPS_WHY,
    batch_alternative,
    best_row,
    family_verdicts,
    group_infeasible,
    impossible_techniques,
    infeasible_summary,
    launch_changes_speed,
    launched_tps,
    pinned_options,
    technique_verdicts,
)


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.top <= 100_000:
        raise ConfigError("top", args.top, "must be an integer in 1..100000")
    check_out_path("csv", args.csv)
    paths = args.config or [default_config_path()]
    try:
        cfg = load_config(paths)
    except ConfigError as e:
        if e.value is None and e.key in ("model", "cluster") and len(paths) == 1:  # a variant overlay given alone
            raise ConfigError(e.key, e.value, "required; if this file is a variant overlay (as config/lora.yaml), give "
                              f"its base first: trainplan plan config/config.yaml {paths[0]}") from None
        raise
    eff = cfg.efficiency  # the generation's fitted Efficiency with the config's overrides (config.build_efficiency)
    options = pinned_options(cfg.search, cfg.layout)
    # the study's search: what the launch could not fit ruled out (each layout sized as its trainer runs it)
    df = plan_search(cfg.model, cfg.cluster, cfg.training, eff, options, max(args.top, int(cfg.search["top_k"])))
    if not len(df):  # nothing to size, rank or explain: a config error, before any file is written
        raise ConfigError("layout" if cfg.layout is not None else "search", f"{len(df)} layouts",
                          f"needs at least one; {infeasible_summary(df)}")
    con = console()
    feas = df[df["feasible"]]
    t = Table(title=f"{cfg.model.name} on {cfg.cluster.n_gpus}× {cfg.cluster.gpu.name}, seq {cfg.training.seq_len}, "
                    f"global batch {cfg.training.global_batch}: {len(feas)} feasible of {len(df)} layouts")
    # p10–p90 of each row: the held-out errors of the generation's published rows of its family class, valid for the
    # shipped fit only (a config's efficiency overrides are a different model, whose errors nobody measured)
    gen = cfg.cluster.gpu.generation
    errors = heldout_errors_by_family(gen) if eff == Efficiency.for_gpu(cfg.cluster.gpu) else {}
    factors = {f: interval_bounds(1.0, error_pool(errors, f)) for f in ("FSDP/ZeRO", "TP", "PP", "CP")} if errors else {}
    if args.csv:  # every candidate, with its p10/p90 (empty where no measured interval applies)
        fam = family_class(df)
        lo_f, hi_f = ([factors.get(f, (float("nan"),) * 2)[i] for f in fam] for i in (0, 1))
        out = df.assign(interval_family=fam, tokens_per_s_per_gpu_p10=df["tokens_per_s_per_gpu"] * lo_f,
                        tokens_per_s_per_gpu_p90=df["tokens_per_s_per_gpu"] * hi_f)
        write_csv_arg("csv", out, args.csv)
    for c in ("#", "layout", "family", "tok/s/GPU", "p10–p90", "MFU", "step s", "weights", "grads", "optim", "activ",
              "total GiB", "headroom"):
        t.add_column(c, justify="left" if c in ("layout", "family") else "right")
    moved = []  # ranked on the speed of what the launch runs: where that is not the plan's, say so under the table
    for _, r in feas.head(args.top).iterrows():
        lo, hi = factors.get(family_class(r), (None, None))
        tps = launched_tps(r, "tokens_per_s_per_gpu")
        band = f"{lo * tps:.0f}–{hi * tps:.0f}" if lo is not None else "—"
        mark = ""
        if launch_changes_speed(r):
            moved.append(f"{r['rank']}: {r[LAUNCH_TPS_WHY]} ({r['tokens_per_s_per_gpu']:.0f} as planned)")
            mark = "*"
        t.add_row(str(r["rank"]), r["layout_text"], r["family"], f"{tps:.0f}{mark}", band, f"{r['mfu']:.1%}",
                  f"{r['step_time_s']:.2f}", f"{r['mem_weights_gib']:.1f}", f"{r['mem_gradients_gib']:.1f}",
                  f"{r['mem_optimizer_gib']:.1f}", f"{r['mem_activations_gib']:.1f}", f"{r['mem_total_gib']:.1f}",
                  f"{r['headroom_frac']:.0%}")
    con.print(t)
    if moved:
        con.print("* tokens/s/GPU and its p10–p90 of what the launch runs (MFU and step time: the plan's): "
                  + "; ".join(moved), highlight=False)
    con.print(f"p10–p90: predictive interval over the leave-one-table-out errors of the {gen.upper()} published rows of "
              "the layout's family class (FSDP/ZeRO, TP, PP, CP); layouts whose intervals overlap are not ranked by the "
              "model alone" if factors else
              "p10–p90: — (the config overrides the shipped efficiency fit, or its GPU generation has no held-out "
              "errors: no measured interval applies)", highlight=False)
    con.print("[bold]Why each family loses[/bold] (data-parallel sharding × TP × PP; best layout of each):")
    for v in group_infeasible(family_verdicts(df).to_dict("records")):
        con.print(f"  [bold]{v['family']}[/bold] ({v['verdict']}): {v['line']}", highlight=False)
    con.print("[bold]What each technique buys[/bold] (best layout with it vs without it):")
    for _, v in technique_verdicts(df, impossible=impossible_techniques(cfg.cluster, cfg.training, options)).iterrows():
        con.print(f"  [bold]{v['technique']}[/bold]: {v['line']}", highlight=False)
    if cfg.layout is None and len(feas):
        alt = batch_alternative(cfg.model, cfg.cluster, cfg.training, eff, options,
                                launched_tps(best_row(feas), "tokens_per_s_per_gpu"), plan_search)
        if alt:
            con.print(f"[bold]Global batch[/bold]: {alt['configured']:,} sequences do not divide over "
                      f"{cfg.cluster.n_gpus} GPUs (no layout with dp = {cfg.cluster.n_gpus}); at "
                      f"{alt['global_batch']:,}" + (f" (or {alt['other']:,})" if alt["other"] else "")
                      + f" the best would be {alt['family']} ({alt['layout']}), {alt['tokens_per_s_per_gpu']:,.0f} "
                      f"tokens/s/GPU, {alt['gain_frac']:.1%} faster (a training choice: learning rate, steps)",
                      highlight=False)
    why = infeasible_summary(df)
    if why:  # say why in one line: the commonest kinds of first reason (numbers aside), an example each
        warn(why)
    return 0
