"""Layout search: enumeration, infeasible rows with reasons, ranking, Pareto front, family verdicts."""

import numpy as np
import pandas as pd
import pytest

from trainplan.model.arch import resolve_model
from trainplan.model.base import ConfigError
from trainplan.model.efficiency import Efficiency
from trainplan.model.estimate import estimate
from trainplan.model.hardware import ClusterSpec, resolve_gpu
from trainplan.model.layout import Layout, LayoutTable, layout_problems
from trainplan.model.training import TrainingSpec
from trainplan.search.layouts import (
    HEADROOM_TIE,
    TIE_FRAC,
    enumerate_layouts,
    family_verdicts,
    row_layout,
    search,
    shards_alike,
    shards_alike_mask,
    structural_reasons,
    tie_order,
)

MODEL = resolve_model("llama2-13b")
CLUSTER = ClusterSpec(nodes=4, gpus_per_node=8, gpu=resolve_gpu("h100-sxm-80gb"))
TRAIN = TrainingSpec(seq_len=4096, global_batch=256)
OPTS = {"micro_batch": [1, 2], "recompute": ["none", "full"], "offload": ["none"]}


@pytest.fixture(scope="module")
def df():
    return search(MODEL, CLUSTER, TRAIN, Efficiency.for_gpu(CLUSTER.gpu), OPTS)


def test_every_layout_uses_all_gpus():
    L = enumerate_layouts(CLUSTER, OPTS)
    assert len(L) > 1000 and np.all(L.world_size == CLUSTER.n_gpus)


def test_infeasible_rows_have_reasons_and_structural_reasons_match_specs(df):
    bad = df[~df["feasible"]]
    assert len(bad) > 0 and (bad["reason"].str.len() > 0).all()
    assert (df.loc[df["feasible"], "reason"] == "").all()
    sample = df.sample(200, random_state=0)
    for _, r in sample.iterrows():
        structural = bool(layout_problems(MODEL, CLUSTER, TRAIN, row_layout(r)))
        assert structural == (r["reason"] != "" and not r["reason"].startswith("OOM")), r["layout_text"]


def test_rank_orders_by_throughput_with_ties_and_matches_estimate(df):
    """Rank k is within TIE_FRAC of the fastest layout not ranked before it, and of those the one with the most
    headroom (within HEADROOM_TIE); no layout outranks a clearly (> TIE_FRAC) faster one."""
    from trainplan.search.layouts import HEADROOM_TIE, TIE_FRAC

    feas = df[df["feasible"]].sort_values("rank")
    assert list(feas["rank"]) == list(range(1, len(feas) + 1))
    t, h = feas["tokens_per_s"].to_numpy(), feas["headroom_frac"].to_numpy()
    rest_max = np.maximum.accumulate(t[::-1])[::-1]  # fastest of rank k and below
    assert (t >= (1 - TIE_FRAC) * rest_max - 1e-9).all()
    for k in range(0, len(t), 97):  # the tie window of rank k: nobody in it has clearly more headroom
        window = t[k:] >= (1 - TIE_FRAC) * rest_max[k]
        assert h[k] >= h[k:][window].max() - HEADROOM_TIE - 1e-12
    assert (t[:-1] != t[1:]).any() and (np.diff(t) > 0).any()  # ties did reorder some layouts of this study
    best = row_layout(feas.iloc[0])
    est = estimate(MODEL, CLUSTER, TRAIN, best).to_json()
    assert est["feasible"] and est["tokens_per_s"] == pytest.approx(feas.iloc[0]["tokens_per_s"])
    assert est["memory_gib"]["total"] == pytest.approx(feas.iloc[0]["mem_total_gib"])


def test_a_tie_goes_to_headroom_then_simplicity_not_to_a_hundredth_of_a_percent():
    """A Qwen2.5-7B-shaped study on one node chose ZeRO-1 at 8,004 tokens/s/GPU and 71.1 GiB over ZeRO-2 at 8,003
    and 58.7 GiB (p90 over the HBM): the rank sorted on throughput alone, though the memo says ties go to headroom."""
    from trainplan.search.layouts import tie_order

    t = np.array([8004.3, 8003.1, 7990.0, 7000.0, 6990.0])
    h = np.array([0.107, 0.263, 0.263, 0.300, 0.300])
    c = np.array([1, 1, 0, 2, 0])
    # 8003.1 ties 8004.3 and has 12 GiB more headroom; 7990 ties too with the same headroom and fewer techniques
    assert list(tie_order(t, h, c)) == [2, 1, 0, 4, 3]
    assert list(tie_order(t, h, c, tie=0.0)) == [0, 1, 2, 3, 4]  # no tie band: throughput order
    assert list(tie_order(t[:0], h[:0], c[:0])) == []
    with pytest.raises(ValueError, match="descending"):
        tie_order(t[::-1], h, c)


def _greedy_tie_order(t: np.ndarray, h: np.ndarray, c: np.ndarray, tie: float) -> list[int]:
    """tie_order's rule spelled out, one row at a time: of the rows not yet ranked, those within ``tie`` of the
    fastest; of those, the ones within HEADROOM_TIE of the most headroom; of those, the fewest techniques; the first."""
    left, out = list(range(len(t))), []
    while left:
        band = [i for i in left if t[i] >= (1 - tie) * t[left[0]]]
        top = max(h[i] for i in band)
        band = [i for i in band if h[i] >= top - HEADROOM_TIE]
        j = min(band, key=lambda i: (c[i], i))
        out.append(j)
        left.remove(j)
    return out


@pytest.mark.parametrize("tie", [TIE_FRAC, 0.05])
def test_tie_order_is_the_greedy_rule_on_tied_throughput_headroom_and_techniques(tie):
    """tie_order (one max and one argmin over each band) against the rule written row by row, on 200 random tables
    built to tie: repeated speeds and headrooms 0.5% and 0.1% of HBM apart, so every step meets its tie-breaks."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(1, 120))
        t = np.sort(rng.choice([1.0, 1.001, 1.003, 1.01], n) * rng.choice([1.0, 0.998, 0.9, 0.5], n) * 5000)[::-1]
        h = rng.choice([0.1, 0.105, 0.2, 0.201, 0.3], n)
        c = rng.integers(0, 4, n)
        assert list(tie_order(t, h, c, tie=tie)) == _greedy_tie_order(t, h, c, tie)


@pytest.mark.parametrize(("gain", "first"), [(0.04, "timed"), (0.06, "untimed")])
def test_a_launch_the_model_cannot_time_wins_only_beyond_the_untimed_margin(gain, first):
    """A layout whose launch changes something with no step-time model (torchtitan's all-gather CP for a planned
    Ulysses CP) ranks as UNTIMED_MARGIN (5%) slower: 4% faster as modelled loses to a layout that runs as timed,
    6% faster wins. Whatever the headroom and the number of techniques."""
    from trainplan.search.layouts import LAUNCH_UNTIMED, UNTIMED_MARGIN, ranked

    assert UNTIMED_MARGIN == 0.05
    df = pd.DataFrame([{"name": "untimed", "tokens_per_s": 1000.0 * (1 + gain), "headroom_frac": 0.4,
                        "complexity": 0, LAUNCH_UNTIMED: "all-gather CP"},
                       {"name": "timed", "tokens_per_s": 1000.0, "headroom_frac": 0.1, "complexity": 3,
                        LAUNCH_UNTIMED: ""}])
    assert ranked(df)["name"].iloc[0] == first
    assert ranked(df.drop(columns=LAUNCH_UNTIMED))["name"].iloc[0] == "untimed"  # a plan-only search: as modelled


def test_a_family_that_lost_a_tie_says_so(df):
    """A family whose best layout is up to TIE_FRAC faster than the chosen one but ranked after it (less headroom
    or more techniques) is a tie, not "slower by 0%"."""
    d = df.copy()
    feas = d[d["feasible"]].sort_values("rank")
    best = feas.iloc[0]
    other = feas[feas["family"] != best["family"]].iloc[0]
    d.loc[other.name, ["tokens_per_s", "tokens_per_s_per_gpu"]] = [best["tokens_per_s"] * 1.002,
                                                                   best["tokens_per_s_per_gpu"] * 1.002]
    v = family_verdicts(d).set_index("family")
    assert v.loc[best["family"], "verdict"] == "chosen"
    assert v.loc[other["family"], "verdict"] == "ties"
    line = v.loc[other["family"], "line"]
    assert line.startswith("faster by 0.20% (") and "), a tie on time (under 0.5%): ranked lower on headroom" in line
    assert list(v["rank"].dropna()) == sorted(v["rank"].dropna())  # families in rank order


@pytest.mark.parametrize("b", [Layout(dp=32, sharding="zero3", micro_batch=1),
                               Layout(dp=16, tp=2, sp=True, sharding="hsdp", shard_group=8, recompute="full",
                                      micro_batch=2)])
def test_shards_alike_mask_is_shards_alike_row_by_row_also_from_a_csv(df, b, tmp_path):
    """The vectorised test (check 2's second layout over a study's 40k rows) gives what shards_alike gives on each
    row's Layout, on the search's frame and on its candidates.csv (booleans as the CSV reads them, shard_group
    NaN), and it is not all one answer."""
    path = tmp_path / "c.csv"
    df.to_csv(path, index=False)
    import pandas as pd

    for frame in (df, pd.read_csv(path, keep_default_na=False, dtype={"sp": str})):
        want = np.array([shards_alike(Layout.from_row(r), b) for _, r in frame.iterrows()])
        assert (shards_alike_mask(frame, b) == want).all() and 0 < want.sum() < len(want)


def test_pareto_front_is_non_dominated(df):
    feas = df[df["feasible"]]
    front = feas[feas["pareto"]]
    assert front.iloc[0]["rank"] == 1 or front["rank"].min() == 1
    for _, r in front.iterrows():
        dominated = (feas["tokens_per_s"] > r["tokens_per_s"]) & (feas["headroom_frac"] > r["headroom_frac"])
        assert not dominated.any()
    # ... and complete: every layout off the front is matched or beaten on both axes by one on it
    rest = feas[~feas["pareto"]]
    assert len(front) > 1 and len(rest)
    for _, r in rest.iterrows():
        covered = (front["tokens_per_s"] >= r["tokens_per_s"]) & (front["headroom_frac"] >= r["headroom_frac"])
        assert covered.any(), r["layout_text"]


def test_family_verdicts_one_line_per_family(df):
    v = family_verdicts(df)
    assert set(v["family"]) == set(df["family"])
    assert (v["verdict"] == "chosen").sum() == 1
    assert v["line"].str.len().gt(0).all()
    assert "OOM" in set(v["verdict"])  # plain DDP of a 13B model cannot hold 16 bytes/param on 80 GB


def test_bad_option_names_key():
    with pytest.raises(ConfigError, match="search.tpp"):
        search(MODEL, CLUSTER, TRAIN, Efficiency(), {"tpp": [1]})
    with pytest.raises(ConfigError, match="search.sharding"):
        search(MODEL, CLUSTER, TRAIN, Efficiency(), {"sharding": ["zero9"]})


def test_technique_verdicts_one_line_each_and_families_are_coarse():
    from trainplan.model.arch import MODEL_PRESETS
    from trainplan.model.hardware import ClusterSpec, resolve_gpu
    from trainplan.model.training import TrainingSpec
    from trainplan.search.layouts import family_verdicts, search, technique_verdicts

    c = ClusterSpec(nodes=4, gpus_per_node=8, gpu=resolve_gpu("h100-sxm-80gb"))
    df = search(MODEL_PRESETS["llama2-13b"], c, TrainingSpec(seq_len=4096, global_batch=256))
    fams = family_verdicts(df)
    assert len(fams) <= 20  # sharding (5) × TP (2) × PP (2)
    assert (fams["verdict"] == "chosen").sum() == 1
    assert set(fams["family"]) <= {f"{s}{t}{p}" for s in ("DDP", "ZeRO-1", "ZeRO-2", "FSDP", "HSDP")
                                   for t in ("", "×TP") for p in ("", "×PP")}
    tech = technique_verdicts(df)
    assert {"context parallelism (CP)", "full recompute", "optimizer offload to CPU"} <= set(tech["technique"])
    assert tech["line"].str.len().gt(10).all()


def test_zero2_reduces_every_microbatch():
    """ZeRO-2 keeps a gradient shard only, so its reduce-scatter repeats per micro-batch; ZeRO-1 once per step."""
    import dataclasses

    from trainplan.model.arch import MODEL_PRESETS
    from trainplan.model.efficiency import Efficiency
    from trainplan.model.hardware import ClusterSpec, resolve_gpu
    from trainplan.model.layout import Layout
    from trainplan.model.timing import step_time
    from trainplan.model.training import TrainingSpec

    # A slow network makes the communication visible.
    c = ClusterSpec(nodes=4, gpus_per_node=8, gpu=resolve_gpu("h100-sxm-80gb"), inter_busbw_Bps=1e9)
    eff = dataclasses.replace(Efficiency(), ddp_overlap=0.0)
    m = MODEL_PRESETS["llama2-13b"]
    one = step_time(m, c, TrainingSpec(seq_len=4096, global_batch=32), Layout(dp=32, sharding="zero2"), eff)
    eight = step_time(m, c, TrainingSpec(seq_len=4096, global_batch=256), Layout(dp=32, sharding="zero2"), eff)
    z1 = step_time(m, c, TrainingSpec(seq_len=4096, global_batch=256), Layout(dp=32, sharding="zero1"), eff)
    assert eight["dp_comm_s"] > 4 * one["dp_comm_s"]
    assert z1["dp_comm_s"] < 2 * one["dp_comm_s"]


def test_verdicts_name_the_part_of_compute_that_grows(df):
    """A layout that loses on compute says which part: recompute for rc=full, FSDP's copies for ZeRO-3 at rc=none
    (not "recompute" for a layout that recomputes nothing)."""
    from trainplan.search.layouts import step_time_growth

    feas = df[df["step_time_s"].notna()]  # (timed, fit or not: ZeRO-2 dp32 mb1 rc=none is over the limit)
    pick = {k: feas[(feas["dp"] == 32) & (feas["sharding"] == s) & (feas["recompute"] == rc)
                    & (feas["micro_batch"] == 1)].iloc[0] for k, s, rc in
            (("z2", "zero2", "none"), ("z3", "zero3", "none"), ("z2full", "zero2", "full"))}
    g = step_time_growth(pick["z3"], pick["z2"])
    assert max(g, key=g.get) == "FSDP all-gather copies on the compute stream"
    assert g["recompute"] == 0.0 and sum(g.values()) == pytest.approx(
        pick["z3"]["step_time_s"] - pick["z2"]["step_time_s"])
    g = step_time_growth(pick["z2full"], pick["z2"])
    assert max(g, key=g.get) == "recompute"
    fsdp = family_verdicts(df).set_index("family").loc["FSDP", "line"]
    assert "recompute" not in fsdp or "rc=full" in fsdp


def test_offload_layouts_that_overflow_host_ram_are_infeasible_with_the_reason():
    """The search checks CPU offload against cluster.host_mem_bytes as estimate does: a
    node of 50 GB cannot hold the 52 GB ZeRO-3 share (45 GB cap) but holds the 39 GB ZeRO-2 one; rows agree
    with estimate."""
    from dataclasses import replace

    small = replace(CLUSTER, host_mem_bytes=50 * 10**9)
    opts = {"tp": [1], "pp": [1], "cp": [1], "sharding": ["zero2", "zero3"], "recompute": ["none"],
            "offload": ["cpu"], "micro_batch": [1]}
    df = search(MODEL, small, TRAIN, options=opts)
    z3, z2 = df[df["sharding"] == "zero3"].iloc[0], df[df["sharding"] == "zero2"].iloc[0]
    assert not z3["feasible"] and z3["reason"].startswith("host RAM: CPU offload holds 52 GB per node (8 ranks)")
    assert z2["feasible"], z2["reason"]
    for _, r in df.iterrows():
        assert r["reason"] == estimate(MODEL, small, TRAIN, row_layout(r)).reason


def test_eager_search_leaves_out_async_tp_layouts_and_still_says_why():
    """Under eager kernels every async-TP layout is infeasible ("needs kernels=compiled or fused"): the search leaves
    them out (42% of the default study's candidates were such rows) and the technique table still gets its row from
    impossible_techniques; compiled kernels enumerate and evaluate them."""
    from dataclasses import replace

    from trainplan.search.layouts import (
        ASYNC_TP_NEEDS,
        ASYNC_TP_TECHNIQUE,
        impossible_techniques,
        technique_verdicts,
    )

    eager = search(MODEL, CLUSTER, TRAIN, options=OPTS)
    every = enumerate_layouts(CLUSTER, OPTS)
    assert not eager["tp_overlap"].any() and (every.tp_overlap.sum() > 0)
    assert len(eager) == int((~every.tp_overlap).sum())
    imp = impossible_techniques(CLUSTER, TRAIN, OPTS)
    assert imp == {ASYNC_TP_TECHNIQUE: ASYNC_TP_NEEDS}
    t = technique_verdicts(eager, impossible=imp).set_index("technique")
    assert t.loc[ASYNC_TP_TECHNIQUE, "verdict"] == "not possible here"
    assert t.loc[ASYNC_TP_TECHNIQUE, "line"] == "no layout of this study can use it: " + ASYNC_TP_NEEDS
    assert ASYNC_TP_TECHNIQUE not in set(technique_verdicts(eager)["technique"])  # without it: no row at all
    compiled = replace(TRAIN, kernels="compiled")
    assert impossible_techniques(CLUSTER, compiled, OPTS) == {}
    c = search(MODEL, CLUSTER, compiled, options=OPTS)
    assert len(c) == len(every) and c[c["tp_overlap"]]["feasible"].any()
    assert impossible_techniques(CLUSTER, TRAIN, {**OPTS, "tp": [1]}) == {}  # no TP layout: nothing to overlap


def test_an_infeasible_family_says_why_its_simplest_layout_fails_and_which_batches_would_fit():
    """24 GPUs, global batch 256: no pure data-parallel layout divides the batch. The verdict names dp24's own
    reason (with the nearest global batches that would divide), not the commonest reason in the family (cp=3's
    sequence split, which the user never asked about); the pinned layout's error says the same."""
    c24 = ClusterSpec(nodes=3, gpus_per_node=8, gpu=CLUSTER.gpu)
    d = search(MODEL, c24, TRAIN, Efficiency.for_gpu(c24.gpu), {**OPTS, "shardings": ["zero2"]})
    fam = family_verdicts(d).set_index("family")
    line = fam.loc["ZeRO-2", "line"]
    assert fam.loc["ZeRO-2", "verdict"] == "infeasible"
    assert line.startswith("dp24·tp1·pp1·cp1 zero2") and "dp·micro_batch = 24·1 (the nearest that are: 240, 264)" in line
    assert (d.loc[d["family"] == "ZeRO-2", "reason"].str.contains("2·cp")).any()  # the commonest was another one
    from trainplan.model.layout import Layout
    why = layout_problems(MODEL, c24, TRAIN, Layout(dp=24, sharding="zero2", micro_batch=1))
    assert any("(the nearest that are: 240, 264)" in w for w in why)
    assert (fam["verdict"] == "chosen").sum() == 1 and fam.loc["ZeRO-2", "verdict"] != "chosen"
    # below one sequence per rank there is one nearest multiple, named once
    small = TrainingSpec(seq_len=4096, global_batch=16)
    assert any("(the nearest that are: 24)" in w for w in layout_problems(MODEL, c24, small, Layout(dp=24)))


def test_zero1_and_zero2_over_one_rank_are_listed_once():
    """dp·cp = 1 shards nothing: ZeRO-1/2 there are the unsharded layout (and ZeRO-1 offload is ZeRO-2 offload),
    so a one-GPU study once ranked DDP, ZeRO-1 and ZeRO-2 as three 'tied' layouts. The model agrees they are one."""
    one = ClusterSpec(nodes=1, gpus_per_node=1, gpu=CLUSTER.gpu)
    small, t = resolve_model("llama2-7b"), TrainingSpec(seq_len=4096, global_batch=16, finetune="lora")
    L = enumerate_layouts(one, {**OPTS, "offload": ["none", "cpu"]})
    pairs = set(zip(L.sharding, L.offload, strict=True))
    assert pairs == {("none", "none"), ("zero3", "none"), ("zero2", "cpu"), ("zero3", "cpu")}
    from trainplan.model.layout import Layout
    base = estimate(small, one, t, Layout(dp=1, sharding="none", micro_batch=1)).to_json()
    for sh, off in (("zero1", "none"), ("zero2", "none")):
        e = estimate(small, one, t, Layout(dp=1, sharding=sh, offload=off, micro_batch=1)).to_json()
        assert e["tokens_per_s"] == base["tokens_per_s"] and e["memory_gib"] == base["memory_gib"]
    z1 = estimate(small, one, t, Layout(dp=1, sharding="zero1", offload="cpu", micro_batch=1)).to_json()
    z2 = estimate(small, one, t, Layout(dp=1, sharding="zero2", offload="cpu", micro_batch=1)).to_json()
    assert z1["tokens_per_s"] == z2["tokens_per_s"] and z1["memory_gib"] == z2["memory_gib"]
    # with more than one rank the three stay distinct
    L32 = enumerate_layouts(CLUSTER, OPTS)
    assert {"zero1", "zero2", "none"} <= set(L32.sharding[(L32.dp * L32.cp) > 1])


def test_a_global_batch_that_does_not_divide_over_the_gpus_names_the_nearest_that_does_and_what_it_buys(df):
    """24 GPUs, 256 sequences: the best layout needs PP (dp8·pp3); at 264 (or 240), a layout without PP is >10% faster
    (dp12·cp2 ZeRO-2 in the plan-only search; dp24 ZeRO-2 mb1 before Hugging Face's norms were sized).
    A batch that divides (the default 32 GPUs) gets no alternative."""
    from trainplan.search.layouts import batch_alternative, best_row

    c24 = ClusterSpec(nodes=3, gpus_per_node=8, gpu=CLUSTER.gpu)
    eff = Efficiency.for_gpu(c24.gpu)
    d = search(MODEL, c24, TRAIN, eff, OPTS)
    best = best_row(d[d["feasible"]])
    assert best["dp"] < 24
    alt = batch_alternative(MODEL, c24, TRAIN, eff, OPTS, float(best["tokens_per_s_per_gpu"]))
    assert alt["configured"] == 256 and alt["global_batch"] in (240, 264) and alt["other"] in (240, 264)
    assert "·pp1·" in alt["layout"] and alt["gain_frac"] > 0.10
    at = search(MODEL, c24, TrainingSpec(seq_len=4096, global_batch=alt["global_batch"]), eff, OPTS)
    assert best_row(at[at["feasible"]])["tokens_per_s_per_gpu"] == pytest.approx(alt["tokens_per_s_per_gpu"])
    top = best_row(df[df["feasible"]])
    assert batch_alternative(MODEL, CLUSTER, TRAIN, eff, OPTS, float(top["tokens_per_s_per_gpu"])) is None


def test_mem_scale_tests_the_scaled_peak_and_keeps_the_modelled_columns(df):
    """The sensitivity's memory_x: every modelled peak × mem_scale against max_mem_frac of usable HBM. The winner
    at scale 1 no longer fits once its peak × scale passes 90% of HBM; the memory columns are the model's."""
    hbm = CLUSTER.gpu.hbm_bytes / 2**30
    best = df[df["rank"] == 1].iloc[0]
    scale = 0.9 * hbm / best["mem_total_gib"] * 1.01  # just past the 90% rule for the winner
    s = search(MODEL, CLUSTER, TRAIN, Efficiency.for_gpu(CLUSTER.gpu), OPTS, mem_scale=scale)
    mem = lambda t: t.set_index("layout_text")["mem_total_gib"].sort_index()  # noqa: E731
    assert mem(s).equals(mem(df))
    row = s.set_index("layout_text").loc[best["layout_text"]]
    assert not row["feasible"] and f"× {scale:.3g}, the memory model's error" in row["reason"]
    new = s[s["rank"] == 1].iloc[0]
    assert new["layout_text"] != best["layout_text"] and new["mem_total_gib"] * scale <= 0.9 * hbm
    assert s["feasible"].sum() < df["feasible"].sum()
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="mem_scale"):
            search(MODEL, CLUSTER, TRAIN, None, OPTS, mem_scale=bad)


def test_a_technique_that_needs_tp_or_pp_is_judged_among_the_layouts_that_have_it(df):
    """SP and interleaving only exist with TP and PP: their 'without' is the best TP (PP) layout without them, not the
    best layout overall (tp1·pp1), which made SP read "costs 6%" — the price of TP — where it buys +13% among TP
    layouts."""
    from trainplan.search.layouts import TECHNIQUES, technique_verdicts

    t = technique_verdicts(df).set_index("technique")
    feas = df[df["feasible"]]
    for name, col in (("sequence parallelism (SP)", "tp"), ("interleaved pipeline", "pp")):
        row = t.loc[name]
        base = feas[(feas[col] > 1) & ~TECHNIQUES[name](feas)]
        best = base.sort_values("rank").iloc[0]
        assert row["best_without"] == best["layout_text"] and row["tokens_per_s_per_gpu_without"] == pytest.approx(
            best["tokens_per_s_per_gpu"]), name


@pytest.mark.parametrize("ratio", [1.10, 1.25])
def test_the_memory_fallback_is_what_the_search_chooses_at_that_error(ratio: float):
    """Page 1's day-1 switch and the preflight's (memo.fit_fallback: the candidates that still fit at a memory
    error, reranked) are the layout search(mem_scale=) ranks first, the sensitivity's memory_x flip: one rule.
    Reranking matters: the tie groups of the full ranking are not those of the layouts that still fit."""
    from trainplan.report.memo import fit_fallback

    eff = Efficiency.for_gpu(CLUSTER.gpu)
    d = search(MODEL, CLUSTER, TRAIN, eff)
    feas = d[d["feasible"]]
    chosen = feas.iloc[0].to_dict()
    assert chosen["mem_total_gib"] * ratio > 0.9 * chosen["mem_total_gib"] / (1 - chosen["headroom_frac"])
    fb = fit_fallback(feas, chosen, ratio, 0.9)
    scaled = search(MODEL, CLUSTER, TRAIN, eff, mem_scale=ratio)
    assert fb["layout"] == scaled[scaled["feasible"]].iloc[0]["layout_text"]


def test_a_family_out_of_host_ram_names_its_leanest_layout_and_the_host_ram_limit():
    """405B on one node: FSDP's offload layouts fit HBM but not the node's host RAM. The verdict names the leanest
    layout on HBM and the limit it hits, not a heavier layout's HBM OOM."""
    big = resolve_model("llama3.1-405b")
    c = ClusterSpec(nodes=1, gpus_per_node=8, gpu=CLUSTER.gpu)
    t = TrainingSpec(seq_len=4096, global_batch=16)
    d = search(big, c, t, Efficiency.for_gpu(c.gpu), {**OPTS, "offload": ["none", "cpu"], "shardings": ["zero3"]})
    fam = family_verdicts(d).set_index("family")
    line = fam.loc["FSDP", "line"]
    leanest = d[d["family"] == "FSDP"].sort_values("mem_total_gib").iloc[0]
    assert leanest["reason"].startswith("host RAM") and f"({leanest['layout_text']}) host RAM:" in line


def _case(nodes, gpn, model, layout, **train):
    return nodes, gpn, resolve_model(model), layout, TrainingSpec(**{"seq_len": 4096, "global_batch": 256, **train})


STRUCTURAL_CASES = {  # each breaks exactly one rule of specs.layout_problems
    "valid": _case(4, 8, "llama2-13b", Layout(dp=32)),
    "ffn": _case(5, 8, "llama2-13b", Layout(dp=8, tp=5)),  # heads 40 % 5 == 0, ffn 13824 % 5 != 0
    "tp spans nodes": _case(2, 8, "llama3-70b", Layout(dp=1, tp=16)),
    "fewer micro-batches than stages": _case(4, 8, "llama2-13b", Layout(dp=8, pp=4), global_batch=16),
    "ulysses seq % cp": _case(4, 8, "llama2-13b", Layout(dp=4, cp=8, cp_kind="ulysses"), seq_len=4100),
}


@pytest.mark.parametrize("name", list(STRUCTURAL_CASES))
def test_vectorised_structural_reasons_agree_with_specs_rule_by_rule(name):
    nodes, gpn, model, lay, train = STRUCTURAL_CASES[name]
    c = ClusterSpec(nodes=nodes, gpus_per_node=gpn, gpu=resolve_gpu("h100-sxm-80gb"))
    problems = layout_problems(model, c, train, lay)
    assert bool(problems) == (name != "valid"), problems
    reason = structural_reasons(model, c, train, LayoutTable.from_layouts([lay]))[0]
    assert bool(reason) == bool(problems), (reason, problems)


@pytest.mark.parametrize("seed", range(6))
def test_refit_as_launched_leaves_no_named_layout_unjudged(df, seed):
    """refit_as_launched judges only the layouts the study names (the top ranks, each family's best, each
    technique's best with and without it). Ruling one out moves the tie bands, so a layout never judged could move
    into one of those places (a review built a 6-row case where rank 1 went to a layout needing 200 GiB as
    launched): it repeats until every named layout was judged. Here a launch that cannot fit a pseudo-random 40% of
    the layouts: afterwards every named layout fits as launched."""
    import hashlib

    from trainplan.search.layouts import best_row, refit_as_launched, technique_verdicts

    def bad(text: str) -> bool:
        return hashlib.sha256(f"{seed}:{text}".encode()).digest()[0] < 0.4 * 256

    def peak_of(r):
        return (200.0, "test launch", True) if bad(str(r["layout_text"])) else (None, "", True)

    out = refit_as_launched(df, peak_of, CLUSTER, OPTS, top=3)
    feas = out[out["feasible"]]
    assert len(feas) and list(feas.sort_values("rank")["rank"]) == list(range(1, len(feas) + 1))
    named = set(feas.sort_values("rank")["layout_text"].head(3))
    named |= {str(best_row(g)["layout_text"]) for _, g in feas.groupby("family", sort=False)}
    tech = technique_verdicts(out)
    named |= {t for c in ("best_with", "best_without") for t in tech[c] if isinstance(t, str)}
    assert named and not any(bad(t) for t in named)
    ruled = out[out["reason"].astype(str).str.startswith("OOM as launched (test launch)")]
    assert len(ruled) and all(bad(t) for t in ruled["layout_text"])
