"""One function per Snakemake rule: read the rule's inputs and config slice, call the package, write.

``workflow/scripts/<rule>.py`` is a three-line adapter calling ``stages.<rule>(snakemake)``. Each stage
here unpacks the ``snakemake`` object into plain dicts and hands them to ``run_<rule>(inp, out, cfg)``,
which is what tests call without Snakemake. Every output gets a provenance sidecar whose config hash
covers exactly the slice in ``params.cfg`` (see ``trainplan.config.RULE_SECTIONS``).

Stage hooks: a stage calls the contract API where ARCHITECTURE.md fixes one (``search.search``,
``proxy.aggregate.aggregate``, ``trainplan proxy``, ``figures.make_figures``, ``memo.render_memo``) and
otherwise a ``stage_<rule>`` function in the owning module (signatures in ARCHITECTURE.md, "Stage hooks").
Where that function does not exist yet, the stage writes a small, honest placeholder whose
``status`` is ``"not yet implemented"`` (never invented numbers), so the DAG runs end to end. The
placeholders are listed in ``PLACEHOLDERS`` once they fire (and in the README).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trainplan.io import read_json, write_csv, write_json, write_text
from trainplan.provenance import write_sidecar

log = logging.getLogger("trainplan.stages")
NYI = "not yet implemented"
PLACEHOLDERS: set[str] = set()


# ------------------------------------------------------------------------------------------ helpers
def _hook(module: str, name: str) -> Callable[..., Any] | None:
    """``module.name`` if that module and attribute exist; None only when the module itself is missing.

    ``TRAINPLAN_PLACEHOLDER_STAGES=1`` forces every placeholder: the workflow tests use it to check the
    DAG's mechanics (reruns, checkpoints, Slurm submission) independently of the science modules.
    """
    if os.environ.get("TRAINPLAN_PLACEHOLDER_STAGES") == "1":
        return None
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and (module == e.name or module.startswith(e.name + ".")):
            return None
        raise
    return getattr(mod, name, None)


def _placeholder(rule: str, what: str) -> dict[str, Any]:
    PLACEHOLDERS.add(f"{rule}: {what}")
    log.warning("%s: placeholder output (%s: %s)", rule, what, NYI)
    return {"status": NYI, "rule": rule, "missing": what}


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
        out["efficiency"] = build_efficiency(cfg["efficiency"] or {})
    return out


def _files(inp: Mapping[str, Any]) -> list[str]:
    files: list[str] = []
    for v in inp.values():
        files += [str(x) for x in v] if isinstance(v, list | tuple) else [str(v)]
    return files


def _sidecars(rule: str, out: Mapping[str, Any], cfg: Any, inp: Mapping[str, Any], **kw: Any) -> None:
    for o in _files(out):
        if Path(o).exists():
            write_sidecar(o, rule=rule, config_slice=cfg, inputs=_files(inp), **kw)


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
    handler = logging.FileHandler(logfile, mode="w", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
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
        _with_log(smk, lambda: run(inp, out, params.get("cfg", {}), **({"wildcards": wc} if wc else {})))

    stage.__name__ = run.__name__.removeprefix("run_")
    stage.__doc__ = f"Snakemake entry point for rule ``{stage.__name__}`` (see ``{run.__name__}``)."
    return stage


# ------------------------------------------------------------------------------------ analytic_model
def _enumerate_structural(model: Any, cluster: Any, training: Any, search: Mapping[str, Any]) -> Any:
    """Placeholder search: every dp·tp·pp·cp = N with structural feasibility only (no memory, no time)."""
    import pandas as pd

    from trainplan.specs import Layout, layout_problems

    n, rows = cluster.n_gpus, []
    for tp in (t for t in range(1, search.get("max_tp", 8) + 1) if n % t == 0):
        for pp in (p for p in range(1, search.get("max_pp", 8) + 1) if (n // tp) % p == 0):
            dp = n // (tp * pp)
            for sharding in search.get("shardings", ["zero3"]):
                if sharding == "hsdp" and dp <= cluster.gpus_per_node:
                    continue
                lay = Layout(dp=dp, tp=tp, pp=pp, sharding=sharding)
                why = layout_problems(model, cluster, training, lay)
                rows.append({**lay.to_dict(), "family": lay.family, "feasible": not why, "reason": "; ".join(why)})
    return pd.DataFrame(rows)


def _layout_from_row(row: Any) -> Any:
    """A Layout from one candidates row (numpy scalars → Python; empty shard_group → None)."""
    import math

    from trainplan.specs import Layout, LayoutTable

    d = {}
    for k in LayoutTable.FIELDS:
        if k in row.index:
            v = row[k].item() if hasattr(row[k], "item") else row[k]
            d[k] = None if k == "shard_group" and (v is None or (isinstance(v, float) and math.isnan(v)) or v == 0) else v
    if d.get("shard_group") is not None:
        d["shard_group"] = int(d["shard_group"])
    return Layout.from_dict(d)


def run_analytic_model(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """candidates.csv, families.csv, summary.json from ``trainplan.search`` (structural placeholder without it)."""
    import pandas as pd

    s = _specs(cfg)
    search = _hook("trainplan.search", "search")
    verdicts = _hook("trainplan.search", "family_verdicts")
    if search is not None and verdicts is not None:
        options = dict(cfg["search"])
        if s["layout"] is not None:  # a pinned layout: its fields become single-valued search options
            options.update({k: v for k, v in s["layout"].to_dict().items() if k != "dp"})
        df = search(s["model"], s["cluster"], s["training"], s["efficiency"], options)
        fam = verdicts(df)
        summary: dict[str, Any] = {"status": "ok"}
        best = df[df["rank"] == 1] if "rank" in df else df.iloc[:0]
        if len(best):
            layout = _layout_from_row(best.iloc[0])
            summary["layout"] = layout.to_dict()
            summary["family"] = str(best.iloc[0].get("family", layout.family))
            est = _hook("trainplan.estimate", "estimate")
            if est is not None:
                summary["estimate"] = est(s["model"], s["cluster"], s["training"], layout, s["efficiency"]).to_json()
        else:
            summary["layout"] = None
            summary["status"] = "no feasible layout"
    else:
        df = _enumerate_structural(s["model"], s["cluster"], s["training"], cfg["search"])
        feas = df[df["feasible"]]
        fam = feas.groupby("family", as_index=False).first()[["family", "dp", "tp", "pp", "sharding"]]
        fam["verdict"] = NYI
        summary = _placeholder("analytic_model", "trainplan.search.search / family_verdicts")
        summary["layout"] = s["layout"].to_dict() if s["layout"] else None
    summary.update(model=s["model"].to_dict(), n_params=s["model"].n_params, gpu=s["cluster"].gpu.name,
                   n_gpus=s["cluster"].n_gpus, hbm_gib=s["cluster"].gpu.hbm_bytes / 2**30)
    write_csv(df, out["candidates"])
    write_csv(pd.DataFrame(fam), out["families"])
    write_json(out["summary"], summary)
    _sidecars("analytic_model", out, cfg, inp)


# ------------------------------------------------------------------------------------ select_proxies
def _depth_specs(model: Any, training: Any, px: Mapping[str, Any]) -> list[dict]:
    """Placeholder selection: the depth-slice family straight from the config (RUN_SPEC per depth)."""
    from trainplan.specs import Layout

    n = px["nproc_per_node"] * px["nnodes"]
    layout = Layout(dp=n, sharding="zero3" if n > 1 else "none").to_dict()
    return [{"id": f"depth-L{k}", "family": "depth", "model": model.with_layers(k).to_dict(), "layout": layout,
             "seq_len": min(px["seq_len"], training.seq_len), "global_batch": px["global_batch"],
             "steps": px["steps"], "warmup": px["warmup"], "nproc_per_node": px["nproc_per_node"],
             "nnodes": px["nnodes"], "device": px["device"], "dtype": px["dtype"], "finetune": training.finetune,
             "lora_rank": training.lora_rank, "lora_targets": list(training.lora_targets), "compile": False,
             "seed": px["seed"], "timeout_s": px["timeout_s"], "mem_limit_bytes": None, "data": "synthetic"}
            for k in px["depth_layers"][: px["max_proxies"]]]


def run_select_proxies(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """proxy_set.json: RUN_SPECs chosen from the candidates by ``trainplan.proxy.select.select_proxies``."""
    import pandas as pd

    s = _specs(cfg)
    select = _hook("trainplan.proxy.select", "stage_select_proxies")
    cand = pd.read_csv(inp["candidates"])
    if select is not None:
        specs = select(cand, s["model"], s["training"], cfg["proxies"])
        doc: dict[str, Any] = {"status": "ok", "proxies": list(specs)}
    else:
        doc = _placeholder("select_proxies", "trainplan.proxy.select.stage_select_proxies")
        doc["proxies"] = _depth_specs(s["model"], s["training"], cfg["proxies"])
    ids = [p["id"] for p in doc["proxies"]]
    if len(set(ids)) != len(ids) or any(not str(i).replace("-", "").replace("_", "").isalnum() for i in ids):
        raise ValueError(f"proxy ids must be unique and [A-Za-z0-9_-]: {ids}")
    write_json(out["proxy_set"], doc)
    _sidecars("select_proxies", out, cfg, inp)


# ----------------------------------------------------------------------------------------- proxy_run
def run_proxy_run(inp: Mapping, out: Mapping, cfg: Mapping, *, wildcards: Mapping | None = None) -> None:
    """One proxy RECORD via ``trainplan proxy RUN_SPEC.json --out RECORD.json`` (OOM → exit 0, status oom)."""
    pid = (wildcards or {}).get("id")
    spec = next(p for p in read_json(inp["proxy_set"])["proxies"] if p["id"] == pid)
    main = _hook("trainplan.cli", "main")
    if main is None:
        rec = _placeholder("proxy_run", "trainplan.cli proxy")
        rec.update(id=pid, spec=spec)
        write_json(out["record"], rec)
    else:
        with tempfile.TemporaryDirectory(prefix=f"proxy-{pid}-") as d:
            spec_path = Path(d) / "run_spec.json"
            write_json(spec_path, spec)
            log.info("proxy %s: trainplan proxy %s --out %s", pid, spec_path, out["record"])
            rc = main(["proxy", str(spec_path), "--out", str(out["record"])])
        if rc not in (0, None) or not Path(out["record"]).exists():
            raise RuntimeError(f"proxy {pid}: `trainplan proxy` exited {rc} (see the log; Snakemake retries)")
        status = read_json(out["record"]).get("status")
        log.info("proxy %s: status %s", pid, status)
    _sidecars("proxy_run", out, {**cfg, "spec": spec}, inp)


# ----------------------------------------------------------------------------------------- aggregate
def run_aggregate(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """records.csv: one flattened row per proxy RECORD, predicted next to measured."""
    import pandas as pd

    paths = [str(p) for p in inp.get("records", [])]
    records = [read_json(p) for p in paths]
    agg = _hook("trainplan.proxy.aggregate", "aggregate")
    if agg is not None:
        df = agg(paths)
    else:
        _placeholder("aggregate", "trainplan.proxy.aggregate.aggregate")
        df = pd.json_normalize(records) if records else pd.DataFrame({"id": [], "status": []})
    write_csv(df, out["records"])
    _sidecars("aggregate", out, cfg, inp)


# ----------------------------------------------------------------------------------- calibrate / fits
def _published_tables(paths: list[str]) -> Any:
    import pandas as pd

    frames = [pd.read_csv(p).assign(table=Path(p).name) for p in paths]
    return pd.concat(frames, ignore_index=True) if frames else None


def run_calibrate(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """calibration.json (+ heldout.csv) from ``trainplan.calibrate.calibrate``; defaults without it."""
    import pandas as pd

    s = _specs(cfg)
    records = pd.read_csv(inp["records"])
    published = list(inp.get("published", []))
    cal = _hook("trainplan.calibrate", "stage_calibrate")
    if cal is not None:
        result, heldout = cal(records, published, s["cluster"], s["efficiency"], cfg["calibration"])
    else:
        result = _placeholder("calibrate", "trainplan.calibrate.stage_calibrate")
        eff = s["efficiency"]
        result.update(source="defaults", efficiency=eff.to_dict() if hasattr(eff, "to_dict") else eff, fits=[])
        validate_all = _hook("trainplan.validate", "validate_all")
        heldout = validate_all(eff) if validate_all is not None else pd.DataFrame({"table": [], "mape": []})
    write_json(out["calibration"], result)
    write_csv(heldout, out["heldout"])
    _sidecars("calibrate", out, cfg, inp, calibration_source=result.get("source"))


def run_fit_scaling(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """scaling.json: depth-slice, width-ladder and scale-out fits of the proxy records."""
    import pandas as pd

    records = pd.read_csv(inp["records"])
    fit = _hook("trainplan.calibrate", "stage_fit_scaling")
    if fit is not None:
        result = fit(records, cfg["calibration"])
    else:
        result = _placeholder("fit_scaling", "trainplan.calibrate.stage_fit_scaling")
        result.update(n_records=len(records), fits=[])
    write_json(out["scaling"], result)
    _sidecars("fit_scaling", out, cfg, inp)


# -------------------------------------------------------------------------------- predict_production
def run_predict_production(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """production.csv/.json: top layouts with p10/p50/p90 from ``trainplan.extrapolate.predict_production``."""
    import pandas as pd

    s = _specs(cfg)
    cand = pd.read_csv(inp["candidates"])
    calib, scaling = read_json(inp["calibration"]), read_json(inp["scaling"])
    pred = _hook("trainplan.extrapolate", "stage_predict_production")
    if pred is not None:
        df, doc = pred(cand, calib, scaling, s["model"], s["cluster"], s["training"], cfg)
    else:
        doc = _placeholder("predict_production", "trainplan.extrapolate.stage_predict_production")
        top = cand[cand["feasible"].astype(bool)]
        if "rank" in top:
            top = top.sort_values("rank")
        df = top.head(cfg["search"]["top_k"]).copy()
        df["source"] = calib.get("source", "defaults")
        doc.update(source=calib.get("source"), layouts=len(df))
    write_csv(df, out["csv"])
    write_json(out["json"], doc)
    _sidecars("predict_production", out, cfg, inp, calibration_source=calib.get("source"))


# ------------------------------------------------------------------------------------- cost_and_risk
def run_cost_and_risk(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """cost.json and sensitivity.csv from ``trainplan.cost.cost_and_risk``."""
    import pandas as pd

    s = _specs(cfg)
    production = read_json(inp["production"])
    fn = _hook("trainplan.cost", "stage_cost_and_risk")
    if fn is not None:
        doc, sens = fn(production, s["cluster"], s["training"], cfg["cost"], cfg["targets"])
    else:
        doc = _placeholder("cost_and_risk", "trainplan.cost.stage_cost_and_risk")
        doc.update(n_gpus=s["cluster"].n_gpus, total_tokens=s["training"].total_tokens,
                   price_per_gpu_hour_usd=cfg["cost"]["price_per_gpu_hour_usd"], target_config=cfg["targets"])
        sens = pd.DataFrame({"assumption": [], "low": [], "high": []})
    write_json(out["cost"], doc)
    write_csv(sens, out["sensitivity"])
    _sidecars("cost_and_risk", out, cfg, inp)


# ------------------------------------------------------------------------------------- figures, memo
def run_figures(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """results/figures/*.svg via ``trainplan.figures.make_figures`` (each with caption metadata)."""
    results = Path(inp["cost"]).parent.parent
    outdir = Path(out["figures"])
    outdir.mkdir(parents=True, exist_ok=True)
    make = _hook("trainplan.figures", "make_figures")
    if make is not None:
        made = make(results, outdir)
        index = {"status": "ok", "figures": {k: str(v) for k, v in made.items()}}
    else:
        index = _placeholder("figures", "trainplan.figures.make_figures")
        index["figures"] = {}
    write_json(outdir / "index.json", index)
    for svg in sorted(outdir.glob("*.svg")):
        write_sidecar(svg, rule="figures", config_slice=cfg, inputs=_files(inp))


def run_memo(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """design_memo.pdf via ``trainplan.memo.render_memo``; a plain one-page placeholder PDF without it."""
    results = Path(inp["cost"]).parent.parent
    os.environ.setdefault("SOURCE_DATE_EPOCH", str(cfg["memo"]["source_date_epoch"]))
    render = _hook("trainplan.memo", "render_memo")
    if render is not None:
        from trainplan.provenance import config_hash, git_state

        render(results, out["pdf"], config=cfg, study_hash=config_hash(cfg), git_commit=str(git_state()["commit"]),
               figures_dir=inp["figures"])
    else:
        _placeholder("memo", "trainplan.memo.render_memo")
        _placeholder_pdf(Path(out["pdf"]), cfg, results)
    _sidecars("memo", out, cfg, inp)


def _placeholder_pdf(path: Path, cfg: Mapping, results: Path) -> None:
    """A one-page PDF that says what is missing and lists the result files (WeasyPrint, fixed date)."""
    import html

    from weasyprint import HTML

    files = sorted(str(p.relative_to(results)) for p in results.rglob("*") if p.is_file()
                   and not p.name.endswith(".provenance.json") and "logs" not in p.parts)
    items = "".join(f"<li>{html.escape(f)}</li>" for f in files)
    doc = (f"<html><head><title>{html.escape(cfg['memo']['title'])}</title></head><body>"
           f"<h1>{html.escape(cfg['memo']['title'])}</h1><p>Status: memo renderer {NYI}. "
           f"Study: {html.escape(cfg['study']['name'])}.</p><h2>Result files</h2><ul>{items}</ul></body></html>")
    pdf = HTML(string=doc, base_url=str(results)).write_pdf()
    from trainplan.io import write_bytes

    write_bytes(path, pdf)


# ---------------------------------------------------------------------------------- launch_artifacts
LAUNCH_FILES = ("accelerate_fsdp2.yaml", "torchrun.sh", "sbatch_4x8.sh", "deepspeed_zero.json")


def run_launch_artifacts(inp: Mapping, out: Mapping, cfg: Mapping) -> None:
    """accelerate/torchrun/sbatch/DeepSpeed files for the chosen layout via ``trainplan.launch``."""
    s = _specs(cfg)
    summary = read_json(inp["summary"])
    outdir = Path(out["launch"])
    write = _hook("trainplan.launch", "stage_launch_artifacts")
    if write is not None:
        write(outdir, s["model"], s["cluster"], s["training"], summary.get("layout"), cfg["launch"])
    else:
        doc = _placeholder("launch_artifacts", "trainplan.launch.stage_launch_artifacts")
        doc["layout"] = summary.get("layout")
        write_json(outdir / "README.json", doc)
        write_text(outdir / "STATUS.txt", f"launch artifacts: {NYI}\n")
    for f in sorted(outdir.iterdir()):
        if f.is_file() and not f.name.endswith(".provenance.json"):
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
