"""Figures: drawn from results tables, deterministic SVG bytes, captions traceable to provenance sidecars."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from trainplan.report import figures as F

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "results_min"


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    root = tmp_path_factory.mktemp("figs") / "results"
    shutil.copytree(FIXTURE, root)
    return root, F.make_figures(F.figure_inputs(root), root / "figures")


def _cand() -> pd.DataFrame:
    return pd.read_csv(FIXTURE / "analytic/candidates.csv")


def test_every_figure_is_made_from_the_fixture(made):
    _, out = made
    assert sorted(out) == sorted(["memory", "time_breakdown", "pareto", "parity", "extrapolation", "cost",
                                  "tornado"])
    for p in out.values():
        assert p.read_bytes().startswith(b"<?xml") and b"<svg" in p.read_bytes()[:400]


# the results file each figure is drawn from (stated here, not read back from the figure's own caption)
FIGURE_SOURCES = {"memory": ["analytic/candidates.csv", "prediction/production.json"],  # the limit and the p90
                  "time_breakdown": "analytic/candidates.csv",
                  "pareto": "analytic/candidates.csv", "parity": "proxies/records.csv",
                  "extrapolation": "prediction/production.json", "cost": "cost/cost.json",
                  "tornado": "cost/sensitivity.csv"}


def test_caption_config_hash_matches_the_source_provenance_sidecar(made):
    root, out = made
    for name, svg in out.items():
        cap = F.read_caption(svg)
        src = FIGURE_SOURCES[name]
        assert cap["sources"] == (src if isinstance(src, list) else [src]), name
        want = "+".join(sorted({json.loads((root / (s + ".provenance.json")).read_text())["config_hash"]
                                for s in cap["sources"]}))
        assert cap["config_hash"] == want, name
        assert f"config_hash={want}".encode() in svg.read_bytes(), name  # also in the SVG metadata
        assert cap["calibration_source"] == json.loads((root / "calibration/calibration.json").read_text())["source"]


def test_save_figure_bytes_are_deterministic_and_dateless(tmp_path):
    paths = []
    for i in range(2):
        fig = F.plot_pareto(_cand())
        paths.append(F.save_figure(fig, tmp_path / str(i) / "p.svg", caption="c", config_hash="abc",
                                   sources=["x.csv"]))
    a, b = (p.read_bytes() for p in paths)
    assert a == b
    assert b"<dc:date>" not in a


def test_memory_bars_stack_to_the_total_of_each_layout():
    rep = F.representative_layouts(_cand())
    fig = F.plot_memory(rep, hbm_gib=79.6)
    ax = fig.axes[0]
    ends = {}
    for patch in ax.patches:
        y = round(patch.get_y() + patch.get_height() / 2)
        ends[y] = max(ends.get(y, 0.0), patch.get_x() + patch.get_width())
    terms = [f"mem_{t}_gib" for t in F.MEM_TERMS]
    np.testing.assert_allclose([ends[i] for i in range(len(rep))], rep[terms].sum(axis=1), rtol=1e-6)
    np.testing.assert_allclose(rep[terms].sum(axis=1), rep["mem_total_gib"], rtol=1e-4)


def test_memory_bars_show_the_searchs_limit_and_the_chosen_layouts_p90():
    """The bars showed only usable HBM, so the chosen layout looked comfortably inside (its estimate) while page 1
    said its p90 is over the 90% limit. The limit is drawn, and the chosen bar carries a whisker to its p90."""
    rep = F.representative_layouts(_cand())
    chosen = str(rep["layout_text"].iloc[0])
    ax = F.plot_memory(rep, hbm_gib=79.6, limit_gib=71.7, p90=(chosen, 79.1)).axes[0]
    vlines = sorted(float(ln.get_xdata()[0]) for ln in ax.lines if len(set(ln.get_xdata())) == 1
                    and ln.get_linestyle() in (":", "--"))
    assert vlines == [71.7, 79.6]
    whisker = [ln for ln in ax.lines if list(ln.get_ydata()) == [0, 0]]
    assert whisker and float(whisker[0].get_xdata()[1]) == 79.1
    assert float(whisker[0].get_xdata()[0]) == pytest.approx(float(rep["mem_total_gib"].iloc[0]), rel=1e-4)
    assert {t.get_text().strip() for t in ax.texts} >= {"p90 79.1", "limit 71.7", "usable HBM 79.6 GiB"}
    ax = F.plot_memory(rep, hbm_gib=79.6).axes[0]  # without a production prediction: HBM alone, as before
    assert not any(t.get_text().startswith(("limit", " p90")) for t in ax.texts)


def test_representative_layouts_keep_infeasible_families_with_their_smallest_memory():
    cand = _cand()
    rep = F.representative_layouts(cand)
    assert set(rep["family"]) == set(cand["family"])
    oom = rep[~rep["feasible"].astype(bool)]
    assert len(oom) > 0
    for _, r in oom.iterrows():
        assert r["mem_total_gib"] == cand[cand["family"] == r["family"]]["mem_total_gib"].min()


def test_time_breakdown_bars_sum_to_step_time():
    rep = F.representative_layouts(_cand())
    rep = rep[rep["feasible"].astype(bool)]
    ax = F.plot_time_breakdown(rep).axes[0]
    ends: dict[int, float] = {}
    for patch in ax.patches:
        y = round(patch.get_y() + patch.get_height() / 2)
        ends[y] = max(ends.get(y, 0.0), patch.get_x() + patch.get_width())
    np.testing.assert_allclose([ends[i] for i in range(len(rep))], rep["step_time_s"], rtol=1e-4)


def test_time_breakdown_bars_include_cpu_offload():
    """An optimizer-offload layout's bar ends at its step time too: the offload term is stacked (it was left out,
    so such a bar stopped short of its step by the whole PCIe round trip)."""
    from trainplan.model.arch import resolve_model
    from trainplan.model.efficiency import Efficiency
    from trainplan.model.hardware import ClusterSpec, resolve_gpu
    from trainplan.model.layout import Layout
    from trainplan.model.timing import step_time
    from trainplan.model.training import TrainingSpec

    cluster = ClusterSpec(nodes=4, gpus_per_node=8, gpu=resolve_gpu("h100-sxm-80gb"))
    lays = [Layout(dp=32, sharding="zero3"), Layout(dp=32, sharding="zero3", offload="cpu")]
    rows = [{**step_time(resolve_model("llama2-13b"), cluster, TrainingSpec(seq_len=4096, global_batch=256), lay,
                         Efficiency()), "family": lay.family, "layout_text": lay.describe(), **vars(lay)}
            for lay in lays]
    df = pd.DataFrame(rows)
    assert df["offload_s"].iloc[1] > 0.05 * df["step_time_s"].iloc[1]  # the term is worth drawing
    ax = F.plot_time_breakdown(df).axes[0]
    ends = [max(p.get_x() + p.get_width() for p in ax.patches if round(p.get_y() + p.get_height() / 2) == i)
            for i in range(len(df))]
    np.testing.assert_allclose(ends, df["step_time_s"], rtol=1e-9)
    assert "CPU offload" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_parity_table_pairs_pred_and_meas_columns_and_skips_failed_runs():
    rec = pd.read_csv(FIXTURE / "proxies/records.csv")
    long = F.parity_table(rec)
    assert "layout-oom" not in set(long["id"])
    assert set(long["metric"]) == set(F.parity_pairs(rec))
    r = long[(long["id"] == "scaleout-4") & (long["metric"] == "comm_bytes")].iloc[0]
    row = rec[rec["id"] == "scaleout-4"].iloc[0]
    assert r["rel_error"] == pytest.approx(row["comm_bytes_pred"] / row["comm_bytes_meas"] - 1.0)
    assert r["rel_error"] == pytest.approx(row["comm_bytes_rel_err"])  # records.csv's sign: predicted/measured − 1


def test_pareto_marks_rank_one_and_draws_only_feasible_layouts():
    cand = _cand()
    ax = F.plot_pareto(cand).axes[0]
    feasible_pts = ax.collections[0].get_offsets()
    assert len(feasible_pts) == int(cand["feasible"].sum())
    star = ax.collections[-1].get_offsets()[0]
    best = cand[cand["rank"] == 1].iloc[0]
    assert star[1] == pytest.approx(best["tokens_per_s_per_gpu"])


def test_cost_figure_says_each_targets_own_verdict():
    """An AT RISK target (p50 meets it, p90 does not) is titled AT RISK in amber, as the memo's table says, not
    FAIL in red."""
    df = pd.DataFrame([{"name": "deadline", "unit": "h", "p10": 60.0, "p50": 70.0, "p90": 80.0, "target": 72.0,
                        "verdict": "at risk", "pass": False},
                       {"name": "budget", "unit": "$", "p10": 1.0, "p50": 2.0, "p90": 3.0, "target": 10.0,
                        "verdict": "pass", "pass": True},
                       {"name": "throughput", "unit": "tok/s", "p10": 1.0, "p50": 2.0, "p90": 3.0, "target": 10.0,
                        "verdict": "fail", "pass": False}])
    axes = F.plot_cost(df).axes
    assert [a.get_title(loc="left").split(": ")[1] for a in axes] == ["AT RISK", "pass", "FAIL"]
    colors = [a.lines[0].get_color() for a in axes]
    assert colors[0] not in (colors[1], colors[2]) and len(set(colors)) == 3


def test_plots_draw_into_a_given_axes():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    assert F.plot_pareto(_cand(), ax=ax) is fig
    sens = pd.read_csv(FIXTURE / "cost/sensitivity.csv")
    assert isinstance(F.plot_tornado(sens), Figure)
    fig2, ax2 = plt.subplots()
    assert F.plot_tornado(sens, ax=ax2) is fig2 and len(ax2.patches) >= len(sens)  # its bars, in the given axes
    plt.close("all")


def test_missing_inputs_make_no_figure(tmp_path):
    root = tmp_path / "r"
    (root / "analytic").mkdir(parents=True)
    shutil.copy(FIXTURE / "analytic/candidates.csv", root / "analytic/candidates.csv")
    out = F.make_figures(F.figure_inputs(root), tmp_path / "figs", hbm_gib=79.6)
    assert sorted(out) == ["memory", "pareto", "time_breakdown"]
    assert json.loads(F.caption_path(out["memory"]).read_text())["config_hash"] == "no-sidecar"


def test_report_labels_come_from_the_caption_sidecar_with_braces_escaped(tmp_path):
    from trainplan.report.figures import report_labels, save_figure

    fig = Figure()
    fig.add_subplot().plot([0, 1], [0, 1])
    save_figure(fig, tmp_path / "x.svg", caption="c", config_hash="abc+def", sources=["a/{w}.csv", "b.json"],
                calibration_source=None)
    assert report_labels(tmp_path, "x") == {"figure": "x", "config hash": "abc+def", "sources": "a/{{w}}.csv, b.json",
                                            "calibration": "n/a"}


def test_tornado_labels_print_assumption_ranges_readably():
    """Range labels are three significant digits with k/M/B/T, not raw floats (0.942048-1.14678, 5e+09-2e+10)."""
    assert [F.short_number(v) for v in (0.942048, 1.14678, 5e9, 2e10, 46, 1500, 3.0)] == [
        "0.942", "1.15", "5B", "20B", "46", "1.5k", "3"]
    sens = pd.DataFrame([{"parameter": "dataset_tokens", "low_value": 5e9, "base_value": 1e10, "high_value": 2e10,
                          "unit": "tokens", "metric": "cost ($)", "metric_low": 900.0, "metric_base": 1700.0,
                          "metric_high": 3400.0}])
    labels = [t.get_text() for t in F.plot_tornado(sens).axes[0].get_yticklabels()]
    assert labels == ["dataset_tokens (5B–20B tokens)"], labels


def test_layout_labels_keep_what_tells_two_layouts_apart():
    """The memory and step-time bars labelled dp16·tp2(sp) "dp16·tp2" — the string the Alternatives table uses for
    the layout without sequence parallelism (4,179 against 4,724 tokens/s/GPU) — and dropped the pipeline schedule
    and the CP kind. The label keeps what ``Layout.describe`` marks on each degree above 1."""
    base = {"family": "ZeRO-2×TP", "dp": 16, "tp": 2, "pp": 1, "cp": 1, "sp": True, "sharding": "zero2",
            "recompute": "none", "micro_batch": 2, "pp_schedule": "1f1b"}
    assert F.layout_label(base) == "ZeRO-2×TP dp16·tp2(sp) zero2 rc=none mb=2"
    assert F.layout_label(base | {"sp": False}) == "ZeRO-2×TP dp16·tp2 zero2 rc=none mb=2"
    row = pd.Series(base | {"dp": 4, "pp": 2, "cp": 2, "pp_schedule": "interleaved", "vpp": 4, "cp_kind": "ulysses",
                            "tp_overlap": True, "sharding": "hsdp", "shard_group": 2, "offload": "none"})
    assert F.layout_label(row) == \
        "ZeRO-2×TP dp4·tp2(sp)·pp2(interleaved,v4)·cp2(ulysses) async-tp hsdp/2 rc=none mb=2"
    labels = {F.layout_label(r) for _, r in pd.DataFrame([base, base | {"sp": False}, base | {"pp": 2, "dp": 8}]).iterrows()}
    assert len(labels) == 3
