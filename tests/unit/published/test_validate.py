"""Predicted vs published tables (data/, citations in src/trainplan/data/SOURCES.md), one named tolerance each.

One Efficiency per GPU generation, fitted on that generation's tables only (validate.GEN_FIT; the fits ship in
trainplan/data/efficiency_fits.json with their standard errors and leave-one-table-out errors). The tolerances
record what the fits reach today with a little margin; the project's target is 10% MAPE per table.
"""

import json

import numpy as np
import pandas as pd
import pytest

from trainplan.model.base import ConfigError
from trainplan.model.efficiency import Efficiency, generation_fits
from trainplan.published.fit import (
    GEN_FIT,
    MAMF_FRAC,
    family_bias,
    fit_generation,
    heldout_checks,
    interval_coverage,
)
from trainplan.published.tables import TT500_PARAM, mape_table, validate_all

# In-sample MAPE per table (each generation's own fit; bf16 and FP8 rows). Reached: Megatron 2021 T1 4.0%,
# Korthikanti 3.7%, torchtitan A100 2.5%; torchtitan H100 6.4%, async TP 8.0%, Megatron 2024 6.2%, Llama 3 405B
# 3.3%; NeMo 24.07 FP8 (held out of every fit) 7.9%, NeMo long-sequence FP8 (held out of every fit) 14.5%.
MAPE_TOL_PCT = {"megatron2021_t1": 5.0, "korthikanti2022_t3_5": 5.0, "torchtitan_a100": 5.0,
                "torchtitan_h100": 7.0, "torchtitan_asynctp_h100": 8.5, "megatron2024_h100": 6.5,
                "llama3_405b_h100": 4.0, "nemo2407_h100": 8.0, "nemo_longseq_h100": 15.5}
# Memory vs torchtitan's peak reserved GiB (the eager and compiled bf16 FSDP rows, 8 and 128 GPUs, seq 8192; float8
# rows shown only): reached 1.2%. Before compile's saves were modelled the compiled rows ran +6.7 and +9.9%.
TORCHTITAN_H100_MEM_MAPE_TOL_PCT = 2.5


@pytest.fixture(scope="module")
def rows():
    return validate_all()


@pytest.fixture(scope="module")
def mape(rows):
    return {(r.table, r.metric): r.mape_pct for r in mape_table(rows).itertuples()}


@pytest.mark.parametrize("table", list(MAPE_TOL_PCT))
def test_each_published_table_within_its_tolerance(mape, table):
    got = [v for (t, m), v in mape.items() if t == table and m != "memory_gib"]
    assert len(got) == 1 and got[0] <= MAPE_TOL_PCT[table], (table, got)


def test_torchtitan_h100_memory(rows, mape):
    assert mape[("torchtitan_h100", "memory_gib")] <= TORCHTITAN_H100_MEM_MAPE_TOL_PCT
    scored = rows[(rows["table"] == "torchtitan_h100") & (rows["metric"] == "memory_gib") & rows["in_mape"]]
    assert sorted(scored["kernels"]) == ["compiled", "compiled", "eager", "eager"]


def test_every_h100_table_is_scored_with_the_h100_fit(rows):
    h = rows[rows["generation"] == "h100"]
    assert set(GEN_FIT["h100"]["tables"]) <= set(h["table"])
    a = rows[rows["generation"] == "a100"]
    assert set(GEN_FIT["a100"]["tables"]) <= set(a["table"])
    # one Efficiency for every row of a generation, never per row: refitting A100 cannot move an H100 row
    other = validate_all({"a100": Efficiency(gemm_eff_max=0.6)})
    assert np.allclose(other.loc[other["generation"] == "h100", "predicted"],
                       rows.loc[rows["generation"] == "h100", "predicted"])
    assert not np.allclose(other.loc[other["generation"] == "a100", "predicted"],
                           rows.loc[rows["generation"] == "a100", "predicted"])


def test_fitted_gemm_ceiling_stays_under_the_measured_mamf():
    for gen, f in generation_fits().items():
        assert f["values"]["gemm_eff_max"] <= MAMF_FRAC[gen] + 1e-9, gen
        for p, se in f["stderr"].items():  # every fitted number carries its uncertainty
            assert se is not None and np.isfinite(se), (gen, p)


def test_500w_peak_is_the_middle_of_the_stated_bracket():
    """Confounded with the PyTorch GEMM factor in the open data, so fixed at the bracket's middle, not fitted."""
    frac = generation_fits()["h100"]["hardware"][TT500_PARAM]
    assert frac == pytest.approx((835 + 989) / 2 / 989, rel=1e-3)
    assert 0.8 < generation_fits()["h100"]["values"]["torch_gemm_rel"] < 1.0


def test_h100_attention_shape_term_is_the_fa2_kernel_fit_not_a_table_fit():
    """attn_eff_half_work is fixed from FlashAttention-2's published H100 causal forward (not identified by the open
    tables); A100 carries no shape term."""
    fits = generation_fits()
    assert fits["h100"]["values"]["attn_eff_half_work"] == pytest.approx(54_000.0)
    assert "attn_eff_half_work" not in fits["h100"]["stderr"]
    assert Efficiency.for_gpu("a100").attn_eff_half_work == 0.0


def test_h100_peak_outside_the_stated_bracket_is_refused():
    from trainplan.model.base import ConfigError

    with pytest.raises(ConfigError, match="h100_peak_tflops.*835"):
        validate_all(h100_peak_flops=700e12)


def test_fp8_rows_are_modelled_not_excluded(rows):
    fp8 = rows[rows["precision"].astype(str).str.startswith("fp8") & (rows["metric"] != "memory_gib")]
    assert len(fp8) >= 20 and fp8["in_mape"].all()


def test_compile_speedup_matches_torchtitan(rows):
    """Same layout, compile off / on (torchtitan table 1): the kernel class alone sets the ratio."""
    tps = rows[(rows["table"] == "torchtitan_h100") & (rows["metric"] == "tokens_per_s_per_gpu") & rows["in_mape"]]
    t1 = tps[tps["row"].str.startswith("T1 ")]
    eager, compiled = t1[t1["kernels"] == "eager"].iloc[0], t1[t1["kernels"] == "compiled"].iloc[0]
    measured = compiled["published"] / eager["published"]  # 6667 / 5762 = 1.157
    predicted = compiled["predicted"] / eager["predicted"]  # 1.214: +4.9%
    assert abs(predicted / measured - 1) <= 0.05, (predicted, measured)


def test_async_tp_speedup_matches_the_published_pairs(rows):
    """torchtitan async TP vs vanilla TP, bf16 rows: published 1.09 (70B) and 1.10 (8B)."""
    d = rows[(rows["table"] == "torchtitan_asynctp_h100") & rows["in_mape"]]
    for model in ("llama3-70b", "llama3-8b"):
        g = d[d["model"] == model]
        van, asy = g[~g["row"].str.contains("async-tp")].iloc[0], g[g["row"].str.contains("async-tp")].iloc[0]
        measured, predicted = asy["published"] / van["published"], asy["predicted"] / van["predicted"]
        assert predicted > 1.0 and abs(predicted - measured) <= 0.06, (model, predicted, measured)


def test_torchtitan_405b_pipeline_rows_run_the_benchmarked_micro_batching(rows):
    """torchtitan 9dec370 splits the local batch into pp micro-batches (405B T5: 8 of 4 sequences). With that
    split, the interleaved schedule's published gain over 1F1B (128 / 100 tokens/s/GPU) is predicted within 5%;
    with micro-batches of one sequence (32 per step) it was 1.06."""
    t5 = rows[(rows["table"] == "torchtitan_h100") & rows["row"].str.startswith("T5")
              & (rows["metric"] == "tokens_per_s_per_gpu")]
    assert len(t5) == 2 and t5["row"].str.contains("mb=4").all()
    inter = t5[t5["row"].str.contains("interleaved")].iloc[0]
    one = t5[~t5["row"].str.contains("interleaved")].iloc[0]
    measured, predicted = inter["published"] / one["published"], inter["predicted"] / one["predicted"]
    assert predicted == pytest.approx(measured, rel=0.05), (predicted, measured)


def test_llama3_405b_uneven_stages_and_cp16_are_answered(rows):
    d = rows[rows["table"] == "llama3_405b_h100"]
    assert len(d) == 3 and d["in_mape"].all()
    assert d["row"].str.contains("cp16").sum() == 1 and d["row"].str.contains("pp16").all()
    assert not d["note"].str.contains("reject").any()


def test_shipped_fits_are_the_documented_fit():
    """efficiency_fits.json must stay the fit of GEN_FIT (rerun ``python -m trainplan.published.fit --fit --write``)."""
    for gen in GEN_FIT:
        fresh = fit_generation(gen)
        shipped = generation_fits()[gen]
        for p, v in {**fresh["values"], **fresh["hardware"]}.items():
            got = {**shipped["values"], **shipped["hardware"]}[p]
            assert got == pytest.approx(v, rel=0.02, abs=1e-3), (gen, p, got, v)


# Leave one table out per generation (the fit without the table predicts it), shipped in efficiency_fits.json.
# Reached: A100 Megatron 2021 T1 3.4%, T2 (PTD-P) 5.2%, Korthikanti 7.1%, torchtitan A100 2.3%; H100 torchtitan
# 7.3%, async TP 6.9%, Megatron 2024 7.3%, Llama 3 405B 3.4% (issue target: 10% per table; met on both).
HELDOUT_MAPE_TOL_PCT = {"megatron2021_t1": 4.0, "narayanan2021_t2": 6.0, "korthikanti2022_t3_5": 7.5,
                        "torchtitan_a100": 3.0, "torchtitan_h100": 8.25, "torchtitan_asynctp_h100": 7.5,
                        "megatron2024_h100": 7.5, "llama3_405b_h100": 4.0}
# Worst held-out row: H100 19.6% (torchtitan table, Llama 3.1 8B float8 CP8 at 262k, over-predicted), A100 13.6%
# (Korthikanti 530B full recompute). The target is 20%: met.
HELDOUT_WORST_ROW_TOL_PCT = 20.0
# Held-out bias per family class: H100 CP +5.7, FSDP/ZeRO −3.7, PP −3.8, TP +2.5 (issue: ±5; CP misses by 0.7);
# A100 FSDP/ZeRO +2.1, PP +4.8, TP −4.6 (met)
FAMILY_BIAS_TOL_PCT = {"h100": {"CP": 6.0, "FSDP/ZeRO": 4.0, "PP": 4.25, "TP": 3.0},
                       "a100": {"FSDP/ZeRO": 2.5, "PP": 5.0, "TP": 5.0}}


def _heldout_frame():
    out = []
    for gen, f in generation_fits().items():
        out += [dict(r, generation=gen) for r in f["heldout"]]
    return pd.DataFrame(out)


def test_heldout_errors_per_table_and_family():
    h = _heldout_frame()
    assert set(h["table"]) == set(HELDOUT_MAPE_TOL_PCT)
    for table, g in h.groupby("table"):
        assert g["err_pct"].abs().mean() <= HELDOUT_MAPE_TOL_PCT[table], table
    assert h["err_pct"].abs().max() <= HELDOUT_WORST_ROW_TOL_PCT
    fam = family_bias(h.assign(in_mape=True))
    for r in fam.itertuples():
        assert abs(r.bias_pct) <= FAMILY_BIAS_TOL_PCT[r.generation][r.family], r
        e = h[(h["generation"] == r.generation) & (h["family"] == r.family)]["err_pct"].to_numpy(float)
        assert r.bias_se_pct == pytest.approx(e.std(ddof=1) / len(e) ** 0.5), r  # the spread the bias rests on


def test_bias_se_is_the_standard_error_of_the_mean():
    from trainplan.published.fit import bias_se

    assert bias_se([1.0, 3.0]) == pytest.approx(1.0)  # sd (ddof 1) √2 over √2
    assert bias_se([2.0, 2.0, 2.0]) == 0.0
    assert bias_se([5.0]) != bias_se([5.0])  # one value: NaN, no spread to speak of


def test_interval_from_heldout_errors_covers_heldout_rows():
    """Nominal 80% p10–p90 from the other held-out rows' errors of the same family (or generation): measured
    coverage on the held-out rows must be at least 75%."""
    for gen, f in generation_fits().items():
        cov = f["coverage"]
        assert cov["n"] >= 10 and cov["measured"] >= 0.75, (gen, cov)
        again = interval_coverage(_heldout_frame().query("generation == @gen"))
        assert again["measured"] == pytest.approx(cov["measured"]) and again["n"] == cov["n"]


def test_interval_coverage_can_fail():
    """A pool of tiny errors cannot cover rows that miss by 30%: the coverage check is not vacuous."""
    d = pd.DataFrame({"family": ["FSDP/ZeRO"] * 6, "metric": ["tokens_per_s_per_gpu"] * 6,
                      "predicted": [100.0] * 6, "published": [100.0, 100.5, 99.5, 130.0, 70.0, 100.2]})
    assert interval_coverage(d)["measured"] < 0.75


def test_fits_file_is_valid_json_with_every_generation():
    from importlib import resources

    doc = json.loads(resources.files("trainplan").joinpath("data", "efficiency_fits.json").read_text())
    assert set(doc) == set(GEN_FIT)
    for f in doc.values():
        assert {"values", "stderr", "fitted_on", "heldout", "coverage"} <= set(f)


def test_shipped_heldout_rows_are_what_a_refit_gives():
    """Every leave-one-table-out refit, A100 and H100 (`trainplan validate --heldout`, ~25 s on 2 cores): its rows equal the
    shipped ones, which the production intervals, their coverage and the family biases are computed from. Without the
    async-TP table the H100 fit has two minima; from the middle start alone it lands on the higher one, and the
    async-TP rows move by up to 3.4 points (FIT_LOW_START_FRAC)."""
    from trainplan.published.fit import heldout_rows

    fresh = heldout_rows()
    shipped = _heldout_frame()
    assert len(fresh) == len(shipped) and set(fresh["table"]) == set(HELDOUT_MAPE_TOL_PCT)
    key = ["table", "row", "metric", "published"]
    both = fresh.merge(shipped, on=key, suffixes=("", "_shipped"), validate="one_to_one")
    assert len(both) == len(shipped), "a shipped held-out row has no refit row with its table, label and figure"
    worst = (both["err_pct"] - both["err_pct_shipped"]).abs().max()
    assert worst <= 0.05, worst  # rewrite with `python -m trainplan.published.fit --fit --write`


def test_heldout_refits_in_worker_processes_equal_those_in_process():
    """The refits run in parallel by default (spawned workers): the same rows, in the same order, as one by one."""
    from trainplan.published.fit import heldout_rows

    only = ("megatron2021_t1", "torchtitan_h100")
    serial = heldout_rows(only=only, jobs=1)
    pd.testing.assert_frame_equal(heldout_rows(only=only, jobs=2), serial)
    assert list(serial["table"].unique()) == list(only)


def test_validate_heldout_cli_prints_tables_family_bias_and_coverage(capsys, monkeypatch):
    import trainplan.commands.validate as command
    from trainplan.cli import main

    rows = _heldout_frame().assign(in_mape=True, held_out_fit="(shipped)")
    monkeypatch.setattr(command, "heldout_rows", lambda *a, **k: rows)  # the shipped rows: no refit here
    assert main(["validate", "--heldout"]) == 0
    out = capsys.readouterr().out
    assert all(t in out for t in HELDOUT_MAPE_TOL_PCT)
    assert "family class" in out and "nominal 80%" in out
    assert "Tables no fit sees" in out and "nemo_longseq_h100" in out


def test_validate_heldout_jobs_reaches_the_refits_and_bad_values_are_refused(capsys, monkeypatch):
    """`--jobs N` is the refits' worker count (heldout_rows(jobs=N)); 0, a negative count or --jobs without
    --heldout is refused by name before any refit, and so is a bad count through the Python API."""
    import trainplan.commands.validate as command
    from trainplan.cli import main
    from trainplan.model.base import ConfigError
    from trainplan.published.fit import heldout_rows

    rows = _heldout_frame().assign(in_mape=True, held_out_fit="(shipped)")
    seen = []
    monkeypatch.setattr(command, "heldout_rows", lambda *a, **k: seen.append(k.get("jobs")) or rows)
    assert main(["validate", "--heldout", "--jobs", "3"]) == 0 and main(["validate", "--heldout"]) == 0
    assert seen == [3, None]
    capsys.readouterr()
    for argv in (["--heldout", "--jobs", "0"], ["--heldout", "--jobs", "-2"], ["--jobs", "2"]):
        monkeypatch.setattr(command, "heldout_rows", heldout_rows)  # the real one: it must refuse, not refit
        assert main(["validate", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"trainplan: error: jobs={argv[-1]}: "), err
    for bad in (0, 1.5, True, 2048):
        with pytest.raises(ConfigError, match="jobs="):
            heldout_rows(jobs=bad)


def test_fixed_attention_half_work_is_the_fit_of_the_cited_fa2_speeds():
    """attn_eff_half_work is not typed in: it is the refit of FlashAttention-2's published H100 forward speeds
    (data/flashattention2_h100_fwd.csv, FA3 paper Fig. 5), rounded within its standard error, with both head dims'
    speeds within 4% of the fitted curve."""
    from trainplan.published.fit import FA2_H100_ATTN_HALF_WORK, GEN_FIT, fa2_half_work_fit

    f = fa2_half_work_fit()
    assert abs(f["half"] - FA2_H100_ATTN_HALF_WORK) < f["half_se"] < 0.1 * f["half"]
    assert f["max_abs_err"] < 0.04
    assert GEN_FIT["h100"]["fixed"]["attn_eff_half_work"] == FA2_H100_ATTN_HALF_WORK


def test_heldout_checks_report_each_target_with_its_worst_case():
    """The verdict `trainplan validate --heldout` prints, on the shipped held-out rows: H100 meets every target but
    the CP family bias (+5.5% against ±5%); A100 meets its bias and row targets (its table MAPE has no target). The
    checks are not vacuous (a table 30% off fails all but coverage)."""
    h = _heldout_frame().assign(in_mape=True)
    c = heldout_checks(h).set_index(["generation", "check"])
    h100 = c.loc["h100"]
    assert bool(h100.loc["held-out MAPE of every table", "met"]) and bool(h100.loc["every held-out row", "met"])
    assert bool(h100.loc["p10–p90 interval coverage", "met"])
    bias = h100.loc["bias of every family class"]
    assert (bias["met"], bias["worst"], bias["measured"]) == (False, "CP", "+5.5%")
    a100 = c.loc["a100"]
    assert a100.loc["held-out MAPE of every table", "met"] is None
    assert bool(a100.loc["bias of every family class", "met"]) and bool(a100.loc["every held-out row", "met"])
    assert a100.loc["bias of every family class", "worst"] == "PP"
    bad = pd.DataFrame({"generation": "h100", "table": "t", "row": [f"r{i}" for i in range(8)], "family": "TP",
                        "metric": "tokens_per_s_per_gpu", "in_mape": True, "published": 100.0,
                        "predicted": [130.0, 131, 129, 130.5, 129.5, 130.2, 129.8, 130.1]})
    bad["err_pct"] = 100.0 * (bad["predicted"] / bad["published"] - 1.0)
    v = heldout_checks(bad).set_index("check")["met"]
    assert not v["held-out MAPE of every table"] and not v["every held-out row"]
    assert not v["bias of every family class"]


def test_fit_starts_fixed_and_holds_unidentified_parameters_at_their_prior():
    """The fit never starts from the shipped values (it is reproducible from scratch), and a parameter the remaining
    tables cannot see is held at its cited prior, never at the value fitted on the table held out: A100 attn_eff
    without torchtitan_a100 (Megatron 2021/2022 run no flash attention) is FlashAttention-2's 50% of the A100 peak.
    It is not fitted at all: the other parameters come out as a fit without it gives them (left in, its zero Jacobian
    column sent the trust region wandering, and the fit stopped at least_squares' 500-evaluation cap elsewhere)."""
    from trainplan.published.fit import FIT_PRIOR, FIT_START

    tables = ("megatron2021_t1", "korthikanti2022_t3_5")
    held = fit_generation("a100", tables)
    assert held["unidentified"] == ["attn_eff"] and held["values"]["attn_eff"] == FIT_PRIOR["a100"]["attn_eff"]
    assert np.isnan(held["stderr"]["attn_eff"])
    without = fit_generation("a100", tables, tuple(p for p in GEN_FIT["a100"]["params"] if p != "attn_eff"))
    assert without["unidentified"] == [] and without["rmse_log"] == pytest.approx(held["rmse_log"], rel=1e-9)
    for p, v in without["values"].items():
        if p != "attn_eff":
            assert held["values"][p] == pytest.approx(v, rel=1e-6), p
    full = generation_fits()["a100"]
    assert full["values"]["attn_eff"] != FIT_PRIOR["a100"]["attn_eff"] and full["stderr"]["attn_eff"] > 0
    assert "comm_bw_eff" in GEN_FIT["a100"]["params"] and "comm_bw_eff" not in GEN_FIT["h100"]["params"]
    assert set(GEN_FIT["a100"]["params"]) | set(GEN_FIT["h100"]["params"]) <= set(FIT_START)


def test_a_fit_with_nothing_to_fit_says_so():
    """No row of Megatron 2021 Table 1 runs flash attention: fitting attn_eff alone on it is refused by name."""
    with pytest.raises(ConfigError, match="attn_eff: nothing to fit"):
        fit_generation("a100", ("megatron2021_t1",), ("attn_eff",))


def test_narayanan_table2_scores_ptd_and_shows_zero3_out_of_scope(rows):
    """Narayanan 2021 Table 2: the PTD-P rows are scored (an A100 fit table); DeepSpeed 2021's ZeRO-3 rows are shown
    with their error and a reason, not scored: their step time is flat as the GPUs double at a fixed batch, which no
    NCCL bus-bandwidth model gives (the model over-predicts them several-fold; docs/timing-model.md §7.8). The two
    model sizes are the table's own (GPT-3 175B's shape, the 530B row of Table 1)."""
    d = rows[rows["table"] == "narayanan2021_t2"]
    assert len(d) == 12
    ptd, z3 = d[d["row"].str.startswith("PTD")], d[d["row"].str.startswith("ZeRO-3")]
    assert ptd["in_mape"].all() and (ptd["family"] == "PP").all() and ptd["err_pct"].abs().max() < 10
    assert not z3["in_mape"].any() and z3["note"].str.contains("not modelled").all() and (z3["err_pct"] > 40).all()
    for size in (174.6, 529.6):
        assert d[d["row"].str.contains(f"{size}B")]["params_b"].sub(size).abs().max() < 0.05


def test_efficiency_class_defaults_are_the_shipped_a100_fit():
    """The class defaults (which H100 takes membound_eff from) are the A100 fit rounded, not numbers of their own:
    refitting A100 without updating efficiency.py fails here. comm_bw_eff is the exception: its class value is H100's."""
    from trainplan.model.efficiency import Efficiency

    fit = generation_fits()["a100"]["values"]
    for p in GEN_FIT["a100"]["params"]:
        if p != "comm_bw_eff":
            assert getattr(Efficiency(), p) == pytest.approx(fit[p], rel=0.01, abs=2e-3), p  # rounded, no more


def _check_frame(rows: list[tuple[str, str, float]]):
    """A held-out frame of H100 throughput rows: (table, family, error %) each, published 100 tokens/s/GPU."""
    d = pd.DataFrame([{"generation": "h100", "table": t, "row": f"r{i}", "family": f, "in_mape": True,
                       "metric": "tokens_per_s_per_gpu", "published": 100.0, "predicted": 100.0 + e, "err_pct": e}
                      for i, (t, f, e) in enumerate(rows)])
    return heldout_checks(d).set_index("check")["met"]


def test_heldout_checks_judge_the_worst_table_the_largest_error_and_the_largest_bias_by_size():
    """A 30%-too-slow table among good ones fails the checks: the worst table's MAPE (not the best's), the row's
    |error| (an under-prediction counts as much as an over-prediction) and the family's |bias| (−30% is outside ±5%)."""
    good = [("good", "TP", e) for e in (0.5, -0.5, 1.0, -1.0, 0.2, -0.2)]
    slow = [("slow", "PP", e) for e in (-30.0, -31.0, -29.0, -30.5)]
    met = _check_frame(good + slow)
    assert not met["held-out MAPE of every table"]
    assert not met["every held-out row"]
    assert not met["bias of every family class"]


def test_heldout_coverage_check_fails_below_its_target():
    """Tiny errors cannot cover rows that miss by 30%: the coverage verdict says "not met", it does not only print."""
    rows = [("t", "FSDP/ZeRO", e) for e in (0.0, 0.5, -0.5, 30.0, -30.0, 0.2)]
    assert not _check_frame(rows)["p10–p90 interval coverage"]
