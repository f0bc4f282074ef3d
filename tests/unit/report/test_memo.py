"""The PDF memo: headline numbers equal the results files, captions trace to provenance, sections present,
missing inputs say so, attachments present, and rendering twice gives identical bytes.

Expected strings are formatted here with plain f-strings (not trainplan.report.memo.fmt), so a formatting or
lookup bug in the memo shows up as a mismatch.
"""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from pypdf import PdfReader

from trainplan.model.layout import Layout
from trainplan.proxy.torchrun import ALLOC_CONF
from trainplan.report import memo
from trainplan.report.figures import figure_inputs, make_figures, read_caption

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "results_min"
HASH, COMMIT = "5f" * 32, "c0ffee" + "0" * 34
CONFIG = {"study": {"name": "fixture study"}, "model": {"preset": "llama2-13b"},
          "cluster": {"nodes": 4, "gpus_per_node": 8, "gpu": "h100-sxm-80gb", "inter_busbw_GBps": 46},
          "training": {"seq_len": 4096, "global_batch": 256}, "cost": {"price_per_gpu_hour": 3.0},
          "targets": {"max_hours": 72, "max_dollars": 15000, "min_tokens_per_s_per_gpu": 4000}}
SECTIONS = ["The decision", "The ask", "What was validated, and how", "Day-1 go/no-go checks", "Contents",
            "Study assumptions", "Alternatives considered", "Memory math", "Throughput math", "Validation",
            "Published-data check", "Extrapolation", "Cost and schedule", "Sensitivity", "Risks and mitigations",
            "Appendix A: launch artifacts", "Appendix B: resolved config", "Appendix C: provenance"]


def _squash(s: str) -> str:
    return re.sub(r"\s+", "", s)


def _render(root: Path, out: Path) -> Path:
    make_figures(figure_inputs(root), root / "figures")
    return memo.render_memo(memo.memo_inputs(root), out, config=CONFIG, study_hash=HASH, git_commit=COMMIT)


def _html_text(ctx: dict) -> str:
    """The memo's text from its HTML (no PDF): for checks of what it says, not of where on which page."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", memo.render_html(ctx))).split())


def _context(root: Path) -> dict:
    """The memo's template context for the results tree ``root`` (the fixture study's config, hash and commit)."""
    return memo.build_context(memo.memo_inputs(root), config=CONFIG, study_hash=HASH, git_commit=COMMIT)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict:
    base = tmp_path_factory.mktemp("memo")
    root = base / "results"
    shutil.copytree(FIXTURE, root)
    pdf = _render(root, base / "memo.pdf")
    reader = PdfReader(pdf)
    pages = [p.extract_text() for p in reader.pages]
    return {"root": root, "pdf": pdf, "base": base, "reader": reader, "pages": pages, "text": "\n".join(pages)}


def _load(rel: str) -> dict:
    return json.loads((FIXTURE / rel).read_text())


def test_page_one_states_the_decision_with_numbers_from_the_results(rendered):
    p1 = _squash(rendered["pages"][0])
    summary, prod, cost = _load("analytic/summary.json"), _load("prediction/production.json"), _load("cost/cost.json")
    ch = prod["chosen"]
    want = [Layout(**summary["layout"]).describe(), summary["family"],
            f"{ch['tokens_per_s_per_gpu_p50']:,.0f}", f"{ch['tokens_per_s_per_gpu_p10']:,.0f}",
            f"{ch['tokens_per_s_per_gpu_p90']:,.0f}", f"{ch['mem_total_gib_p50']:.1f}",
            f"{ch['mem_total_gib_p10']:.1f}", f"{ch['mem_total_gib_p90']:.1f}",
            f"PASS:p90{ch['mem_limit_gib'] - ch['mem_total_gib_p90']:.1f}GiBunderthelimit",
            f"{100 * ch['mfu_p50']:.1f}%", f"{summary['hbm_gib']:.1f}",
            f"{cost['ask']['gpu_hours']:,.0f}GPU-hours", f"${cost['ask']['dollars']:,.0f}",
            f"{cost['ask']['window_h']:.1f}h",
            f"≤{ch['mem_limit_gib']:.1f}GiB(90%ofusableHBM).Aboveit:", f"≤{ch['mem_limit_gib']:.1f}(90%of{summary['hbm_gib']:.1f})",
            f"≥{ch['tokens_per_s_per_gpu_p10']:,.0f}(p10)"]
    for t in cost["targets"]:
        unit = t["unit"]
        f = (lambda v: f"${v:,.0f}") if unit == "$" else (lambda v: f"{v:.1f}") if unit == "h" else (lambda v: f"{v:,.0f}")
        want += [f(t["p50"]), f"{f(t['p10'])}–{f(t['p90'])}", f(t["target"])]
        label = "tokens/s per GPU" if unit == "tokens/s" else f"{t['name']} ({unit})"  # merged with the prediction row
        row = re.search(re.escape(_squash(label)) + r".*?(PASS|FAIL)", p1)
        assert row and row.group(1) == ("PASS" if t["pass"] else "FAIL"), t["name"]
    missing = [w for w in want if _squash(w) not in p1]
    assert not missing
    # the ask sits under the table it is made of, above the lists that grow with a study (a 24-GPU study's
    # validation and day-1 lists once pushed it to page 2)
    assert p1.index("Theask") < p1.index(_squash("What was validated")) < p1.index(_squash("Day-1 go/no-go"))


def test_page_one_names_the_runner_up_with_its_numbers_from_families_csv(rendered):
    import pandas as pd

    fam = pd.read_csv(FIXTURE / "analytic" / "families.csv")
    ch = _load("prediction/production.json")["chosen"]
    ok = fam[(fam["verdict"] != "chosen") & ~fam["verdict"].str.startswith("OOM")]
    r = ok.sort_values("tokens_per_s_per_gpu", ascending=False).iloc[0]
    p1 = _squash(rendered["pages"][0])
    slower = 1 - r["tokens_per_s_per_gpu"] / ch["tokens_per_s_per_gpu_p50"]
    for w in (f"Runner-upstrategy:{r['family']}", r["layout"], _squash(memo.fmt(slower, "rival")),
              f"{r['mem_total_gib']:.1f}GiB/GPU"):
        assert _squash(w) in p1, w
    inside = r["tokens_per_s_per_gpu"] >= ch["tokens_per_s_per_gpu_p10"]
    assert ("cannotrankthetwo" in p1) == inside
    # the production table's middle figure is the model's estimate (memory p10 can exceed it), not a median
    assert "tokens/s/GPU p10 / estimate / p90" in rendered["text"] and "p10 / p50 / p90" not in rendered["text"]
    # and when it is not inside, page 1 says so with the p10 it falls below (it once said nothing)
    assert (_squash(f"below this layout's p10 ({ch['tokens_per_s_per_gpu_p10']:,.0f})") in p1) == (not inside)
    # the day-1 throughput fallback: the runner-up measured the same way, the faster kept (it was "switch to the
    # runner-up", whose own estimate can sit below the chosen layout's p10 it would be held to)
    assert _squash(f"run the same steps with the runner-up, {r['family']} ({r['layout']},") in p1
    assert _squash("keep the faster of the two measured") in p1


def _families(layouts, tps, mem, verdicts, names=None):
    """A families.csv frame (search.family_verdicts' columns) of these best layouts: text and ``layout.*`` fields;
    a None layout is a family without one (OOM)."""
    import pandas as pd

    from trainplan.model.layout import Layout

    rows = []
    for k, (lay, t, m, v) in enumerate(zip(layouts, tps, mem, verdicts, strict=True)):
        lay = Layout(**lay) if isinstance(lay, dict) else lay
        rows.append({"family": names[k] if names else (lay.family if lay else f"F{k}"),
                     "best_layout": lay.describe() if lay else "", "tokens_per_s_per_gpu": t, "mem_total_gib": m,
                     "verdict": v, **({f"layout.{f}": x for f, x in lay.to_dict().items()} if lay else {})})
    return pd.DataFrame(rows)


def test_runner_up_skips_the_chosen_and_oom_families():
    from trainplan.model.layout import Layout

    a, c, d = (Layout(dp=32, sharding="zero2"), Layout(dp=16, tp=2, sp=True, sharding="zero2", micro_batch=2),
               Layout(dp=16, pp=2, sharding="zero1"))
    fam = _families([a, None, c, d], [100.0, float("nan"), 90.0, 50.0], [60.0, 200.0, 40.0, 30.0],
                    ["chosen", "OOM", "slower", "slower"], names=["A", "B", "C", "D"])
    ch = {"tokens_per_s_per_gpu_p50": 100.0, "tokens_per_s_per_gpu_p10": 85.0}
    r = memo.runner_up(fam, ch)
    assert (r["family"], r["layout"], r["inside_interval"]) == ("C", c.describe(), True)
    assert r["slower_frac"] == pytest.approx(0.10)
    assert not memo.runner_up(fam, {**ch, "tokens_per_s_per_gpu_p10": 95.0})["inside_interval"]
    assert memo.runner_up(fam.iloc[[0, 1]], ch) is None and memo.runner_up(None, ch) is None


def test_runner_up_and_tie_winner_compare_the_speeds_of_what_the_launch_runs():
    """An FP8 study's TP layouts run under torchtitan, which trains them in bf16: the search ranks them at that speed
    (families.csv's tokens_per_s_per_gpu_launched) and so must page 1's runner-up, or it names a layout at an FP8
    speed the launch never reaches. C is faster as planned (95) but 60 as launched; D (80) runs as planned. The
    chosen layout's own launch moves its p50/p10 by the same factor (QLoRA as LoRA), and the tie winner is judged
    on the launched speed too."""
    import pandas as pd

    from trainplan.model.layout import Layout
    from trainplan.search.layouts import LAUNCH_TPS_RATIO, LAUNCH_UNTIMED

    a, c, d = (Layout(dp=32, sharding="zero2"), Layout(dp=16, tp=2, sp=True, sharding="zero2", micro_batch=2),
               Layout(dp=16, pp=2, sharding="zero2"))
    fam = _families([a, c, d], [100.0, 95.0, 80.0], [60.0, 40.0, 30.0], ["chosen", "slower", "slower"],
                    names=["A", "C", "D"]).assign(tokens_per_s_per_gpu_launched=[110.0, 60.0, 80.0])
    ch = {"tokens_per_s_per_gpu_p50": 100.0, "tokens_per_s_per_gpu_p10": 90.0}
    for table in (fam, fam.assign(rank=[1, 30, 2])):  # families.csv as written (ranked on the launched speed) or not
        r = memo.runner_up(table, ch)
        assert (r["family"], r["tokens_per_s_per_gpu"], r["tokens_per_s_per_gpu_planned"]) == ("D", 80.0, 80.0)
        assert r["slower_frac"] == pytest.approx(1 - 80 / 110) and not r["inside_interval"]  # 80 < 90 × 1.1
        assert r["p10_as_launched"] and r["chosen_p10"] == pytest.approx(99.0)  # page 1 names the p10 it was held to
    assert memo.runner_up(fam.drop(columns="tokens_per_s_per_gpu_launched"), ch)["family"] == "C"  # as planned
    shown = {x["family"]: (x["tps_shown"], x["tps_moved"]) for x in memo._families(fam)["families"]}
    assert shown == {"A": (110.0, True), "C": (60.0, True), "D": (80.0, False)}  # the alternatives table's column
    feas = pd.DataFrame({"layout_text": ["a", "c"], "tokens_per_s": [100.0, 101.0], "mem_total_gib": [60.0, 50.0],
                         LAUNCH_TPS_RATIO: [1.0, 0.7]})
    assert memo.tie_winner(feas, feas.iloc[0].to_dict()) is None
    assert memo.tie_winner(feas.assign(**{LAUNCH_TPS_RATIO: 1.0}), feas.iloc[0].to_dict())["layout"] == "c"
    assert memo.tie_winner(feas.assign(**{LAUNCH_TPS_RATIO: 1.0}), feas.iloc[0].to_dict())["untimed"] == ""
    # c's launch cannot be timed (the search ranked it UNTIMED_MARGIN slower): page 1 says that, not a tie
    won = memo.tie_winner(feas.assign(**{LAUNCH_TPS_RATIO: 1.0, LAUNCH_UNTIMED: ["", "all-gather CP"]}),
                          feas.iloc[0].to_dict())
    assert (won["layout"], won["untimed"], won["untimed_margin"], won["timed"]) == ("c", "all-gather CP", 0.05, None)
    # ... and where a timed layout is faster too (a tie the chosen one won on memory), page 1 names it as well
    three = pd.concat([feas, pd.DataFrame({"layout_text": ["b"], "tokens_per_s": [100.3], "mem_total_gib": [70.0]})],
                      ignore_index=True).assign(**{LAUNCH_TPS_RATIO: 1.0, LAUNCH_UNTIMED: ["", "all-gather CP", ""]})
    won = memo.tie_winner(three, three.iloc[0].to_dict())
    assert won["layout"] == "c" and won["timed"]["layout"] == "b"
    # a tie in the search's measure: the chosen one's shortfall as a fraction of the faster one's speed
    assert won["timed"]["faster_frac"] == pytest.approx(1 - 100 / 100.3) and won["timed"]["more_gib"] == pytest.approx(10.0)


def test_the_day1_switch_walks_and_ranks_on_the_speed_the_search_ranks():
    """A study's candidates carry the speed of what the launch runs (launch_tps_ratio). The switch walked them on
    the planned speed and then applied the ratio twice (to tokens_per_s, then again through the column in ranked):
    B, 104 planned but 100.4 as launched, ties with A (100) and has more headroom, so the search's rule picks B;
    counted twice it was 96.9, out of the tie. A third layout, fastest as planned (120) but 60 as launched, is
    neither picked nor allowed to stop the walk early."""
    import pandas as pd

    from trainplan.model.layout import Layout
    from trainplan.search.layouts import LAUNCH_TPS_RATIO

    lays = [Layout(dp=32, sharding="zero2", micro_batch=2), Layout(dp=32, sharding="zero2"),
            Layout(dp=32, sharding="zero3"), Layout(dp=16, tp=2, sp=True, sharding="zero2")]
    rows = [(130.0, 70.0, 1.0), (100.0, 50.0, 1.0), (104.0, 40.0, 100.4 / 104), (120.0, 45.0, 0.5)]
    feas = pd.DataFrame([{**lay.to_dict(), "layout_text": lay.describe(), "tokens_per_s": t, "tokens_per_s_per_gpu": t,
                          "mem_total_gib": m, "headroom_frac": 1 - m / 80.0, "complexity": 0, "rank": i + 1,
                          LAUNCH_TPS_RATIO: x} for i, (lay, (t, m, x)) in enumerate(zip(lays, rows, strict=True))])
    chosen = feas.iloc[0].to_dict()
    fb = memo.fit_fallback(feas, chosen, 1.2, 0.9, lambda lay, step=True: None)  # 50 × 1.2, 40 × 1.2 ≤ 72: both fit
    assert fb["layout"] == lays[2].describe()
    assert memo.fit_fallback(feas.drop(columns=LAUNCH_TPS_RATIO), chosen, 1.2, 0.9,
                             lambda lay, step=True: None)["layout"] == lays[3].describe()  # as planned: 120


def test_runner_up_is_no_tie_that_only_shards_the_states_differently(rendered):
    """LoRA: DDP ties with the chosen ZeRO-1 (same layout, adapter states unsharded). It was the runner-up and the
    day-1 throughput fallback, though it runs exactly as fast or as slow; it is named as an equivalent instead and
    the runner-up is the next strategy. A tie of another structure, or a slower same-structure layout, still counts.
    The rule compares Layouts (search.layouts.runner_up_index, also the comparable-runs table's): an offload or a
    micro-batch apart is another structure."""
    from dataclasses import replace

    from trainplan.model.layout import Layout

    z1 = Layout(dp=32, sharding="zero1")
    lays = [z1, replace(z1, sharding="none"), replace(z1, sharding="hsdp", shard_group=8), replace(z1, sharding="zero3"),
            Layout(dp=16, pp=2, sharding="zero1")]
    tps = [6291.0, 6290.4, 6289.0, 6000.0, 5900.0]
    fam = _families(lays, tps, [54.3, 54.6, 50.0, 45.0, 40.0], ["chosen", "slower", "slower", "slower", "slower"])
    ch = {"tokens_per_s_per_gpu_p50": 6291.0, "tokens_per_s_per_gpu_p10": 5926.0, "layout": z1.describe()}
    r = memo.runner_up(fam, ch)
    assert (r["family"], r["layout"]) == ("FSDP", "dp32·tp1·pp1·cp1 zero3 rc=none mb=1")  # 4.6% slower: not a tie
    assert [e["family"] for e in r["equivalents"]] == ["DDP", "HSDP"]
    # another structure ties too: an optimizer offload, or another micro-batch, is a real alternative
    for other in (replace(lays[1], offload="cpu"), replace(lays[1], micro_batch=2),
                  Layout(dp=16, tp=2, sp=True, sharding="none")):
        assert memo.runner_up(_families([z1, other, *lays[2:]], tps, [54.3] * 5, list(fam["verdict"])),
                              ch)["layout"] == other.describe()
    ctx = _context(rendered["root"])
    text = _html_text(ctx | {"runner_up": r})
    assert "DDP, HSDP tie with it, sharding the states differently: no throughput fallback." in text
    assert "run the same steps with the runner-up, FSDP ( dp32·tp1·pp1·cp1 zero3 rc=none mb=1 ," in text
    only = fam.iloc[:2]
    assert memo.runner_up(only, ch)["family"] == "DDP" and memo.runner_up(only, ch)["equivalents"] == []


def test_page_one_says_when_the_runner_up_is_below_the_chosen_p10(rendered):
    """The README promised page 1 says whether the runner-up lies inside the recommendation's p10–p90; it spoke only
    when it did (the default study's runner-up, 4,724 against a p10 of 4,742, got no word). Both cases now."""
    ctx = _context(rendered["root"])
    p10 = _load("prediction/production.json")["chosen"]["tokens_per_s_per_gpu_p10"]
    for inside in (True, False):
        text = _html_text(ctx | {"runner_up": {**ctx["runner_up"], "inside_interval": inside}})
        assert ("the model alone cannot rank the two" in text) == inside
        assert (f"below this layout's p10 ({p10:,.0f})." in text) == (not inside), text[:3000]


def test_page_one_says_what_rests_on_published_data_and_never_uses_cpu_timings(rendered):
    p1 = " ".join(rendered["pages"][0].split())
    cal = _load("calibration/calibration.json")
    label = memo.SOURCE_LABELS.get(f"{cal['source']}:{cal.get('generation')}") or memo.SOURCE_LABELS[cal["source"]]
    assert label in p1
    assert "not H100 timing evidence" in p1
    assert "step_time_s_median" not in rendered["text"]  # CPU timings are never shown


def test_validation_errors_are_those_of_the_records(rendered):
    import pandas as pd

    rec = pd.read_csv(FIXTURE / "proxies/records.csv")
    ok = rec[rec["status"] == "ok"]
    worst = ok["comm_bytes_rel_err"].abs().max()  # predicted/measured − 1, as records.csv carries it
    # page 1 gives the worst over every checked quantity, the Validation table each one's
    worst_all = max(m["max_abs_err"] for m in memo._validation(rec)["metrics"])
    assert worst_all >= worst and "comm_bytes" in rendered["pages"][0]
    assert _squash(f"within {100 * worst_all:.1f}% of measured") in _squash(rendered["pages"][0])
    assert f"{100 * worst:.1f}%" in rendered["text"].split("Validation")[-1]
    assert f"{len(rec)} proxy runs" in rendered["pages"][0]


def test_all_sections_are_present_and_listed_in_the_contents_with_page_numbers(rendered):
    text = _squash(rendered["text"])
    for s in SECTIONS:
        assert _squash(s) in text, s
    toc = next(p for p in rendered["pages"] if "Contents" in p)
    n = len(rendered["pages"])
    for s in ("Memory math", "Risks and mitigations", "Appendix C: provenance"):
        m = re.search(re.escape(s) + r"[ .]*(\d+)", toc)
        assert m and 1 <= int(m.group(1)) <= n, s
        assert s in rendered["pages"][int(m.group(1)) - 1], f"{s} not on page {m.group(1)}"


def test_footer_carries_page_x_of_y_study_hash_and_commit(rendered):
    n = len(rendered["pages"])
    for i, page in enumerate(rendered["pages"], 1):
        assert f"Page {i} of {n}" in page
        assert HASH[:12] in page and COMMIT[:12] in page


def test_each_figure_caption_hash_matches_its_provenance_sidecar(rendered):
    root = rendered["root"]
    text = _squash(rendered["text"])
    svgs = sorted((root / "figures").glob("*.svg"))
    assert len(svgs) == len(memo.FIGURES)
    for svg in svgs:
        cap = read_caption(svg)
        sidecars = {json.loads((root / (s + ".provenance.json")).read_text())["config_hash"] for s in cap["sources"]}
        assert cap["config_hash"] == "+".join(sorted(sidecars))
        assert _squash(f"config {cap['config_hash'][:12]}") in text, svg.name


def _alternatives_text(rendered) -> str:
    text = rendered["text"]
    start = text.index("Alternatives considered", text.index("Appendix C: provenance"))  # past the contents
    return _squash(text[start: text.index("Memory math", start)])


def test_alternatives_show_every_family_when_there_are_at_most_twenty(rendered):
    import pandas as pd

    fam = pd.read_csv(FIXTURE / "analytic/families.csv")
    assert len(fam) <= memo.FAMILIES_ALL_MAX
    alt = _alternatives_text(rendered)
    for _, r in fam.iterrows():
        assert _squash(r["layout"]) in alt, r["family"]
    assert "familiesshown" not in alt


def test_alternatives_truncate_only_beyond_twenty_families():
    import pandas as pd

    fam = pd.DataFrame({"family": [f"F{i}" for i in range(25)], "layout": "x", "verdict": ["chosen"] + ["slower"] * 24,
                        "tokens_per_s_per_gpu": 1.0, "mem_total_gib": 1.0})
    assert len(memo._families(fam.head(20))["families"]) == 20
    got = memo._families(fam)
    assert got["families_total"] == 25 and len(got["families"]) == memo.FAMILIES_SHOWN


def test_technique_table_shows_each_technique_with_and_without_from_the_results(rendered):
    import pandas as pd

    tech = pd.read_csv(FIXTURE / "analytic/techniques.csv")
    assert len(tech) >= 5
    alt = _alternatives_text(rendered)
    assert "Whateachtechniquebuys" in alt
    from trainplan.search.layouts import tie_pct

    for _, r in tech.iterrows():  # a tie's ratio to the digits that keep it under the threshold (tie_pct)
        d = r["delta_frac"]
        ratio = f"{'+' if d >= 0 else '-'}{tie_pct(d)}" if r["verdict"] == "ties" else f"{100 * d:+.1f}%"
        row = re.escape(_squash(r["technique"])) + ".*?" + re.escape(_squash(r["best_with"])) + ".*?" + \
            re.escape(f"{r['tokens_per_s_per_gpu_with']:,.0f}") + ".*?" + re.escape(_squash(r["best_without"])) + \
            ".*?" + re.escape(f"{r['tokens_per_s_per_gpu_without']:,.0f}") + re.escape(ratio) + \
            re.escape(_squash(f"{r['verdict']}: {r['note']}"))
        assert re.search(row, alt), r["technique"]
    used = tech.loc[tech["used_by_best"], "technique"]
    for t in used:
        assert _squash(f"{t} (used by the recommendation)") in alt


def test_technique_verdicts_compare_best_with_against_best_without():
    import pandas as pd

    from trainplan.search.layouts import technique_verdicts

    def row(text, tps, *, sp=False, cp=1, rc="none", mb=1, feasible=True, reason=""):
        return {"layout_text": text, "tokens_per_s": 32 * tps, "tokens_per_s_per_gpu": tps, "feasible": feasible,
                "reason": reason, "sp": sp, "cp": cp, "offload": "none", "recompute": rc, "pp_schedule": "1f1b",
                "micro_batch": mb, "compute_s": 1.0 + (rc == "full") * 0.3, "comm_exposed_s": 0.1 + sp * 0.2,
                "bubble_s": 0.0, "optimizer_s": 0.05, "offload_s": 0.0}

    df = pd.DataFrame([row("plain", 1000.0), row("sp", 900.0, sp=True), row("cp", 1003.0, cp=2),
                       row("full", 950.0, rc="full"), row("mb2", 1100.0, mb=2),
                       row("sel", 0.0, rc="selective", feasible=False, reason="OOM: too big")])
    t = technique_verdicts(df).set_index("technique")
    sp = t.loc["sequence parallelism (SP)"]
    assert (sp["best_with"], sp["best_without"]) == ("sp", "mb2")
    assert sp["delta_frac"] == pytest.approx(900 / 1100 - 1) and sp["verdict"] == "costs 18.2%"
    assert "exposed comm" in sp["line"]
    assert "compute" in t.loc["full recompute", "line"]
    assert t.loc["context parallelism (CP)", "verdict"] == "costs 8.8%"
    mb = t.loc["micro-batch > 1"]
    assert mb["used_by_best"] and mb["verdict"] == "buys +9.7%" and "chosen layout uses it" in mb["line"]
    sel = t.loc["selective recompute"]
    assert sel["verdict"] == "never fits" and "OOM: too big" in sel["line"]
    assert "optimizer offload to CPU" not in t.index  # no enumerated layout uses it
    tie = technique_verdicts(df[df["layout_text"].isin(["plain", "cp"])]).set_index("technique")
    assert tie.loc["context parallelism (CP)", "verdict"] == "ties"
    # the cause may be another technique's: the best micro-batch-2 layout needs CP to fit, the best without uses TP
    both = pd.DataFrame([dict(row("tp2", 1000.0), tp=2), dict(row("mb2-cp2", 950.0, mb=2, cp=2), tp=1)])
    mb = technique_verdicts(both).set_index("technique").loc["micro-batch > 1"]
    assert mb["verdict"] == "costs 5.0%"
    assert mb["note"].endswith("(that layout also uses CP; the best without it uses TP)"), mb["note"]
    sp = technique_verdicts(pd.DataFrame([dict(row("tp2-sp", 950.0, sp=True), tp=2), dict(row("dp", 1000.0), tp=1)]))
    assert "uses" not in sp.set_index("technique").loc["sequence parallelism (SP)", "note"]  # TP: SP's prerequisite


def test_a_technique_no_layout_can_use_names_its_own_reason():
    """Async TP under eager kernels is 'not possible here' (a prerequisite, not memory); interleaving whose layouts
    are mostly async-TP rows names its own reason (OOM), not async TP's kernels (the commonest reason of its rows)."""
    import pandas as pd

    from trainplan.search.layouts import ASYNC_TP_NEEDS, technique_verdicts

    def row(text, *, vpp=1, tpo=False, feasible=False, reason=""):
        return {"layout_text": text, "tokens_per_s": 32e3, "tokens_per_s_per_gpu": 1e3, "feasible": feasible,
                "reason": reason, "sp": False, "cp": 1, "offload": "none", "recompute": "none", "micro_batch": 1,
                "pp_schedule": "interleaved" if vpp > 1 else "1f1b", "vpp": vpp, "tp_overlap": tpo, "compute_s": 1.0,
                "comm_exposed_s": 0.1, "bubble_s": 0.0, "optimizer_s": 0.05, "offload_s": 0.0}

    df = pd.DataFrame([row("plain", feasible=True), row("async", tpo=True, reason=ASYNC_TP_NEEDS),
                       row("v2-async", vpp=2, tpo=True, reason=ASYNC_TP_NEEDS),
                       row("v2-async-b", vpp=2, tpo=True, reason=ASYNC_TP_NEEDS),
                       row("v2", vpp=2, reason="OOM: needs 90.0 GiB")])
    t = technique_verdicts(df).set_index("technique")
    tp = t.loc["TP comm overlap (async TP)"]
    assert tp["verdict"] == "not possible here" and tp["line"] == "no layout of this study can use it: " + ASYNC_TP_NEEDS
    inter = t.loc["interleaved pipeline"]
    assert inter["verdict"] == "never fits" and inter["line"] == "every layout using it runs out of memory: OOM: needs 90.0 GiB"


def test_resolved_config_and_provenance_are_attached(rendered):
    att = rendered["reader"].attachments
    assert json.loads(att["config.resolved.json"][0]) == CONFIG
    prov = json.loads(att["provenance.json"][0])
    files = {p["file"] for p in prov}
    assert "analytic/candidates.csv" in files and "cost/cost.json" in files
    for p in prov:
        assert p["config_hash"] == json.loads((FIXTURE / (p["file"] + ".provenance.json")).read_text())["config_hash"]
    long = (FIXTURE / "launch/sbatch_4x8.sh").read_text()
    assert att["sbatch_4x8.sh"][0].decode() == long  # long artifact attached, not printed
    assert "--option-39" not in rendered["text"]
    assert "--nproc-per-node 8" in " ".join(rendered["text"].split())  # short artifact printed inline


def test_rendering_twice_gives_identical_bytes(rendered):
    again = memo.render_memo(memo.memo_inputs(rendered["root"]), rendered["base"] / "again.pdf", config=CONFIG,
                             study_hash=HASH, git_commit=COMMIT)
    assert again.read_bytes() == rendered["pdf"].read_bytes()


def test_missing_optional_inputs_render_as_not_available(tmp_path):
    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    for rel in ("cost/sensitivity.csv", "proxies/records.csv", "calibration/heldout.csv"):
        (root / rel).unlink()
    pdf = _render(root, tmp_path / "memo.pdf")
    text = " ".join("\n".join(p.extract_text() for p in PdfReader(pdf).pages).split())
    for rel in ("cost/sensitivity.csv", "proxies/records.csv", "calibration/heldout.csv", "figures/tornado.svg",
                "figures/parity.svg"):
        assert "Not available in this run: " in text and f"({rel} was not produced)" in text, rel


def test_fmt_is_the_one_formatter():
    assert memo.fmt(5637.06, "int") == "5,637"
    assert memo.fmt(0.3591, "pct") == "35.9%"
    assert memo.fmt(0.0049, "tie") == "0.49%"  # "pct" would print 0.5%: a tie "under 0.5%" that reads as equal to it
    assert memo.fmt(0.004959, "tie") == "0.496%"  # two decimals would too (the default study's ZeRO-2×TP tie)
    # the runner-up against the chosen one: a tie prints as page 1's tie clause does (the rule's measure, tie_pct)
    assert memo.fmt(-0.004983, "rival") == "0.496% faster"  # 4,730 vs 4,707: the default study's runner-up
    assert memo.fmt(-0.004983, "slower") == "0.5% faster"  # (the kind of every other "x% slower")
    assert (memo.fmt(0.003, "rival"), memo.fmt(0.046, "rival"), memo.fmt(-0.038, "rival")) == \
        ("0.30% slower", "4.6% slower", "3.8% faster")
    assert memo.fmt(-0.0692, "spct") == "-6.9%" and memo.fmt(0.1, "spct") == "+10.0%"
    assert memo.fmt(9738.0, "usd") == "$9,738"
    assert memo.fmt(6.88, "rate") == "$6.88" and memo.fmt(3.0, "rate") == "$3"  # a price keeps its cents
    assert memo.fmt(0.3384, "dur") == "20 min" and memo.fmt(2.25, "dur") == "2.2 h"  # the checkpoint interval
    assert memo.fmt(float("nan")) == "n/a" and memo.fmt(None, "int") == "n/a"
    assert memo.fmt(True) == "yes"
    assert memo.fmt(5e9, "short") == "5B" and memo.fmt(2e10, "short") == "20B" and memo.fmt(0.942048, "short") == "0.942"


def test_template_fails_loudly_on_a_missing_key(rendered):
    import jinja2

    ctx = _context(rendered["root"])
    del ctx["cost"]
    with pytest.raises(jinja2.UndefinedError):
        memo.render_html(ctx)


def test_report_labels_carry_the_memo_sidecar_hash_and_commit(tmp_path):
    from trainplan.provenance import read_sidecar, write_sidecar

    pdf = tmp_path / "memo.pdf"
    pdf.write_bytes(b"%PDF-1.7")
    write_sidecar(pdf, rule="memo", config_slice={"study": {"name": "x"}})
    labels = memo.report_labels(pdf)
    sc = read_sidecar(pdf)
    assert labels["config hash"] == sc["config_hash"]
    assert labels["commit"] == str(sc["git"]["commit"] or "n/a")


def test_memory_fallback_is_the_fastest_layout_with_clearly_more_headroom():
    import pandas as pd

    df = pd.DataFrame({"layout_text": ["a", "b", "c", "d"], "tokens_per_s": [100.0, 99.0, 98.0, 90.0],
                       "tokens_per_s_per_gpu": [10.0, 9.9, 9.8, 9.0], "mem_total_gib": [70.0, 66.0, 50.0, 40.0],
                       "headroom_frac": [0.10, 0.20, 0.37, 0.50]})
    fb = memo.memory_fallback(df, df.iloc[0].to_dict())
    assert fb["layout"] == "c" and fb["slower_frac"] == pytest.approx(0.02)  # b has < 0.15 more headroom
    assert memo.memory_fallback(df, df.iloc[3].to_dict()) is None


def test_day1_memory_check_names_the_fallback(rendered):
    """The fixture's memory p90 fits the limit: the day-1 switch is named, by the preflight's own rule, at the error
    where the chosen layout would exhaust usable HBM (usable over the modelled peak), so that it holds over every
    error that fails the preflight, not just past its threshold."""
    import pandas as pd

    cand = pd.read_csv(rendered["root"] / "analytic" / "candidates.csv")
    ok = cand[cand["feasible"].astype(bool)]
    chosen = ok.sort_values("rank").iloc[0].to_dict()
    oom_at = 1 / (1 - chosen["headroom_frac"])  # usable HBM / modelled peak
    fb = memo.fit_fallback(ok, chosen, oom_at, 0.9)
    assert fb is not None and fb["mem_expected_gib"] <= 0.9 * chosen["mem_total_gib"] * oom_at
    assert _squash(f"at the error where this layout would run out of usable HBM, ×{oom_at:.2f}, {fb['layout']}") in _squash(
        rendered["text"])


def test_provenance_lists_the_sidecars_of_the_inputs_only(tmp_path):
    """The appendix lists the sidecar of each file the memo reads (its inputs, the figure SVGs, the launch files
    manifest.json lists), not every sidecar in the tree: a variant study nested in it (``--configfile
    config/lora.yaml`` writes to results/lora), a previous memo's own sidecar, a launch file the manifest does not
    list are not listed."""
    from trainplan.provenance import write_sidecar

    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    before = [f for f, _ in memo.Inputs(memo.memo_inputs(root)).sidecars()]
    assert before == sorted(before, key=lambda f: Path(f + ".provenance.json"))
    assert {"analytic/summary.json", "launch/manifest.json", "launch/sbatch_4x8.sh"} <= set(before)
    shutil.copytree(FIXTURE / "analytic", root / "lora" / "analytic")
    (root / "memo").mkdir()
    for stale in (root / "memo" / "design_memo.pdf", root / "launch" / "sbatch_2x8.sh"):
        stale.write_text("stale")
        write_sidecar(stale, rule="stale", config_slice={})
    after = [f for f, _ in memo.Inputs(memo.memo_inputs(root)).sidecars()]
    assert before and after == before
    own = [f for f, _ in memo.Inputs(memo.memo_inputs(root / "lora")).sidecars()]
    assert "analytic/summary.json" in own and all(f.startswith("analytic/") for f in own)


def test_family_bias_rows_mark_the_target_and_the_chosen_family():
    calib = {"heldout_errors_by_family": {"CP": [0.10, 0.014], "FSDP/ZeRO": [-0.05, -0.018], "TP": []}}
    rows = memo.family_bias_rows(calib, {"interval_family": "FSDP/ZeRO"})
    assert [(r["family"], r["n"], r["met"], r["chosen"]) for r in rows] == [
        ("CP", 2, False, False), ("FSDP/ZeRO", 2, True, True)]  # an empty pool is no row
    assert rows[0]["bias"] == pytest.approx(0.057)
    assert rows[0]["se"] == pytest.approx(0.043)  # |0.10 − 0.014| / 2: sd (ddof 1) / √2
    one = memo.family_bias_rows({"heldout_errors_by_family": {"PP": [0.02]}}, None)
    assert one[0]["se"] != one[0]["se"]  # one row: no standard error (NaN), and the memo prints none
    assert memo.family_bias_rows({}, None) is None


def test_published_data_check_states_the_bias_of_each_family_class(tmp_path):
    """The memo prints the held-out bias per family class from calibration.json, names the chosen layout's family
    and says which miss the ±5% target."""
    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    cal = json.loads((root / "calibration/calibration.json").read_text())
    cal |= {"generation": "h100", "heldout_errors_by_family": {"CP": [0.10, 0.014], "FSDP/ZeRO": [-0.05, -0.018]}}
    (root / "calibration/calibration.json").write_text(json.dumps(cal))
    prod = json.loads((root / "prediction/production.json").read_text())
    prod["chosen"]["interval_family"] = "FSDP/ZeRO"
    (root / "prediction/production.json").write_text(json.dumps(prod))
    (root / "calibration/heldout.csv").write_text("table,metric,n,mape,role,loto_mape\n"
                                                 "torchtitan_h100,tokens_per_s_per_gpu,21,0.065,fit,0.075\n"
                                                 "torchtitan_h100,memory_gib,2,0.063,fit,\n")
    pages = PdfReader(_render(root, tmp_path / "m.pdf")).pages
    text = " ".join(" ".join(p.extract_text() for p in pages).split())
    # page 1 says the same: the held-out MAPE next to the in-sample one, and the chosen family's held-out bias
    p1 = " ".join(pages[0].extract_text().split())
    # page 1 quotes the left-out-of-the-fit throughput MAPE only (no held-out figure for memory: none claimed)
    assert ("Published-data check, MAPE of throughput with the table left out of the fit: torchtitan_h100 7.5% (all "
            "tables: Validation).") in p1
    assert "6.3%" not in p1 and "6.5%" not in p1  # the in-sample and memory MAPEs are Validation's table
    assert ("The chosen layout's family class (FSDP/ZeRO), on 2 published H100 rows left out of the fit, is predicted "
            "-3.4% ± 1.6% on average (slower than published)") in p1
    assert "Bias per family class, rows left out of the fit (H100" in text
    assert "CP +5.7% ± 4.3% (2 rows, outside the target)" in text
    assert "FSDP/ZeRO -3.4% ± 1.6% (2 rows, the chosen layout's family)" in text


def test_title_fields_come_from_the_results_not_the_default_config():
    """An overlay that changes the model or the cluster but keeps the default memo.title gets a title naming its own
    model, GPU count, GPU and fine-tune kind; the default study's title reads as before; other braces stay."""
    default = {"memo": {"title": "{finetune} of {model} on {n_gpus} × {gpu}: layout, cost and confidence"},
               "training": {"finetune": "full"}}
    assert memo._title(default, {"model": {"name": "llama2-13b"}, "n_gpus": 32, "gpu": "h100-sxm-80gb"}) == (
        "Full fine-tune of Llama-2-13B on 32 × H100: layout, cost and confidence")
    other = {**default, "training": {"finetune": "lora"}}
    assert memo._title(other, {"model": {"name": "Qwen/Qwen2-7B"}, "n_gpus": 2, "gpu": "a100-80gb"}) == (
        "LoRA fine-tune of Qwen/Qwen2-7B on 2 × A100: layout, cost and confidence")
    assert memo._title({"memo": {"title": "Plan {x} {model"}}, {}) == "Plan {x} {model"
    assert memo._title({"study": {"name": "s"}}, None) == "s"
    assert (memo.gpu_label("a100-80gb"), memo.gpu_label("h200-141gb"), memo.gpu_label(None)) == ("A100", "H200", "GPU")


def test_own_gpu_check_prints_the_records_summary_and_says_only_what_the_errors_show(tmp_path):
    """The memo's "Own GPU measurements" section renders calibration.json's gpu_check (here the committed H200 records
    checked live): per proxy family the tokens/s MAPE, bias, and allocated and reserved memory bias, the block-saves
    agreement, and the sentence on over-prediction only when every step time is over-predicted."""
    from trainplan.calibration.sources import gpu_check

    h200 = Path(__file__).resolve().parents[3] / "data" / "calibration" / "h200-2026-12-04"
    gc = gpu_check(str(h200))
    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)

    def text_with(check: dict) -> str:
        cal = json.loads((FIXTURE / "calibration/calibration.json").read_text()) | {"gpu_check": check}
        (root / "calibration/calibration.json").write_text(json.dumps(cal))
        return _html_text(_context(root))

    def tight(t: str) -> str:  # the text layer puts spaces inside brackets and before punctuation after <code>
        return re.sub(r"\s+([,;)])", r"\1", re.sub(r"\(\s+", "(", t))

    text = text_with(gc)
    allr = next(r for r in gc["summary"] if r["family"] == "all")
    assert "Own GPU measurements (predicted, never fitted)" in text and "allocated bias reserved bias" in text
    assert f"all runs 12 {memo.fmt(allr['throughput_mape'], 'pct')} {memo.fmt(allr['throughput_bias'], 'spct')}" in text
    assert memo.PROXY_FAMILY_LABELS["layout"] in text
    assert f"predicted to within {memo.fmt(allr['saved_layer_max_abs_err_bytes'], 'int')} bytes in every run" in text
    assert "Every step time is predicted longer than it ran" in text
    # the fa2 assumption is the fit's rate, not a claim that every published run ran FA2 (TE's ran cuDNN: §7.7)
    assert "FlashAttention-2's rate (attn_kernel: fa2), the rate the fit assigns every published run" in tight(text)
    assert "as in every published run" not in text and "2024's cuDNN attention" in text
    # the allocator: the committed runs recorded none; a session that records one is named as such

    launch_sets = f"the launch scripts and the preflight set {ALLOC_CONF}, meant to cut that fragmentation"
    assert "Allocator settings: none recorded for these runs (scripts/device_proxies.sh sets none)" in tight(text)
    assert launch_sets in tight(text)
    gc["environment"]["alloc_conf"] = ALLOC_CONF
    assert f"Allocator settings: {ALLOC_CONF} in these runs; {launch_sets}" in tight(text_with(gc))
    gc["records"][0]["throughput_err"] = 0.02
    assert "Every step time is predicted longer than it ran" not in text_with(gc)


def test_fp8_paragraph_says_what_compile_gives_and_which_recipe_is_opted_in(tmp_path):
    """The FP8 rows of the technique table (search.fp8_technique_rows) reach the memo's "FP8 on this layout"
    paragraph: for an eager study each recipe with what torch.compile would give and "Neither is used"; with a
    recipe opted in, that one marked and its saving stated as fact (the cost already includes it)."""
    import pandas as pd

    from trainplan.model.arch import resolve_model
    from trainplan.model.efficiency import Efficiency
    from trainplan.model.hardware import ClusterSpec, resolve_gpu
    from trainplan.model.layout import Layout
    from trainplan.model.training import TrainingSpec
    from trainplan.provenance import write_sidecar
    from trainplan.search.layouts import fp8_technique_rows

    h100 = ClusterSpec(nodes=4, gpus_per_node=8, gpu=resolve_gpu("h100-sxm-80gb"))
    m, lay = resolve_model("llama2-13b"), Layout(dp=32, sharding="zero2")
    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    base = pd.read_csv(FIXTURE / "analytic/techniques.csv")

    def text_with(training: TrainingSpec) -> str:
        rows = fp8_technique_rows(m, h100, training, lay, Efficiency.for_gpu(h100.gpu))
        out = root / "analytic/techniques.csv"
        pd.concat([base, pd.DataFrame(rows)[list(base.columns) + ["compiled_note", "risk"]]]).to_csv(out, index=False)
        write_sidecar(out, rule="analytic_model", config_slice={})
        return _html_text(_context(root))

    eager = text_with(TrainingSpec(seq_len=4096, global_batch=256, kernels="eager"))
    assert "FP8 on this layout" in eager and "Neither is used: bf16 unless the study opts in." in eager
    para = eager[eager.find("FP8 on this layout"):eager.find("Risk for a fine-tune")]
    assert para.count("under torch.compile (training.kernels: compiled)") == 2, para
    assert "Risk for a fine-tune" in eager
    # the table's FP8 cells point at the paragraph instead of repeating it: the risk is said once, not three times
    assert eager.count("loss divergence from the bf16 run") == 1, eager
    assert eager.count("see FP8 on this layout below (eager kernels: what torch.compile gives; the risk, its day-1 "
                       "check)") == 2
    opted = text_with(TrainingSpec(seq_len=4096, global_batch=256, kernels="compiled", precision="fp8-tensorwise"))
    assert re.search(r"FP8 matmuls \(tensorwise, torchao Float8\) \(opted in by training\.precision\) buys \+\d+\.\d% "
                     r"over bf16: it cuts the p50 cost by \$[\d,]+;", opted), opted[opted.find("FP8 on this"):][:400]
    assert "Neither is used" not in opted and "under torch.compile" not in opted


def test_sensitivity_base_is_explained_against_the_cost_tables_p50(rendered):
    """The tornado's base cost is one point (every assumption at base, p50 throughput); the cost table's p50 is a
    median over joint draws. The memo prints both from cost.json and says why they differ; costs print as dollars."""
    ctx = _context(rendered["root"])
    ctx["cost"] = dict(ctx["cost"], detail={"point": {"usd": 1600.0}, "n_samples": 4000})
    text = _html_text(ctx)
    p50 = ctx["cost"]["dollars"]["p50"]
    assert "every assumption at its config value and the throughput at its p50: one point, $1,600" in text
    assert f"The cost table's p50, ${p50:,.0f}, is the median over 4,000 joint draws" in text
    assert f"differ by {100 * (p50 / 1600.0 - 1):.1f}%" in text
    s = ctx["sensitivity"][0]
    assert f"${s['metric_low']:,.0f} / ${s['metric_base']:,.0f} / ${s['metric_high']:,.0f}" in text
    ctx["sensitivity"] = [dict(s, parameter="dataset_tokens", unit="tokens", low_value=5e9, base_value=1e10,
                               high_value=2e10)]  # as the tornado's ticks, not 5e+09 / 1e+10 / 2e+10
    assert "dataset_tokens (tokens) 5B / 10B / 20B" in " ".join(re.sub(r"<[^>]+>", " ", memo.render_html(ctx)).split())
    del ctx["cost"]["detail"]
    assert "one point" not in " ".join(re.sub(r"<[^>]+>", " ", memo.render_html(ctx)).split())


def test_throughput_table_shows_the_terms_that_add_up_to_the_step(tmp_path):
    """The recommended layout's row lists the step's terms (timing.STEP_PARTS): CPU offload only when it offloads,
    so the row adds up to its step time either way."""
    import pandas as pd

    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)

    def row_text() -> tuple[list[str], str]:
        ctx = _context(root)
        text = _html_text(ctx)
        r = ctx["chosen_row"]
        assert sum(float(r[k]) for k, _ in ctx["step_parts"]) == pytest.approx(float(r["step_time_s"]), rel=1e-6)
        return [k for k, _ in ctx["step_parts"]], text

    keys, text = row_text()
    assert "offload_s" not in keys and "CPU offload s" not in text and "optimizer step s step s" in text
    cand = pd.read_csv(root / "analytic/candidates.csv")
    first = cand["rank"] == cand.loc[cand["feasible"].astype(bool), "rank"].min()
    cand.loc[first, "offload_s"] = 0.5
    cand.loc[first, "step_time_s"] += 0.5
    cand.to_csv(root / "analytic/candidates.csv", index=False)
    keys, text = row_text()
    assert keys[-1] == "offload_s" and "optimizer step s CPU offload s step s" in text


def test_nccl_check_holds_the_cluster_to_the_busbw_the_plan_assumes(tmp_path):
    """The day-1 nccl-tests threshold is the busbw the model gives a collective over all GPUs (rail model: per-rail
    inter-node busbw × rails per node, capped at NVLink's), written once in the manifest and quoted by the memo; it
    was the per-rail 46 GB/s, which a cluster 8× slower than planned would pass."""
    from trainplan.launch.artifacts import day1_commands
    from trainplan.model import comm
    from trainplan.model.hardware import ClusterSpec, resolve_gpu
    from trainplan.provenance import write_sidecar

    cluster = ClusterSpec(nodes=4, gpus_per_node=8, gpu=resolve_gpu("h100-sxm-80gb"))
    day1 = day1_commands(cluster, trainer="accelerate", min_tokens_per_s_per_gpu=4741.6)
    nccl = next(d for d in day1 if d["check"].startswith("nccl-tests"))
    planned = float(comm.group_link(cluster, 32, 1)[0]) / 1e9
    assert nccl["min_busbw_GBps"] == pytest.approx(planned) and planned > 2 * cluster.inter_busbw_Bps / 1e9
    assert f">= {planned:g} GB/s" in nccl["passes_when"] and "46 per rail × 8 rails" in nccl["passes_when"]
    assert "--min-tokens-per-s-per-gpu 4742`" in day1[1]["passes_when"]  # rounded as the memo prints the p10
    one_node = next(d for d in day1_commands(ClusterSpec(nodes=1, gpus_per_node=8, gpu=resolve_gpu("h100-sxm-80gb")),
                                             trainer="accelerate") if "min_busbw_GBps" in d)
    assert one_node["min_busbw_GBps"] == pytest.approx(360.0)
    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    man = json.loads((root / "launch/manifest.json").read_text()) | {"day1": day1}
    (root / "launch/manifest.json").write_text(json.dumps(man))
    write_sidecar(root / "launch/manifest.json", rule="launch_artifacts", config_slice={})
    ctx = _context(root)
    text = _html_text(ctx)
    assert f"reaches the busbw the plan assumes, {planned:,.0f} GB/s ( inter_busbw_GBps × rails" in text
    # one node: the check runs on the node and holds it to the NVLink busbw, with no rail model to mention
    assert one_node["check"] == "nccl-tests all-reduce on the node" and one_node["nodes"] == 1
    one = day1_commands(ClusterSpec(nodes=1, gpus_per_node=8, gpu=resolve_gpu("h100-sxm-80gb")), trainer="accelerate")
    (root / "launch/manifest.json").write_text(json.dumps(man | {"day1": one}))
    ctx = _context(root)
    text = _html_text(ctx)
    assert _squash("nccl-tests all-reduce on the node reaches the busbw the plan assumes, 360 GB/s (intra_busbw_GBps)"
                   ) in _squash(text)
    assert "rail model" not in text and "over all nodes" not in text


def test_a_one_gpu_study_has_no_nccl_check_no_ddp_and_no_vacuous_deviation(tmp_path):
    """One GPU (a QLoRA 7B study on 1 × H100): nothing to all-reduce, so no nccl-tests check (the memo listed one
    at the NVLink busbw); the layout's family is 'one GPU', not DDP; and Accelerate's FSDP2 over one rank is the
    plan, not a difference from it."""
    from trainplan.launch.artifacts import day1_commands, plan_deviations
    from trainplan.model.arch import resolve_model
    from trainplan.model.hardware import ClusterSpec, resolve_gpu
    from trainplan.model.training import TrainingSpec
    from trainplan.provenance import write_sidecar

    one = ClusterSpec(nodes=1, gpus_per_node=1, gpu=resolve_gpu("h100-sxm-80gb"))
    day1 = day1_commands(one, trainer="accelerate", checkpoint_interval_s=3600.0)
    assert [d["check"] for d in day1] == ["one-node preflight", "first 50 steps on all GPUs",
                                          "save and restore one sharded (DCP) checkpoint", "measurements flow back"]
    assert "production checkpoints every" in day1[2]["passes_when"]
    lay = Layout(dp=1, sharding="none", micro_batch=1)
    assert lay.family == "one GPU" and Layout(dp=2, sharding="none").family == "DDP"
    assert Layout(dp=1, tp=2, sharding="none").family == "DDP×TP"
    t = TrainingSpec(seq_len=4096, global_batch=16, finetune="qlora")

    def layout_deviations(ds: list[str]) -> list[str]:  # QLoRA's own (it runs as LoRA) is about the fine-tune
        return [d for d in ds if not d.startswith("finetune=qlora runs as LoRA")]

    assert layout_deviations(plan_deviations(resolve_model("llama2-7b"), one, t, lay, "accelerate")) == []
    two = ClusterSpec(nodes=1, gpus_per_node=2, gpu=one.gpu)  # two ranks: DDP -> FSDP2 is a real difference
    assert len(layout_deviations(plan_deviations(resolve_model("llama2-7b"), two, t, Layout(dp=2, sharding="none"),
                                                 "accelerate"))) == 1
    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    summ = json.loads((root / "analytic/summary.json").read_text()) | {"n_gpus": 1}
    (root / "analytic/summary.json").write_text(json.dumps(summ))
    man = json.loads((root / "launch/manifest.json").read_text()) | {"day1": day1}
    (root / "launch/manifest.json").write_text(json.dumps(man))
    write_sidecar(root / "launch/manifest.json", rule="launch_artifacts", config_slice={})
    ctx = _context(root)
    text = _html_text(ctx)
    assert "one GPU: no collective to test" in text and "nccl-tests all-reduce" not in text


def test_page_one_names_a_global_batch_that_divides_when_it_is_clearly_faster(tmp_path):
    """analytic/summary.json's batch_alternative (search.layouts.batch_alternative) is one sentence on page 1."""
    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    summ = json.loads((root / "analytic/summary.json").read_text())
    alt = {"configured": 256, "global_batch": 264, "other": 240, "family": "ZeRO-2", "gain_frac": 0.1139,
           "layout": "dp24·tp1·pp1·cp1 zero2 rc=none mb=1", "tokens_per_s_per_gpu": 5033.9}
    (root / "analytic/summary.json").write_text(json.dumps(summ | {"n_gpus": 24, "batch_alternative": alt}))
    ctx = _context(root)
    text = _html_text(ctx)
    assert _squash("Global batch 256 rules out dp = 24; at 264 (or 240) dp24·tp1·pp1·cp1 zero2 rc=none mb=1 would run "
                   "11.4% faster (5,034 tokens/s/GPU), a training choice left to you.") in _squash(text)
    (root / "analytic/summary.json").write_text(json.dumps(summ))
    ctx = _context(root)
    assert "rules out dp =" not in memo.render_html(ctx)


def test_a_memory_p90_above_the_searchs_limit_is_at_risk_and_names_the_preflights_switch(tmp_path):
    """The search holds the modelled peak to 90% of usable HBM; the memory model's p90 error can put the chosen
    layout above that (the default study: 66.6 → 79.1 GiB against 71.7). Page 1 then says AT RISK with the count of
    model errors behind it, offers the runner-up whose p90 fits, and the day-1 preflight holds the same limit at the
    error it measures, naming the layout it would switch to at the p90 error (memo.fit_fallback, the preflight's
    own rule), not a fixed-margin layout of its own."""
    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    prod = json.loads((root / "prediction/production.json").read_text())
    prod["chosen"] |= {"mem_total_gib_p50": 60.0, "mem_total_gib_p90": 75.0, "headroom_frac": 1 - 75.0 / 79.6474609375,
                       "mem_over_limit_errors": 5, "mem_errors_n": 27}
    (root / "prediction/production.json").write_text(json.dumps(prod))
    ctx = _context(root)
    text = _html_text(ctx)
    assert "AT RISK : p90 above the search's limit (5 of 27 model errors)" in text
    assert "≤ 71.7 GiB (90% of usable HBM). Above it: switch to the layout the search would choose" in text
    assert "headroom" not in text.split("memory per GPU (GiB)")[1].split("wall-clock")[0]
    # the day-1 switch is the preflight's rule at the p90 error: the same layout preflight_fallback names at ×1.25
    from trainplan.launch.preflight import preflight_fallback

    fb = ctx["fallback"]
    # page 1 offers that one layout as the trade (not the runner-up, a throughput fallback of check 2)
    assert (f"The chosen layout's memory p90 is above the search's limit (71.7 GiB); at that error "
            f"the search would choose {fb['layout']} ({fb['mem_expected_gib']:.1f} GiB at p90, "
            f"{100 * fb['slower_frac']:.1f}% slower; day-1 check 1's switch): if giving up "
            f"{100 * fb['slower_frac']:.1f}% of throughput is cheaper than a day-1 re-plan, run it.") in text
    # the ask says what it covers and what the switch would add: its training hours run slower_frac slower
    cost = json.loads((root / "cost/cost.json").read_text())
    extra = cost["train_hours"]["p90"] * ctx["summary"]["n_gpus"] * (1 / (1 - fb["slower_frac"]) - 1)
    assert extra > 1 and (f"window, for the recommended layout; the memory switch ({100 * fb['slower_frac']:.1f}% "
                          f"slower) would need about {extra:,.0f} GPU-hours more.") in text
    assert fb["mem_ratio"] == pytest.approx(1.25)
    pre = preflight_fallback(root / "analytic/candidates.csv", mem_ratio=1.25)  # (+ check 2's layout after it)
    assert fb["at"] == "p90" and {k: v for k, v in pre.items() if k not in ("second", "switch_is_runner_up")} == {
        k: v for k, v in fb.items() if k not in ("at", "extra_gpu_hours", "tps_p10")}
    # the switch is the runner-up here: the preflight names what check 2 measures after it, as page 1 does
    assert pre["switch_is_runner_up"] and pre["second"]["layout"] == ctx["runner_up"]["after_switch"]["layout"]
    # check 2 after that switch holds the switch's own p10: its estimate (the chosen one's × (1 − slower_frac)) under
    # the held-out errors of its family class; of the chosen layout's class, the chosen p10 × (1 − slower_frac)
    # (the interval is proportional to the estimate); of another class, that class's errors
    ch = prod["chosen"]
    assert fb["interval_family"] == "FSDP/ZeRO"  # the chosen layout's class (dp32 HSDP)
    assert fb["tps_p10"] == pytest.approx(ch["tokens_per_s_per_gpu_p10"] * (1 - fb["slower_frac"]), rel=1e-9)
    assert f"tokens/s/GPU ≥ {ch['tokens_per_s_per_gpu_p10']:,.0f} (p10); after check 1's switch, ≥ {fb['tps_p10']:,.0f} (its p10)." in text
    from trainplan.published.intervals import error_pool, heldout_errors_by_family, interval_bounds

    pools = heldout_errors_by_family("h100")  # a published calibration's pools: each class its own interval
    est = ch["tokens_per_s_per_gpu_p50"] * (1 - fb["slower_frac"])
    got = {c: memo.switch_throughput_p10(fb | {"interval_family": c}, ch, {"heldout_errors_by_family": pools}, None)
           for c in ("FSDP/ZeRO", "TP", "PP", "CP")}
    assert len({round(v, 6) for v in got.values()}) == 4
    for c, v in got.items():
        assert v == pytest.approx(min(est, est * interval_bounds(1.0, error_pool(pools, c))[0]), rel=1e-9), c
    # a bootstrap calibration (production's Monte Carlo interval, not the exact one): the chosen layout's p10 ÷ p50
    boot = {"heldout_errors_by_family": pools, "efficiency_samples": [{}, {}]}
    assert memo.switch_throughput_p10(fb | {"interval_family": "CP"}, ch, boot, None) == pytest.approx(
        ch["tokens_per_s_per_gpu_p10"] * (1 - fb["slower_frac"]), rel=1e-9)
    # a switch sized on the plan (no judge) keeps the plan's estimate even where the chosen launch has a ratio
    launched = {"tps": {p: ch[f"tokens_per_s_per_gpu_{p}"] * 0.8 for p in ("p10", "p50", "p90")}}
    assert memo.switch_throughput_p10(fb, ch, None, launched) == pytest.approx(fb["tps_p10"], rel=1e-9)
    assert memo.switch_throughput_p10(fb | {"as_launched": True}, ch, None, launched) == pytest.approx(
        0.8 * fb["tps_p10"], rel=1e-9)
    assert (f"at the p90 error, ×1.25, {fb['layout']} : {fb['mem_expected_gib']:.1f} GiB, {100 * fb['slower_frac']:.1f}% "
            "slower) and rerun the preflight") in text
    # Risks: the OOM row names the model error (not only long sequences) and check 1's switch as the mitigation
    risks = text.split("Risks and mitigations")[-1]
    assert ("Out of memory: model error, longer sequences p90 memory 75.0 GiB, 3.3 GiB over the limit (90% of usable "
            "HBM, 71.7 GiB): 5 of 27 memory-model errors put the planned sequence over it;") in risks
    assert f"Day-1 check 1 measures the error on one node; above the limit, switch to {fb['layout']} as page 1 says." in risks
    assert "above usable HBM" not in text
    # a switch sized as the launch runs it (memo.fallback_entry with the launch's judge) says so where what runs
    # differs, and where its slowdown is the plan's (what runs has no step-time model); check 1 only for the latter
    ctx["fallback"] = fb | {"as_launched": True, "launched": {"trainer": "torchtitan", "changes": ["FSDP2 for ZeRO-1"],
                                                              "unmodelled": []}, "slower_is_plan": True}
    text = _html_text(ctx)
    pct = f"{100 * fb['slower_frac']:.1f}% slower"
    assert f"({fb['mem_expected_gib']:.1f} GiB at p90, {pct}, as launched: FSDP2 for ZeRO-1; day-1 check 1's switch)" in text
    assert f"{pct}, as launched: FSDP2 for ZeRO-1 (the plan's step time)) and rerun the preflight" in text
    # when the switch is the runner-up itself, check 2 names the second strategy to measure, faster or slower
    ctx["runner_up"] = dict(ctx["runner_up"]) | {"layout": fb["layout"]}
    for frac, word in ((-0.005, "0.5% faster"), (0.101, "10.1% slower")):
        ctx["runner_up"]["after_switch"] = {"layout": "dp16·tp2(sp)·pp1·cp1 zero2 rc=none mb=2", "slower_frac": frac}
        text = _html_text(ctx)
        assert (f"keep the faster of the two measured; if check 1 switched to it, measure dp16·tp2(sp)·pp1·cp1 zero2 "
                f"rc=none mb=2 instead ({word}; the next layout that fits at that error).") in text
    # errors that would exceed usable HBM itself are an OOM, not a limit breach: page 1 and the risk row count them
    prod["chosen"]["mem_over_hbm_errors"] = 2
    (root / "prediction/production.json").write_text(json.dumps(prod))
    ctx = _context(root)
    text = _html_text(ctx)
    assert "AT RISK : p90 above the search's limit (5 of 27 model errors; 2 above usable HBM, an OOM)" in text
    assert "put the planned sequence over it, 2 above usable HBM;" in text.split("Risks and mitigations")[-1]


def test_families_ruled_out_for_one_reason_are_one_row_of_the_alternatives_table():
    """24 GPUs, batch 256: DDP, ZeRO-1, ZeRO-2, FSDP and HSDP all fail as dp24 (and their ×TP as dp12): ten rows
    saying the same thing become two, each naming its families and the simplest layout's degrees."""
    from trainplan.model.arch import resolve_model
    from trainplan.model.hardware import ClusterSpec, resolve_gpu
    from trainplan.model.training import TrainingSpec
    from trainplan.search.layouts import family_verdicts, search

    c24 = ClusterSpec(nodes=3, gpus_per_node=8, gpu=resolve_gpu("h100-sxm-80gb"))
    fam = family_verdicts(search(resolve_model("llama2-13b"), c24, TrainingSpec(seq_len=4096, global_batch=256),
                                 None, {"micro_batch": [1], "recompute": ["none"], "offload": ["none"]}))
    out = memo._families(fam)
    bad = [r for r in out["families"] if r["verdict"] == "infeasible"]
    assert (fam["verdict"] == "infeasible").sum() == 10 and len(bad) == 2
    assert bad[0]["family"] == "DDP, ZeRO-1, ZeRO-2, FSDP, HSDP"
    assert bad[0]["why"].startswith("dp24·tp1·pp1·cp1: global_batch=256 is not a multiple of dp·micro_batch = 24·1")
    assert bad[1]["why"].startswith("dp12·tp2·pp1·cp1: ") and bad[1]["family"].endswith("HSDP×TP")
    assert out["families_shown"] == len(fam) == out["families_total"]


def test_a_chosen_layout_that_won_a_tie_says_so_on_page_one(tmp_path):
    """The search ranks a layout within TIE_FRAC of the fastest first when it has clearly more headroom: page 1
    then says it ties with the fastest (named, how much faster) and how much less memory it needs, instead of
    calling it the fastest; a runner-up 'equivalent' that is that same layout is not named twice."""
    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    cand = pd.read_csv(root / "analytic/candidates.csv")
    ok = cand[cand["feasible"].astype(bool)].sort_values("rank")
    first, second = ok.index[0], ok.index[1]
    assert memo.tie_winner(ok, ok.loc[first].to_dict()) is None  # the fixture's choice is the fastest
    cand.loc[second, "tokens_per_s"] = cand.loc[first, "tokens_per_s"] * 1.002
    cand.loc[second, "mem_total_gib"] = cand.loc[first, "mem_total_gib"] + 9.0
    cand.to_csv(root / "analytic/candidates.csv", index=False)
    won = memo.tie_winner(cand[cand["feasible"].astype(bool)], cand.loc[first].to_dict())
    assert won["layout"] == cand.loc[second, "layout_text"]
    assert won["faster_frac"] == pytest.approx(1 - 1 / 1.002) and won["more_gib"] == pytest.approx(9.0)
    ctx = _context(root)
    text = _html_text(ctx)
    assert _squash(f"it ties with the fastest layout that fits ({won['layout']}, 0.20% faster) and needs 9.0 GiB less "
                   "memory") in _squash(text)
    assert "it is the fastest layout whose modelled peak fits" not in text
    # a tie won on simplicity (headroom within HEADROOM_TIE): no "needs -0.4 GiB less memory"
    cand.loc[second, "mem_total_gib"] = cand.loc[first, "mem_total_gib"] - 0.4
    cand.to_csv(root / "analytic/candidates.csv", index=False)
    ctx = _context(root)
    text = _html_text(ctx)
    assert _squash(f"({won['layout']}, 0.20% faster) and is simpler (fewer techniques at about the same memory)") in \
        _squash(text) and "GiB less memory" not in text
    # a faster layout whose launch the model cannot time (ranked UNTIMED_MARGIN slower): page 1 says so, not "ties";
    # with a timed layout faster too, it names that tie as well
    third = ok.index[2]
    cand["launch_untimed"] = ""
    cand.loc[second, ["tokens_per_s", "launch_untimed"]] = [cand.loc[first, "tokens_per_s"] * 1.03, "all-gather CP"]
    cand.loc[third, ["tokens_per_s", "mem_total_gib"]] = [cand.loc[first, "tokens_per_s"] * 1.002,
                                                          cand.loc[first, "mem_total_gib"] + 9.0]
    cand.to_csv(root / "analytic/candidates.csv", index=False)
    text = _squash(_html_text(_context(root)))
    assert _squash(f"it is the fastest layout that fits whose launch the model can time; {cand.loc[second, 'layout_text']}"
                   " is 3.0% faster as modelled, but its launch runs all-gather CP, a change whose step time is not modelled, and "
                   f"the search ranks such a launch 5% slower; of the layouts it can time, {cand.loc[third, 'layout_text']}"
                   " is 0.20% faster, a tie (under 0.5%) that this layout wins on memory (9.0 GiB less)") in text
    assert "it ties with" not in text
    # a faster layout the launch would not fit: after a tie, its own clause (no "(...) (...)" back to back) ...
    out = cand.index[~cand["feasible"].astype(bool)][0]
    cand.loc[out, ["tokens_per_s", "reason", "launch_untimed"]] = [
        cand.loc[first, "tokens_per_s"] * 1.05, "OOM as launched (torchtitan: FSDP2 for ZeRO-2): needs 75.0 GiB > 71.7 GiB", ""]
    cand.to_csv(root / "analytic/candidates.csv", index=False)
    text = _squash(_html_text(_context(root)))
    assert _squash(f"wins on memory (9.0 GiB less); 1 faster layout fits only as planned (the fastest, "
                   f"{cand.loc[out, 'layout_text']}, needs 75.0 GiB as launched).") in text
    # ... and without a tie, what the fastest-that-fits claim is measured against
    cand.loc[[second, third], "tokens_per_s"] = cand.loc[first, "tokens_per_s"] * 0.9
    cand.to_csv(root / "analytic/candidates.csv", index=False)
    text = _squash(_html_text(_context(root)))
    assert _squash("it is the fastest layout whose modelled peak fits as the launch runs it (1 faster layout fits only "
                   f"as planned; the fastest, {cand.loc[out, 'layout_text']}, needs 75.0 GiB as launched).") in text


def test_launch_deviations_are_on_page_one_and_listed_in_appendix_a(tmp_path):
    """A layout the chosen trainer cannot run as planned (torchtitan has ring CP only; its CPU offload moves the
    whole model) was recommended with no word of it outside a comment in the job file: the day-1 checks then
    measure another layout than the one predicted. Page 1 counts the differences (and keeps the ask), Appendix A
    lists them from the manifest and says how to plan only what the launch runs."""
    from trainplan.launch.artifacts import day1_commands
    from trainplan.model.hardware import ClusterSpec, resolve_gpu
    from trainplan.provenance import write_sidecar

    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    man = json.loads((root / "launch/manifest.json").read_text())
    assert not man.get("trainer", {}).get("deviations")  # the fixture's layout runs as planned
    differs = ["cp_kind=ulysses: torchtitan 0.3 CP is ring attention; emitted as ring CP",
               "offload=cpu: torchtitan enable_cpu_offload is FSDP2's CPUOffloadPolicy"]
    man["trainer"] = {**man.get("trainer", {}), "chosen": "torchtitan", "deviations": differs}
    man["day1"] = day1_commands(ClusterSpec(nodes=4, gpus_per_node=8, gpu=resolve_gpu("h100-sxm-80gb")),
                                trainer="torchtitan", min_tokens_per_s_per_gpu=4960.6)
    (root / "launch/manifest.json").write_text(json.dumps(man))
    write_sidecar(root / "launch/manifest.json", rule="launch_artifacts", config_slice={})
    pdf = _render(root, tmp_path / "memo.pdf")
    pages = [p.extract_text() for p in PdfReader(pdf).pages]
    one = _squash(pages[0])
    assert _squash("the sbatch runs torchtitan with 2 differences from the plan)") in one
    assert "Theask" in one  # the sentence does not push the ask off page 1
    text = _squash("\n".join(pages))
    assert _squash("Where the launch differs from the plan") in text
    assert all(_squash(d) in text for d in differs) and _squash("narrow the config's search section (cp_kinds") in text


@pytest.mark.parametrize(("tps_ratio", "mem_ratio"), [(0.9, 1.5), (None, 1.5), (0.999, 1.002)])
def test_page_one_judges_what_the_launch_runs(tmp_path, tps_ratio, mem_ratio):
    """Where the sbatch's trainer runs something else (QLoRA as LoRA over a bf16 base: 73.1 GiB against the search's
    71.7 GiB limit, where the plan said 71.6), page 1 kept the plan's verdict and day-1 thresholds. It now gives
    what runs its own rows and verdict (from the manifest's modelled ratios), sets day-1 checks 1 and 2 on them,
    and says where a ratio has no model (the plan's figure stands); the ask stays on page 1."""
    from trainplan.launch.artifacts import day1_commands
    from trainplan.model.hardware import ClusterSpec, resolve_gpu
    from trainplan.provenance import write_sidecar

    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    chosen = json.loads((root / "prediction/production.json").read_text())["chosen"]
    man = json.loads((root / "launch/manifest.json").read_text())
    man["trainer"] = {**man.get("trainer", {}), "chosen": "accelerate", "deviations": ["finetune=qlora runs as LoRA"],
                      "as_launched": {"trainer": "accelerate", "changes": ["LoRA over a bf16 base for QLoRA"],
                                      "unmodelled": [] if tps_ratio else ["step time"],
                                      "memory_ratio": mem_ratio, "throughput_ratio": tps_ratio}}
    man["day1"] = day1_commands(ClusterSpec(nodes=4, gpus_per_node=8, gpu=resolve_gpu("h100-sxm-80gb")),
                                trainer="accelerate", min_tokens_per_s_per_gpu=4464.5)
    (root / "launch/manifest.json").write_text(json.dumps(man))
    write_sidecar(root / "launch/manifest.json", rule="launch_artifacts", config_slice={})
    errors = [0.0, -0.12, 0.03]  # the memory model's error pool (production.json), as calibrate writes it
    prod = json.loads((root / "prediction/production.json").read_text())
    prod["interval"] = {**(prod.get("interval") or {}), "memory_relative_errors": errors, "memory_errors_n": 3}
    (root / "prediction/production.json").write_text(json.dumps(prod))
    write_sidecar(root / "prediction/production.json", rule="predict_production", config_slice={})
    pdf = _render(root, tmp_path / "memo.pdf")
    one = _squash(PdfReader(pdf).pages[0].extract_text())
    mem50 = f"{chosen['mem_total_gib_p50'] * mem_ratio:.1f}"
    if mem_ratio < 1.01:  # under 1%: no rows, the heading says so (and the thresholds still use the ratios)
        assert "aslaunched" not in one.split("Day-1")[0].replace(" ", "")
        assert ("the sbatch runs accelerate with 1 difference from the plan: LoRA over a bf16 base for QLoRA; "
                "checks on what runs (they move throughput and memory by under 1%))"
                ) in " ".join(PdfReader(pdf).pages[0].extract_text().split())
        assert _squash(f"tokens/s/GPU ≥ {chosen['tokens_per_s_per_gpu_p10'] * tps_ratio:,.0f} (p10 as launched)") in one
        return
    assert _squash(f"memory as launched {mem50}") in one  # 48.2 × 1.5 = 72.3 GiB: over the 71.7 GiB limit
    # the verdict counts the memory model's errors that put the launch's own peak over the limit and over HBM
    peaks = [chosen["mem_total_gib_p50"] * mem_ratio / (1 + e) for e in errors]
    assert _squash(f"{chosen['mem_total_gib_p90'] * mem_ratio:.1f} ≤ 71.7 FAIL: the estimate above the limit "
                   f"({sum(p > 71.68 for p in peaks)} of 3 errors, {sum(p > 79.6 for p in peaks)} above HBM); check 1 "
                   "decides") in one
    assert _squash("the sbatch runs accelerate with 1 difference from the plan: LoRA over a bf16 base for QLoRA; "
                   "checks and “as launched” rows on what runs)") in one
    assert _squash(f"× the modelled {mem50} GiB as launched) ≤ 71.7 GiB") in one  # check 1
    p10 = chosen["tokens_per_s_per_gpu_p10"]
    if tps_ratio:
        assert _squash(f"tokens/s/GPU as launched {chosen['tokens_per_s_per_gpu_p50'] * tps_ratio:,.0f}") in one
        cost = json.loads((root / "cost/cost.json").read_text())
        assert _squash(f"as launched (0.90× the plan's throughput) about {cost['ask']['gpu_hours'] / tps_ratio:,.0f} "
                       "GPU-hours.") in one  # the ask
        assert _squash(f"tokens/s/GPU ≥ {p10 * tps_ratio:,.0f} (p10 as launched)") in one  # check 2
    else:
        assert one.count(_squash("as launched")) == 3  # the memory row, the heading, check 1: no throughput row
        assert _squash(f"tokens/s/GPU ≥ {p10:,.0f} (the plan's p10: what accelerate runs has no step-time model)") in one
    assert "Theask" in one


def test_a_launch_nothing_models_keeps_the_plans_figures_and_says_so(tmp_path):
    """A deviation with no model (FSDP2's whole-model CPU offload for an optimizer-only plan): no "as launched" rows,
    and the heading does not claim the checks are set on what runs."""
    from trainplan.launch.artifacts import day1_commands
    from trainplan.model.hardware import ClusterSpec, resolve_gpu
    from trainplan.provenance import write_sidecar

    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    man = json.loads((root / "launch/manifest.json").read_text())
    man["trainer"] = {**man.get("trainer", {}), "chosen": "accelerate", "deviations": ["offload=cpu: ..."],
                      "as_launched": {"trainer": "accelerate", "changes": ["whole-model CPU offload, not optimizer-only"],
                                      "unmodelled": ["memory", "step time"], "memory_ratio": None,
                                      "throughput_ratio": None}}
    man["day1"] = day1_commands(ClusterSpec(nodes=4, gpus_per_node=8, gpu=resolve_gpu("h100-sxm-80gb")),
                                trainer="accelerate", min_tokens_per_s_per_gpu=4960.6)
    (root / "launch/manifest.json").write_text(json.dumps(man))
    write_sidecar(root / "launch/manifest.json", rule="launch_artifacts", config_slice={})
    one = _squash(PdfReader(_render(root, tmp_path / "memo.pdf")).pages[0].extract_text())
    assert _squash("whole-model CPU offload, not optimizer-only; checks on the plan's figures: what it runs has no "
                   "model)") in one
    assert "checksonwhatruns" not in one
    assert _squash("the plan's figure: what accelerate runs has no memory model") in one
    assert _squash("(the plan's p10: what accelerate runs has no step-time model)") in one


def test_an_fp8_memo_lists_its_loss_check_on_page_one_and_in_risks(tmp_path):
    """The FP8 memo's technique section named a day-1 loss check (200 steps within 1% of bf16) that neither page 1's
    checks nor the Risks table carried. Both now read it from the manifest's day-1 list, with its limits."""
    from trainplan.launch.artifacts import day1_commands
    from trainplan.model.hardware import ClusterSpec, resolve_gpu
    from trainplan.provenance import write_sidecar

    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    man = json.loads((root / "launch/manifest.json").read_text())
    man["day1"] = day1_commands(ClusterSpec(nodes=4, gpus_per_node=8, gpu=resolve_gpu("h100-sxm-80gb")),
                                trainer="accelerate", min_tokens_per_s_per_gpu=4960.6, fp8_parity="scripted")
    (root / "launch/manifest.json").write_text(json.dumps(man))
    write_sidecar(root / "launch/manifest.json", rule="launch_artifacts", config_slice={})
    pages = [p.extract_text() for p in PdfReader(_render(root, tmp_path / "memo.pdf")).pages]
    one = _squash(pages[0])
    assert _squash("FP8 loss: 200 steps in FP8 and in bf16 from the same weights and data, the mean loss of the last "
                   "50 within 1% of bf16's. Beyond it: train in bf16") in one
    assert "Theask" in one
    text = _squash("\n".join(pages))
    assert _squash("FP8 loss divergence") in text
    assert _squash("Day-1 check 5: 200 steps in FP8 and in bf16 from the same weights and data, the mean loss of the "
                   "last 50 within 1% of bf16's; beyond it, train in bf16.") in text
    assert _squash("TRAINPLAN_MODE=day1-loss-parity") in text  # Appendix A's command
    # a memo without FP8 has neither (its text, from the HTML: nothing here asks where)
    shutil.copy(FIXTURE / "launch/manifest.json", root / "launch/manifest.json")
    write_sidecar(root / "launch/manifest.json", rule="launch_artifacts", config_slice={})
    assert _squash("FP8 loss") not in _squash(_html_text(_context(root)))


def test_flops_formula_names_the_parameters_it_counts(tmp_path):
    """The throughput section's 6·N + 12·L·h·s reproduces the FLOPs per token it prints: N is N_dense (all but the
    input embedding; the output projection counts), printed beside the non-embedding count, which differs from it
    by the LM head (it said N_non-embedding: 8.62e10 by its own formula against the 8.72e10 printed)."""
    from trainplan.model.arch import resolve_model
    from trainplan.model.flops import n_params_dense, train_flops_per_token
    from trainplan.model.training import TrainingSpec
    from trainplan.provenance import write_sidecar

    m = resolve_model("llama2-13b")
    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    summary = json.loads((root / "analytic/summary.json").read_text())
    summary["model"] = summary["model"] | {"n_params_dense": n_params_dense(m),
                                           "n_params_nonembedding": m.n_params_nonembedding}
    summary["flops_per_token"] = train_flops_per_token(m, TrainingSpec(seq_len=4096, global_batch=256))
    (root / "analytic/summary.json").write_text(json.dumps(summary))
    write_sidecar(root / "analytic/summary.json", rule="analytic_model", config_slice={})
    ctx = _context(root)
    text = _html_text(ctx)
    assert f"N dense = {n_params_dense(m):,}, every parameter but the input embedding table" in text
    assert "Model FLOPs per token = 6·N dense + 12·L·h·s" in text
    flops = 6 * n_params_dense(m) + 12 * m.layers * m.hidden * 4096
    assert f"This study: {flops:.2e} model FLOPs per token" in text
    assert f"{6 * m.n_params_nonembedding + 12 * m.layers * m.hidden * 4096:.2e}" not in text


def test_day1_criteria_render_backticked_commands_as_code():
    """manifest.json's criteria mark commands with backticks; the memo prints them as <code>, escaped (they printed
    as literal backticks around a nested "<run-<study hash>>" placeholder)."""
    from trainplan.launch.artifacts import day1_commands
    from trainplan.model.hardware import ClusterSpec, resolve_gpu

    day1 = day1_commands(ClusterSpec(nodes=4, gpus_per_node=8, gpu=resolve_gpu("h100-sxm-80gb")), trainer="accelerate",
                         min_tokens_per_s_per_gpu=4741.6, study_hash="1d4b04148965" + "0" * 52)
    spans = str(memo.code_spans(day1[1]["passes_when"]))
    text = re.sub(r"</?span[^>]*>", "", spans)  # the no-wrap pieces of a command (test_day1_commands_wrap_only...)
    assert "<code>trainplan ingest results/launch/run-1d4b04148965/day1-throughput-&lt;job&gt;/steps.jsonl " in text
    assert "`" not in spans and "<run-" not in day1[1]["passes_when"]
    assert re.sub(r"</?span[^>]*>", "", str(memo.code_spans("a <b> `c & d`"))) == "a &lt;b&gt; <code>c &amp; d</code>"


def test_comparable_runs_say_when_none_is_of_the_layouts_family():
    """The runner-up's closest open runs may all be of other family classes (nearest size wins): the memo says so
    rather than let FSDP runs stand as evidence for a PP layout; a block with a same-class run says nothing."""
    ctx = _context(FIXTURE)
    run = {"table": "t", "row": "r", "model": "m", "params_b": 8.0, "n_gpus": 8, "seq_len": 8192, "kernels": "eager",
           "layout": "dp8", "precision": "bf16", "published_mfu": 0.4, "predicted_mfu": 0.38, "err_pct": -5.0}
    ctx["production"] = dict(ctx["production"] or {}, comparable_runs=[
        {"role": "chosen", "layout": "dp32 zero2", "family": "FSDP/ZeRO", "predicted_mfu": 0.44,
         "runs": [run | {"family": "FSDP/ZeRO"}, run | {"family": "TP"}]},
        {"role": "runner-up family", "layout": "dp16 pp2", "family": "PP", "predicted_mfu": 0.42,
         "runs": [run | {"family": "FSDP/ZeRO"}, run | {"family": "TP"}]}])
    text = _html_text(ctx)
    assert text.count("no open run of the") == 1
    assert ("predicted MFU 42.0%: no open run of the PP class is this close in size, so these speak for the model, "
            "not for this family") in text


def test_study_assumptions_show_the_lora_keys_only_for_adapters_and_big_numbers_with_separators():
    """A full fine-tune's assumptions listed training.lora_rank and lora_targets (read by nothing) and the dataset as
    "10000000000.0"; a LoRA study lists its adapters."""
    full = {**CONFIG, "training": {**CONFIG["training"], "finetune": "full", "lora_rank": 16,
                                   "lora_targets": ["q", "v"], "dataset_tokens": 10.0e9, "epochs": 1}}
    rows = dict(memo._assumptions(full))
    assert "training.lora_rank" not in rows and "training.lora_targets" not in rows
    assert rows["training.dataset_tokens"] == "10,000,000,000" and rows["training.epochs"] == "1"
    assert rows["training.seq_len"] == "4096" and rows["cluster.gpu"] == "h100-sxm-80gb"  # below 10⁴: as written
    lora = dict(memo._assumptions({**full, "training": {**full["training"], "finetune": "lora"}}))
    assert lora["training.lora_rank"] == "16" and lora["training.lora_targets"] == '["q", "v"]'


def test_risks_state_the_chance_of_an_interruption(rendered):
    """The node-failure row: the expected count and the chance of at least one (cost.json, Poisson)."""
    cost = _load("cost/cost.json")
    pct = f"{100 * cost['p_any_interruption']:.1f}%"
    assert _squash(f"Expected interruptions in this run: 0.6 (a {pct} chance of at least one)") in _squash(
        rendered["text"])


def test_risks_also_state_the_interruptions_at_the_p90_of_the_draws(tmp_path):
    """The base-case count sits at the low end of the failure-rate range (× 0.5–3): the row adds the p90 of the
    cost table's draws, so the reader sees the pessimistic chance too."""
    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    cost = json.loads((root / "cost/cost.json").read_text())
    cost |= {"expected_interruptions_p90": 0.031, "p_any_interruption_p90": 0.0305,
             "detail": {"assumptions": {"failure_rate_x_range": [0.5, 3.0]}}}
    (root / "cost/cost.json").write_text(json.dumps(cost))
    ctx = _context(root)
    text = _html_text(ctx)
    assert _squash("at the base assumptions; 0.031 (3.0%) at the p90 of the cost table's draws (failure rate up to "
                   "3× the Llama 3 fleet's).") in _squash(text)


def test_no_memory_trade_is_offered_when_the_chosen_p90_fits(rendered):
    chosen = _load("prediction/production.json")["chosen"]
    assert chosen["mem_total_gib_p90"] < _load("analytic/summary.json")["hbm_gib"]
    assert _squash("The chosen layout's memory p90 is above") not in _squash(rendered["text"])


def test_risk_table_measures_memory_against_page_ones_limit_and_names_seq8k_only_below_8k(rendered):
    """The OOM risk row states the p90 against the search's limit page 1 holds (it printed the headroom to all of
    usable HBM: 0.7% where page 1 said 7.4 GiB over), and suggests the 8k-token study only to a shorter study."""
    ch = _load("prediction/production.json")["chosen"]
    gap = ch["mem_limit_gib"] - ch["mem_total_gib_p90"]
    want = (f"p90 memory {ch['mem_total_gib_p90']:.1f} GiB, {abs(gap):.1f} GiB {'under' if gap >= 0 else 'over'} the "
            f"limit (90% of usable HBM, {ch['mem_limit_gib']:.1f} GiB)")
    assert _squash(want) in _squash(rendered["text"])
    ctx = _context(rendered["root"])
    risks = {}
    for seq in (4096, 8192):
        risks[seq] = _html_text(dict(ctx, training_seq_len=seq))
    assert "config/seq8k.yaml , is one such study" in risks[4096] and "seq8k.yaml" not in risks[8192]
    over = dict(ctx, chosen=dict(ctx["chosen"], mem_total_gib_p90=ch["mem_limit_gib"] + 2.5))
    text = _html_text(over)
    assert "GiB, 2.5 GiB over the limit (90% of usable HBM" in text


def test_the_day1_switch_adds_the_ask_hours_run_slower_frac_slower():
    """slower_frac s: the same tokens take 1/(1−s) as long, so the switch adds train·n·(1/(1−s) − 1) GPU-hours."""
    cost = {"train_hours": {"p90": 10.0}}
    assert memo.switch_extra_gpu_hours(cost, {"slower_frac": 0.5}, 8) == pytest.approx(80.0)
    assert memo.switch_extra_gpu_hours(cost, {"slower_frac": 0.2}, 8) == pytest.approx(20.0)
    assert memo.switch_extra_gpu_hours(cost, {"slower_frac": 1.0}, 8) is None
    assert memo.switch_extra_gpu_hours({}, {"slower_frac": 0.2}, 8) is None


def test_day1_commands_wrap_only_at_spaces_and_after_a_slash():
    """Appendix A broke `--ntasks-per-⏎node=8` and `TRAINPLAN_MODE=day1-⏎throughput` at their hyphens, so a
    command copied from the PDF failed. Each piece between spaces (and after a "/") is one no-wrap span."""
    out = str(memo.command_html("srun --ntasks-per-node=8 results/launch/run-1/day1-x.jsonl a<b"))
    assert out == ('<span class="nw">srun</span> <span class="nw">--ntasks-per-node=8</span> '
                   '<span class="nw">results/</span><span class="nw">launch/</span><span class="nw">run-1/</span>'
                   '<span class="nw">day1-x.jsonl</span> <span class="nw">a&lt;b</span>')
    assert re.sub(r"<[^>]+>", "", out) == "srun --ntasks-per-node=8 results/launch/run-1/day1-x.jsonl a&lt;b"
    assert str(memo.command_html("--export=ALL,MODE=day1-x")) == \
        '<span class="nw">--export=ALL,</span><span class="nw">MODE=day1-x</span>'
    ticks = str(memo.code_spans("ends with `trainplan ingest a/b --min-x 1` (median)"))
    assert ticks.startswith('ends with <code><span class="nw">trainplan</span> ') and ticks.endswith("</code> (median)")
    css = (Path(memo.__file__).parent.parent / "templates" / "memo.css").read_text()
    assert ".nw { white-space: nowrap; }" in css and "table.day1 { table-layout: fixed; }" in css


def test_technique_layouts_may_wrap_and_adapter_studies_say_what_their_states_are(rendered):
    """The seq8k memo's technique table ran past the page edge (its CP layouts are long unbreakable strings); they
    may now wrap after each "·". The LoRA and QLoRA memos printed only the full fine-tune's 16Ψ model states."""
    assert memo.layout_breaks("dp16·tp1·pp1·cp2(ulysses) zero2") == "dp16·\u200btp1·\u200bpp1·\u200bcp2(ulysses) zero2"
    assert memo.layout_breaks(None) == ""
    ctx = _context(rendered["root"])
    for finetune, want in (("full", None), ("lora", "This study is LoRA: the frozen base holds only its weights (2Ψ in "
                                                     "bf16"),
                           ("qlora", "This study is QLoRA: the frozen base holds only its weights (0.5Ψ in NF4")):
        text = _html_text(ctx | {"training_finetune": finetune})
        assert (want is None and "This study is" not in text) or (want is not None and want in text), finetune
    assert "\u200b" in memo.render_html(ctx) or not ctx.get("techniques")
