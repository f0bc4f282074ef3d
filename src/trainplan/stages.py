"""One function per Snakemake rule: read the rule's inputs and config slice, call the package, write.

``workflow/scripts/<rule>.py`` is a three-line adapter calling ``stages.<rule>(snakemake)``. Each stage
here unpacks the ``snakemake`` object into plain dicts and hands them to ``run_<rule>(inp, out, cfg)``,
which is what tests call without Snakemake. Every output gets a provenance sidecar whose config hash
covers exactly the slice in ``params.cfg`` (see ``trainplan.config.RULE_SECTIONS``).

Every stage calls the real package function (``search.search``, ``proxy.select.select_proxies``,
``trainplan proxy``, ``proxy.aggregate.aggregate``, ``calibrate.stage_calibrate`` /
``stage_fit_scaling``, ``extrapolate.stage_predict_production``, ``cost.stage_cost_and_risk`` +
``sensitivity.stage_sensitivity``, ``figures.make_figures``, ``memo.render_memo``,
``launch.write_artifacts``); there are no placeholders.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trainplan.io import read_json, write_csv, write_json
from trainplan.provenance import write_sidecar

log = logging.getLogger("trainplan.stages")


# ------------------------------------------------------------------------------------------ helpers
def _specs(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec/ClusterSpec/TrainingSpec/Layout/Efficiency for whichever sections the slice holds."""
    from trainplan.config import build_cluster, build_efficiency
    from trainplan.specs import Layout, TrainingSpec, resolve_model

    out: dict[str, Any] = {}
    if "model" in cfg:
        out["model"] = resolve_model(cfg["model"])
    if "cluster" in cfg:
        out["cluster"] = build_cluster(cfg["cluster"])
    if "training" in cfg:
        tr = dict(cfg["training"])
        tr["lora_targets"] = tuple(tr.get("lora_targets", ("q", "k", "v", "o")))
        out["training"] = TrainingSpec(**tr)
    if "layout" in cfg:
        out["layout"] = Layout.from_dict(cfg["layout"]) if cfg["layout"] else None
    if "efficiency" in cfg:
        gpu = out["cluster"].gpu if "cluster" in out else None
        out["efficiency"] = build_efficiency(cfg["efficiency"] or {}, gpu)
    return out


def _files(inp: Mapping[str, Any]) -> list[str]:
    files: list[str] = []
    for v in inp.values():
        files += [str(x) for x in v] if isinstance(v, list | tuple) else [str(v)]
    return files


def _sidecars(rule: str, out: Mapping[str, Any], cfg: Any, inp: Mapping[str, Any], **kw: Any) -> None:
    """Provenance sidecars; a CSV's also promises its row count (``extra.rows``), which readers check."""
    for o in _files(out):
        if Path(o).exists():
            extra = dict(kw.get("extra") or {})
            if o.endswith(".csv"):
                extra["rows"] = _csv_rows(o)
            write_sidecar(o, rule=rule, config_slice=cfg, inputs=_files(inp),
                          **{**kw, "extra": extra or None})


# ------------------------------------------------------------------------------ corrupted results
class CorruptResultError(RuntimeError):
    """A results file is not what the rule that wrote it recorded (cut, emptied, edited): it was removed, with
    its sidecar, so the next ``snakemake`` run rebuilds it."""


def _csv_rows(path: str | Path) -> int | None:
    """Data rows of a CSV (quoted newlines handled), or None if it cannot be parsed."""
    import csv

    try:
        with open(path, newline="", encoding="utf-8") as f:
            return max(sum(1 for _ in csv.reader(f)) - 1, 0)
    except (OSError, UnicodeDecodeError, csv.Error):
        return None


def _remove_result(path: Path) -> None:
    from trainplan.provenance import sidecar_path

    for q in (path, sidecar_path(path)):
        q.unlink(missing_ok=True)


def verify_result(path: str | Path) -> None:
    """Check a file a rule wrote against its provenance sidecar (sha256, and a CSV's promised row count).
    On a mismatch, remove it and its sidecar and raise :class:`CorruptResultError` naming the file, so the
    rerun rebuilds it instead of using it. Files without a sidecar (sources, published data) are not judged."""
    from trainplan.provenance import file_sha256, sidecar_path

    p, sc_path = Path(path), sidecar_path(path)
    if not p.is_file() or not sc_path.is_file():
        if sc_path.is_file() and not p.exists():
            raise CorruptResultError(f"{p}: missing (its provenance sidecar is there): rerun to rebuild it")
        return
    try:
        sc = read_json(sc_path)
        promised = sc["output_sha256"]
        rule = sc.get("rule", "its rule")
        rows = (sc.get("extra") or {}).get("rows")
    except (OSError, ValueError, KeyError, TypeError) as e:
        _remove_result(p)
        raise CorruptResultError(f"{p}: its provenance sidecar {sc_path} is unreadable ({type(e).__name__}: {e}); "
                                 "removed both, so the next run rebuilds them") from None
    if promised is None or file_sha256(p) == promised:
        return
    what = "its content differs from what it wrote"
    if p.suffix == ".csv" and rows is not None:
        now = _csv_rows(p)
        if now != rows:
            what = f"{'unparseable' if now is None else f'{now} rows'} but {rule} wrote {rows}"
    elif p.suffix == ".json":
        import json

        text = p.read_text(encoding="utf-8", errors="replace")
        try:
            json.loads(text)
        except json.JSONDecodeError as e:
            what = f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno} of {len(text)} characters)"
    _remove_result(p)
    raise CorruptResultError(f"{p}: {what} (sha256 differs from {sc_path.name}): cut, emptied or edited after "
                             f"{rule} wrote it; removed with its sidecar, so the next run rebuilds it")


def verify_inputs(inp: Mapping[str, Any]) -> None:
    """:func:`verify_result` for every input file; all problems in one error."""
    problems = []
    for f in _files(inp):
        try:
            verify_result(f)
        except CorruptResultError as e:
            problems.append(str(e))
    if problems:
        raise CorruptResultError("; ".join(problems))


def _read_table(path: str | Path) -> Any:
    """A results CSV, checked against its sidecar first (:func:`verify_result`)."""
    import pandas as pd

    verify_result(path)
    return pd.read_csv(path)


def _smk_dicts(smk: Any) -> tuple[dict, dict, dict, dict]:
    inp = {k: v for k, v in smk.input.items()}
    out = {k: v for k, v in smk.output.items()}
    params = {k: v for k, v in smk.params.items()}
    wc = {k: v for k, v in smk.wildcards.items()}
    return inp, out, params, wc


def _with_log(smk: Any, fn: Callable[[], None]) -> None:
    """Run ``fn`` with logging (and stdout/stderr of this process) going to the rule's log file."""
    logfile = smk.log[0] if len(smk.log) else None
    if logfile is None:
        fn()
        return
    Path(logfile).parent.mkdir(parents=True, exist_ok=True)
    attempt = int(getattr(smk, "attempt", 1) or 1)
    # A retried job appends, so its log shows every attempt (Snakemake's `retries`).
    handler = logging.FileHandler(logfile, mode="a" if attempt > 1 else "w", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    log.info("%s: attempt %d", smk.rule, attempt)
    try:
        fn()
    except Exception:
        log.exception("%s failed", smk.rule)
        raise
    finally:
        root.removeHandler(handler)
        handler.close()


def _stage(run: Callable[..., None]) -> Callable[[Any], None]:
    def stage(smk: Any) -> None:
        inp, out, params, wc = _smk_dicts(smk)

        def go() -> None:
            verify_inputs(inp)  # a cut or edited upstream result fails here, named, and is removed
            run(inp, out, params.get("cfg", {}), **({"wildcards": wc} if wc else {}))

        _with_log(smk, go)

    stage.__name__ = run.__name__.removeprefix("run_")
    stage.__doc__ = f"Snakemake entry point for rule ``{stage.__name__}`` (see ``{run.__name__}``)."
    return stage


# ------------------------------------------------------------------------------------ analytic_model
def run_analytic_model(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """candidates.csv, families.csv, techniques.csv, summary.json from ``trainplan.search``."""
    from trainplan.estimate import estimate
    from trainplan.flops import train_flops_per_token
    from trainplan.search import family_verdicts, fp8_technique_rows, search, technique_verdicts
    from trainplan.specs import Layout

    s = _specs(cfg)
    options = dict(cfg["search"])
    if s["layout"] is not None:  # a pinned layout: its fields become single-valued search options
        options.update({k: v for k, v in s["layout"].to_dict().items() if k != "dp"})
    df = search(s["model"], s["cluster"], s["training"], s["efficiency"], options)
    fam = family_verdicts(df)
    summary: dict[str, Any] = {"status": "ok", "layout": None}
    best = df[df["rank"] == 1] if "rank" in df else df.iloc[:0]
    if len(best):
        layout = Layout.from_row(best.iloc[0])
        summary["layout"] = layout.to_dict()
        summary["family"] = str(best.iloc[0].get("family", layout.family))
        summary["estimate"] = estimate(s["model"], s["cluster"], s["training"], layout, s["efficiency"]).to_json()
    else:
        summary["status"] = "no feasible layout"
    m = s["model"]
    summary.update(model={**m.to_dict(), "n_params": m.n_params, "n_params_nonembedding": m.n_params_nonembedding},
                   n_params=m.n_params, gpu=s["cluster"].gpu.name, n_gpus=s["cluster"].n_gpus,
                   hbm_gib=s["cluster"].gpu.hbm_bytes / 2**30,
                   flops_per_token=train_flops_per_token(m, s["training"]))
    write_csv(df, out["candidates"])
    write_csv(fam, out["families"])
    if "techniques" in out:
        extra = fp8_technique_rows(s["model"], s["cluster"], s["training"], layout, s["efficiency"]) if len(best) else []
        write_csv(technique_verdicts(df, extra), out["techniques"])
    write_json(out["summary"], summary)
    _sidecars("analytic_model", out, cfg, inp)


# ------------------------------------------------------------------------------------ select_proxies
def run_select_proxies(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """proxy_set.json: RUN_SPECs chosen from the candidates by ``trainplan.proxy.select.select_proxies``."""
    import pandas as pd

    from trainplan.proxy.select import select_proxies

    s = _specs(cfg)
    specs = select_proxies(pd.read_csv(inp["candidates"]), s["model"], s["training"], dict(cfg["proxies"]))
    ids = [p["id"] for p in specs]
    if len(set(ids)) != len(ids) or any(not str(i).replace("-", "").replace("_", "").isalnum() for i in ids):
        raise ValueError(f"proxy ids must be unique and [A-Za-z0-9_-]: {ids}")
    write_json(out["proxy_set"], {"status": "ok", "proxies": list(specs)})
    _sidecars("select_proxies", out, cfg, inp)


# ----------------------------------------------------------------------------------------- proxy_run
def run_proxy_run(inp: Mapping, out: Mapping, cfg: Mapping, *, wildcards: Mapping | None = None) -> None:
    """One proxy RECORD via ``trainplan proxy RUN_SPEC.json --out RECORD.json`` (OOM → exit 0, status oom)."""
    from trainplan.cli import main

    pid = (wildcards or {}).get("id")
    spec = next(p for p in read_json(inp["proxy_set"])["proxies"] if p["id"] == pid)
    with tempfile.TemporaryDirectory(prefix=f"proxy-{pid}-") as d:
        spec_path = Path(d) / "run_spec.json"
        write_json(spec_path, spec)
        log.info("proxy %s: trainplan proxy %s --out %s", pid, spec_path, out["record"])
        try:
            rc = main(["proxy", str(spec_path), "--out", str(out["record"])])
        except SystemExit as e:  # SIGINT/SIGTERM, or the Snakemake run gone: the launcher killed every rank
            log.warning("proxy %s: interrupted (exit %s); no record written, the next run reruns it", pid, e.code)
            raise
    if rc not in (0, None) or not Path(out["record"]).exists():
        raise RuntimeError(f"proxy {pid}: `trainplan proxy` exited {rc} (see the log; Snakemake retries)")
    log.info("proxy %s: status %s", pid, read_json(out["record"]).get("status"))
    _sidecars("proxy_run", out, {**cfg, "spec": spec}, inp)


# ----------------------------------------------------------------------------------------- aggregate
def _proxy_set_path(inp: Mapping, records: list[str]) -> Path | None:
    if inp.get("proxy_set"):
        return Path(str(inp["proxy_set"]))
    return Path(records[0]).parent.parent / "proxy_set.json" if records else None


def run_aggregate(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """records.csv: one flattened row per proxy RECORD, predicted next to measured.

    Every run named in proxy_set.json must be there and be a valid RECORD (``aggregate.check_records``). A
    missing, truncated or invalid one fails the rule with its path; the bad file and its sidecar are removed,
    so the next ``snakemake`` reruns exactly those proxies. The sidecar promises the row count and ids."""
    from trainplan.proxy.aggregate import RecordsError, aggregate, parity_columns

    records = [str(p) for p in inp.get("records", [])]
    ps = _proxy_set_path(inp, records)
    expected = None
    if ps is not None and ps.exists():
        try:
            expected = [p["id"] for p in read_json(ps)["proxies"]]
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptResultError(f"{ps}: not a proxy set ({type(e).__name__}: {e})") from None
    try:
        df = parity_columns(aggregate(records, expected))
    except RecordsError as e:
        for p in e.paths:
            if p.exists():
                _remove_result(p)
            else:  # an orphaned sidecar
                from trainplan.provenance import sidecar_path

                sidecar_path(p).unlink(missing_ok=True)
        lines = "\n".join(f"  {p}: {why}" for p, why in e.problems)
        raise CorruptResultError(f"aggregate: {len(e.problems)} proxy record(s) missing or invalid — removed "
                                 f"with their sidecars; rerun snakemake to redo these proxies:\n{lines}") from None
    write_csv(df, out["records"])
    _sidecars("aggregate", out, cfg, inp, extra={"ids": list(df["id"]) if len(df) else []})


# ----------------------------------------------------------------------------------- calibrate / fits
def run_calibrate(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """calibration.json and heldout.csv from ``trainplan.calibrate.stage_calibrate``."""

    from trainplan.calibrate import stage_calibrate

    s = _specs(cfg)
    result, heldout = stage_calibrate(_read_table(inp["records"]), s["efficiency"], dict(cfg["calibration"]))
    write_json(out["calibration"], result)
    write_csv(heldout, out["heldout"])
    # committed GPU records (calibration.gpu_records_dir) are inputs too, whether or not the rule declares them
    gpu_files = [f for f in (result.get("gpu") or {}).get("records_files", []) if f not in _files(inp)]
    _sidecars("calibrate", out, cfg, {**inp, "gpu_records": gpu_files} if gpu_files else inp,
              calibration_source=result.get("source_detail") or result.get("source"))


def run_fit_scaling(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """scaling.json: depth-slice, width-ladder and scale-out fits of the CPU proxy records (bytes, FLOPs)."""

    from trainplan.calibrate import stage_fit_scaling

    s = _specs(cfg)
    result = stage_fit_scaling(_read_table(inp["records"]), s["model"], s["cluster"].n_gpus, dict(cfg["calibration"]))
    write_json(out["scaling"], result)
    _sidecars("fit_scaling", out, cfg, inp)


# -------------------------------------------------------------------------------- predict_production
def run_predict_production(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """production.csv/.json: top layouts with p10/p50/p90 from ``trainplan.extrapolate``."""
    import pandas as pd

    from trainplan.extrapolate import stage_predict_production

    s = _specs(cfg)
    calib = read_json(inp["calibration"])
    df, doc = stage_predict_production(pd.read_csv(inp["candidates"]), calib, read_json(inp["scaling"]),
                                       s["model"], s["cluster"], s["training"], cfg)
    write_csv(df, out["csv"])
    write_json(out["json"], doc)
    _sidecars("predict_production", out, cfg, inp, calibration_source=calib.get("source"))


# ------------------------------------------------------------------------------------- cost_and_risk
def run_cost_and_risk(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """cost.json (``cost.stage_cost_and_risk``) and sensitivity.csv (``sensitivity.stage_sensitivity``)."""
    from trainplan.cost import stage_cost_and_risk
    from trainplan.efficiency import Efficiency
    from trainplan.sensitivity import stage_sensitivity

    s = _specs(cfg)
    production = read_json(inp["production"])
    m, c, t = s["model"], s["cluster"], s["training"]
    doc, inputs = stage_cost_and_risk(production, n_params=float(m.n_params), n_gpus=c.n_gpus,
                                      total_tokens=float(t.total_tokens), d2h_Bps=c.host_to_device_Bps,
                                      cost_cfg=dict(cfg["cost"]), targets=dict(cfg["targets"]))
    options = dict(cfg["search"])
    if s["layout"] is not None:
        options.update({k: v for k, v in s["layout"].to_dict().items() if k != "dp"})
    eff = Efficiency.from_dict({k: v for k, v in (production.get("efficiency") or {}).items() if v is not None})
    sens = stage_sensitivity(production["chosen"], model=m, cluster=c, training=t, eff=eff, options=options,
                             inputs=inputs, inter_busbw_GBps=float(cfg["cluster"]["inter_busbw_GBps"]))
    doc["sensitivity_flips"] = sens.loc[sens["changes_recommendation"], "parameter"].tolist()
    write_json(out["cost"], doc)
    write_csv(sens, out["sensitivity"])
    _sidecars("cost_and_risk", out, cfg, inp, calibration_source=doc.get("calibration_source"))


# ------------------------------------------------------------------------------------- figures, memo
def run_figures(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """results/figures/*.svg via ``trainplan.figures.make_figures`` (each with caption metadata)."""
    from trainplan.figures import make_figures

    results = Path(inp["cost"]).parent.parent
    outdir = Path(out["figures"])
    outdir.mkdir(parents=True, exist_ok=True)
    made = make_figures(results, outdir)
    write_json(outdir / "index.json", {"status": "ok", "figures": {k: str(v) for k, v in made.items()}})
    for svg in sorted(outdir.glob("*.svg")):
        write_sidecar(svg, rule="figures", config_slice=cfg, inputs=_files(inp))


def run_memo(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """design_memo.pdf via ``trainplan.memo.render_memo``."""
    from trainplan.benchmarks_report import benchmark_rows, benchmark_summary
    from trainplan.memo import render_memo
    from trainplan.provenance import git_state, study_hash

    results = Path(inp["cost"]).parent.parent
    os.environ.setdefault("SOURCE_DATE_EPOCH", str(cfg["memo"]["source_date_epoch"]))
    bench = inp.get("benchmarks")
    files = [bench] if isinstance(bench, str) else list(bench or [])
    render_memo(results, out["pdf"], config=dict(cfg), study_hash=study_hash(cfg),
                git_commit=str(git_state()["commit"]), figures_dir=inp["figures"],
                benchmarks=benchmark_summary(benchmark_rows(files)) if files else None,
                template=inp.get("template"), css=inp.get("css"))
    _sidecars("memo", out, cfg, inp)


# ---------------------------------------------------------------------------------- launch_artifacts
def run_launch_artifacts(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """accelerate/torchrun/sbatch/DeepSpeed files + manifest.json for the chosen layout (``trainplan.launch``)."""
    from trainplan.launch import write_artifacts
    from trainplan.provenance import study_hash
    from trainplan.specs import Layout

    s = _specs(cfg)
    layout = read_json(inp["summary"]).get("layout")
    if layout is None:
        raise RuntimeError("launch_artifacts: no feasible layout in analytic/summary.json (see families.csv)")
    outdir = Path(out["manifest"]).parent
    # cost.json's Young/Daly interval and the chosen layout's predicted step time set the checkpoint interval; its
    # p10 tokens/s/GPU is the day-1 throughput threshold (optional inputs: a bare launch run works without them)
    cost = read_json(inp["cost"]) if inp.get("cost") else {}
    chosen = (read_json(inp["production"]) if inp.get("production") else {}).get("chosen") or {}
    tps = chosen.get("tokens_per_s_per_gpu_p50")
    ckpt_h = cost.get("checkpoint_interval_h")
    write_artifacts(s["model"], s["cluster"], s["training"], Layout.from_dict(layout), outdir,
                    study_hash=study_hash(cfg), options=cfg["launch"],
                    checkpoint_interval_s=float(ckpt_h) * 3600.0 if ckpt_h else None,
                    step_time_s=s["training"].tokens_per_step / (float(tps) * s["cluster"].n_gpus) if tps else None,
                    min_tokens_per_s_per_gpu=chosen.get("tokens_per_s_per_gpu_p10"))
    for f in sorted(outdir.iterdir()):
        if f.is_file() and not f.name.endswith(".provenance.json") and not f.name.startswith("."):
            write_sidecar(f, rule="launch_artifacts", config_slice=cfg, inputs=_files(inp))


# ------------------------------------------------------------------------------ Snakemake entry points
analytic_model = _stage(run_analytic_model)
select_proxies = _stage(run_select_proxies)
proxy_run = _stage(run_proxy_run)
aggregate = _stage(run_aggregate)
calibrate = _stage(run_calibrate)
fit_scaling = _stage(run_fit_scaling)
predict_production = _stage(run_predict_production)
cost_and_risk = _stage(run_cost_and_risk)
figures = _stage(run_figures)
memo = _stage(run_memo)
launch_artifacts = _stage(run_launch_artifacts)

__all__ = [n for n in dir(sys.modules[__name__]) if n.startswith("run_")] + [
    "analytic_model", "select_proxies", "proxy_run", "aggregate", "calibrate", "fit_scaling",
    "predict_production", "cost_and_risk", "figures", "memo", "launch_artifacts"]
