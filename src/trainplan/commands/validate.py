"""``trainplan validate``: predicted vs the open published tables, MAPE per table; ``--heldout`` leaves each table
out of its GPU generation's fit (bias per family class, interval coverage)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from rich.table import Table

from trainplan.calibration.gpu import (
    BF16_STEP_FILE,
    check_bf16_steps,
    check_gpu_records,
    gpu_records,
    load_gpu_records,
    summarize_bf16_steps,
    summarize_gpu_check,
)
from trainplan.commands.common import check_out_path, console, write_csv_arg
from trainplan.model.base import ConfigError
from trainplan.proxy.aggregate import RecordsError
from trainplan.published.fit import (
    GEN_FIT,
    family_bias,
    heldout_checks,
    heldout_rows,
    interval_coverage,
    never_fitted_rows,
)
from trainplan.published.tables import NEVER_FITTED, mape_table, validate_all


def run(args: argparse.Namespace) -> int:
    check_out_path("csv", args.csv)
    t = args.h100_peak_tflops
    if t is not None and not (math.isfinite(t) and 0 < t <= 100_000):
        raise ConfigError("h100-peak-tflops", t, "a finite number of TFLOP/s in (0, 100000]")
    if args.jobs is not None and not args.heldout:
        raise ConfigError("jobs", args.jobs, "applies only with --heldout (its refits run in worker processes)")
    if args.gpu_records is not None:
        return print_gpu_check(args.gpu_records, args.csv)
    if args.heldout:
        return print_heldout(heldout_rows(jobs=args.jobs), args.csv, never_fitted_rows())
    peak = None if args.h100_peak_tflops is None else args.h100_peak_tflops * 1e12
    df = validate_all(h100_peak_flops=peak)
    if args.csv:
        write_csv_arg("csv", df, args.csv)
    con = console()
    for table, g in df.groupby("table", sort=False):
        t = Table(title=table)
        for c in ("row", "metric", "published", "predicted", "err %", "in MAPE", "note"):
            t.add_column(c, justify="left" if c in ("row", "metric", "note") else "right")
        for _, r in g.iterrows():
            t.add_row(r["row"], r["metric"], f"{r['published']:.4g}", f"{r['predicted']:.4g}", f"{r['err_pct']:+.1f}",
                      "yes" if r["in_mape"] else "no", r["note"])
        con.print(t)
    m = Table(title="MAPE per table (rows the model speaks to; in-sample for the fitted tables)")
    for c in ("table", "metric", "MAPE %", "bias %", "rows", "role"):
        m.add_column(c)
    fitted = {t for spec in GEN_FIT.values() for t in spec["tables"]}
    for _, r in mape_table(df).iterrows():
        role = "fitted" if r["table"] in fitted else ("never fitted" if r["table"] in NEVER_FITTED else "scored")
        m.add_row(r["table"], r["metric"], f"{r['mape_pct']:.1f}", f"{r['bias_pct']:+.1f}", str(r["rows"]), role)
    con.print(m)
    return 0


def print_heldout(rows: Any, csv: str | None, never: Any = None) -> int:
    """Leave one table out per GPU generation: each table predicted by its generation's Efficiency refitted on
    the generation's other tables; then the bias per family class and the interval's empirical coverage; then the
    tables no fit ever sees (``never``: NeMo's Transformer Engine FP8 runs), per table and family, apart."""
    if csv:
        write_csv_arg("csv", rows, csv)
    con = console()
    t = Table(title="Held-out error per published table (its generation's Efficiency refitted without it)")
    for c in ("held out", "gen", "metric", "fitted on", "rows", "MAPE %", "bias %", "worst %"):
        t.add_column(c, justify="right" if c in ("rows", "MAPE %", "bias %", "worst %") else "left")
    for (table, gen, metric, fit_on), g in rows.groupby(["table", "generation", "metric", "held_out_fit"], sort=False):
        e = g["err_pct"]
        t.add_row(table, gen, metric, fit_on, str(len(g)), f"{e.abs().mean():.1f}", f"{e.mean():+.1f}",
                  f"{e.abs().max():.1f}")
    con.print(t)
    f = Table(title="Held-out bias per family class (FSDP/ZeRO = data parallel only; TP; PP; CP)")
    for c in ("gen", "family", "rows", "bias %", "± s.e. %", "MAPE %", "worst %"):
        f.add_column(c, justify="left" if c in ("gen", "family") else "right")
    for r in family_bias(rows).itertuples():
        f.add_row(r.generation, r.family, str(r.rows), f"{r.bias_pct:+.1f}", f"{r.bias_se_pct:.1f}", f"{r.mape_pct:.1f}",
                  f"{r.worst_abs_pct:.1f}")
    con.print(f)
    for gen, g in rows.groupby("generation", sort=True):
        cov = interval_coverage(g)
        con.print(f"{gen}: p10–p90 interval from the other held-out errors of the family (or generation) holds "
                  f"{cov['measured']:.0%} of {cov['n']} held-out rows (nominal {cov['nominal']:.0%})")
    v = Table(title="Held-out accuracy targets per GPU generation (published.fit.HELDOUT_TARGETS)")
    for c in ("gen", "check", "worst case", "measured", "target", "met"):
        v.add_column(c, justify="right" if c in ("measured",) else "left")
    for r in heldout_checks(rows).itertuples():
        v.add_row(r.generation, r.check, r.worst, r.measured, r.target, "—" if r.met is None else "yes" if r.met else "NO")
    con.print(v)
    if never is not None and len(never):
        n = Table(title="Tables no fit sees (NeMo, Transformer Engine FP8; the fitted FP8 recipe is torchao's): "
                        "error of the shipped fit per table and family class")
        for c in ("table", "family", "rows", "MAPE %", "bias %", "worst %"):
            n.add_column(c, justify="left" if c in ("table", "family") else "right")
        for (table, fam), g in never.groupby(["table", "family"], sort=True):
            e = g["err_pct"]
            n.add_row(table, fam, str(len(g)), f"{e.abs().mean():.1f}", f"{e.mean():+.1f}", f"{e.abs().max():.1f}")
        con.print(n)
    return 0


def print_gpu_check(directory: str, csv: str | None) -> int:
    """Our own GPU proxy RECORDs predicted by the shipped fit of each record's GPU generation (none fitted on them):
    step time, max allocated and reserved memory and one block's saved bytes per record, then errors per family;
    then, where the directory holds it, the same session's production-regime timings (``BF16_STEP_FILE``)."""
    if not Path(directory).is_dir():
        raise ConfigError("gpu-records", directory, "a directory of GPU proxy RECORD JSONs (scripts/device_proxies.sh)")
    try:
        records, files = load_gpu_records(directory)
    except RecordsError as e:  # JSON files that are no RECORDs: name the first few, no traceback
        raise ConfigError("gpu-records", directory, f"a directory of GPU proxy RECORD JSONs; {e}") from None
    if not len(gpu_records(records)):
        raise ConfigError("gpu-records", directory,
                          f"a directory holding ok CUDA proxy RECORDs ({len(files)} RECORD files, none ok on CUDA)")
    check = check_gpu_records(records)
    if csv:
        write_csv_arg("csv", check, csv)
    con = console()
    t = Table(title=f"GPU proxy records in {directory}, predicted by the shipped fit (none fitted on them)")
    for c in ("record", "family", "GPU", "bf16 via", "attention", "layers", "hidden", "seq", "step ms", "pred ms", "tok/s err %",
              "alloc GiB", "pred GiB", "alloc err %", "reserved err %", "block saves Δ B"):
        t.add_column(c, justify="left" if c in ("record", "family", "GPU", "bf16 via", "attention") else "right")
    for r in check.itertuples():
        t.add_row(r.id, r.family, r.gpu, r.regime, r.attn_kernel, str(r.layers), str(r.hidden), str(r.seq_len),
                  f"{r.step_time_measured_s * 1e3:.1f}", f"{r.step_time_predicted_s * 1e3:.1f}",
                  f"{r.throughput_err * 100:+.1f}", f"{r.allocated_measured_bytes / 2**30:.2f}",
                  f"{r.allocated_predicted_bytes / 2**30:.2f}", f"{r.allocated_err * 100:+.1f}",
                  f"{r.reserved_err * 100:+.1f}", f"{r.saved_layer_predicted_bytes - r.saved_layer_measured_bytes:+,.0f}")
    con.print(t)
    s = Table(title="Per proxy family (tokens/s error: + = the model is optimistic; memory: predicted/measured − 1 of "
                    "max allocated and max reserved; block saves: the largest |predicted − measured| bytes one block "
                    "saves for backward)")
    for c in ("family", "records", "tok/s MAPE %", "tok/s bias %", "tok/s worst %", "alloc bias %", "reserved bias %",
              "block saves |Δ| B"):
        s.add_column(c, justify="left" if c == "family" else "right")
    for r in summarize_gpu_check(check).itertuples():
        s.add_row(r.family, str(r.n), f"{r.throughput_mape * 100:.1f}", f"{r.throughput_bias * 100:+.1f}",
                  f"{r.throughput_worst * 100:+.1f}", f"{r.allocated_bias * 100:+.1f}", f"{r.reserved_bias * 100:+.1f}",
                  f"{r.saved_layer_max_abs_err_bytes:,.0f}")
    con.print(s)
    bf16 = Path(directory) / BF16_STEP_FILE
    if bf16.is_file():
        steps = check_bf16_steps(bf16)
        b = Table(title=f"Production precision regime on one GPU ({bf16}: bf16 parameters, one micro-batch forward + "
                        "backward, no optimizer), predicted as compute_s by the shipped fit (none fitted on them)")
        for c in ("GPU", "attention", "seq", "layers", "measured ms", "pred ms", "tok/s err %", "per-layer err %"):
            b.add_column(c, justify="left" if c in ("GPU", "attention") else "right")
        for r in steps.itertuples():
            b.add_row(r.gpu, r.attn_kernel, str(r.seq_len), str(r.layers), f"{r.measured_s * 1e3:.2f}",
                      f"{r.predicted_s * 1e3:.2f}", f"{r.throughput_err * 100:+.1f}", f"{r.layer_err * 100:+.1f}")
        con.print(b)
        sm = summarize_bf16_steps(steps)
        con.print(f"bf16 steps: {sm['n']} runs, tokens/s MAPE {sm['throughput_mape'] * 100:.1f}%, bias "
                  f"{sm['throughput_bias'] * 100:+.1f}%, range {sm['throughput_min'] * 100:+.1f} … "
                  f"{sm['throughput_max'] * 100:+.1f}%; per-layer slope {sm['layer_err_min'] * 100:+.1f} … "
                  f"{sm['layer_err_max'] * 100:+.1f}%")
    return 0
