"""Cost and schedule: closed forms, price isolation, determinism, targets, config errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trainplan.cost import budget as C
from trainplan.model.base import ConfigError

pytestmark = pytest.mark.timeout(60)
N13B = 13_015_864_320  # Llama-2-13B parameter count (meta-llama/Llama-2-13b-hf config.json; SOURCES.md)
KW = dict(n_gpus=32, n_params=N13B, total_tokens=10e9, d2h_Bps=50e9)


def test_failure_rate_is_derived_from_llama3_inputs():
    rate = C.failure_rate_per_gpu_hour(419, 54, 16384)
    assert rate == pytest.approx(419 / (54 * 24 * 16384))
    assert C.CostInputs().failure_rate_per_gpu_hour == rate
    assert C.job_mtbf_s(rate, 32) == pytest.approx(3600 / (rate * 32))


@pytest.mark.parametrize("c_s,m_s", [(60.0, 3600.0 * 100), (1.0, 1e6), (300.0, 5e4)])
def test_young_daly_matches_closed_form(c_s, m_s):
    assert C.young_daly_interval_s(c_s, m_s) == pytest.approx(math.sqrt(2 * c_s * m_s))


def test_young_daly_interval_minimises_the_first_order_waste():
    c, m = 120.0, 3600.0 * 50
    tau = np.linspace(60, 20000, 20000)
    waste = c / tau + tau / (2 * m)
    assert tau[np.argmin(waste)] == pytest.approx(C.young_daly_interval_s(c, m), rel=0.01)


def test_checkpoint_bytes_and_stall_sync_vs_async():
    b = C.checkpoint_bytes(N13B, 16)
    assert b == 16 * N13B
    sync = C.checkpoint_stall_s(b, 5e9, 32, 50e9, async_=False)
    asyn = C.checkpoint_stall_s(b, 5e9, 32, 50e9, async_=True)
    assert sync == pytest.approx(b / 5e9) and asyn == pytest.approx(b / 32 / 50e9) and asyn < sync


def test_a_checkpoint_holds_what_the_fine_tune_saves():
    """Full fine-tune: fp32 weights + Adam m, v = 12 B/param (gradients are never saved; DeepSpeed's bf16 copy: 14);
    LoRA/QLoRA: the frozen base weights, 4 B/param as fp32 shards."""
    full, lora = C.CostInputs.from_config({}), C.CostInputs.from_config({}, "lora")
    assert (full.bytes_per_param, full.bytes_per_param_range) == (12.0, (12.0, 14.0))
    assert (lora.bytes_per_param, lora.bytes_per_param_range) == (4.0, (2.0, 4.0))
    assert C.CostInputs.from_config({}, "qlora").bytes_per_param == 4.0
    with pytest.raises(ConfigError, match="training.finetune"):
        C.CostInputs.from_config({}, "dora")
    kw = dict(n_gpus=32, n_params=N13B, total_tokens=1e10, d2h_Bps=50e9)
    assert C.schedule(5000.0, inputs=full, **kw)["checkpoint_gb"] == pytest.approx(12 * N13B / 1e9)
    assert C.schedule(5000.0, inputs=lora, **kw)["checkpoint_gb"] == pytest.approx(4 * N13B / 1e9)


def test_an_async_checkpoint_being_written_is_lost_work_too():
    base = dict(train_s=1000.0, startup_s=0.0, eval_frac=0.0, stall_s=1.0, interval_s=100.0, mtbf_s=1e4, restart_s=10.0)
    w0, w1 = C.wall_clock_s(**base), C.wall_clock_s(**base, unsaved_s=40.0)
    work = 1000.0 * (1 + 1.0 / 100.0)
    assert w0 == pytest.approx(work / (1 - (50.0 + 10.0) / 1e4))
    assert w1 == pytest.approx(work / (1 - (50.0 + 40.0 + 10.0) / 1e4))


def test_wall_clock_without_failures_or_overheads_is_train_time():
    w = C.wall_clock_s(1000.0, startup_s=0.0, eval_frac=0.0, stall_s=0.0, interval_s=100.0, mtbf_s=np.inf,
                       restart_s=0.0)
    assert w == pytest.approx(1000.0)


def test_schedule_train_time_is_tokens_over_throughput():
    s = C.schedule(4000.0, inputs=C.CostInputs(), **KW)
    assert s["train_h"] == pytest.approx(10e9 / (4000 * 32) / 3600)
    assert s["wall_h"] > s["train_h"] and 0 < s["goodput"] < 1


def _run(price=3.0, seed=0, **cfg):
    inputs = C.CostInputs.from_config({"price_per_gpu_hour_usd": price, **cfg})
    return C.cost_and_risk((3200.0, 3600.0, 3900.0), inputs=inputs, seed=seed, n_samples=2000,
                           targets={"window_h": 72, "budget_usd": 15000, "min_tokens_per_s_per_gpu": 4000}, **KW)


def _strip_dollars(d):
    if isinstance(d, dict):
        return {k: _strip_dollars(v) for k, v in d.items() if "usd" not in k and "price" not in k}
    return d


def test_changing_only_the_price_changes_only_dollar_outputs():
    a, b = _run(price=3.0), _run(price=5.0)
    assert _strip_dollars(a) == _strip_dollars(b)
    assert b["point"]["usd"] == pytest.approx(a["point"]["usd"] * 5 / 3)
    assert b["intervals"]["usd"]["p50"] > a["intervals"]["usd"]["p50"]


def test_deterministic_with_a_seed():
    assert _run(seed=3) == _run(seed=3)
    assert _run(seed=3)["intervals"]["wall_h"] != _run(seed=4)["intervals"]["wall_h"]


def test_intervals_are_ordered_and_targets_have_verdicts():
    r = _run()
    for q in r["intervals"].values():
        assert q["p10"] <= q["p50"] <= q["p90"]
    t = r["targets"]
    assert t["throughput"]["verdict"] == "fail"  # 3600 < 4000 at p50
    assert t["deadline"]["verdict"] == "pass" and t["deadline"]["margin_frac"] > 0


def test_slower_storage_with_sync_checkpoints_costs_more():
    fast = _run(checkpoint_write_GBps=20.0, checkpoint_async=False)
    slow = _run(checkpoint_write_GBps=2.0, checkpoint_async=False)
    assert slow["point"]["wall_h"] > fast["point"]["wall_h"]


def test_lognormal_through_quantiles_reproduces_them():
    z = np.random.default_rng(0).standard_normal(200_000)
    s = C.lognormal_from_quantiles(80.0, 100.0, 130.0, z)
    assert np.quantile(s, [0.1, 0.5, 0.9]) == pytest.approx([80, 100, 130], rel=0.01)


@pytest.mark.parametrize("cfg,key", [
    ({"price_per_gpu_hour_usd": -1}, "cost.price_per_gpu_hour_usd"),
    ({"price_per_gpu_hour_usd": 3.0, "price_range_usd": [4.0, 6.0]}, "cost.price_range_usd"),
    ({"price_per_gpu_hour_usd": 3.0, "failures": {"interruptions": 1, "days": 0, "gpus": 8, "source": "x"}},
     "cost.failures"),
    ({"price_per_gpu_hour_usd": 3.0, "checkpoint_write_GBps": 0}, "cost.checkpoint_write_GBps"),
])
def test_bad_cost_config_names_the_key(cfg, key):
    with pytest.raises(ConfigError) as e:
        C.CostInputs.from_config(cfg)
    assert e.value.key == key


def test_duration_text_reads_like_a_person():
    from trainplan.cost.budget import duration_text

    assert duration_text(0.3384) == "20 min" and duration_text(0.99) == "59 min"
    assert duration_text(1.0) == "1.0 h" and duration_text(18.26) == "18.3 h"


def test_point_usd_is_the_point_cost_at_another_throughput_and_fp8_is_priced_with_it():
    """cost.json's detail rebuilds the point schedule: at the p50 throughput it is cost.json's point cost; at
    1.25× the throughput the saving is less than 20% of the cost (start-up does not scale), which the memo's FP8
    sentence now states (it scaled the whole p50 cost)."""
    import pandas as pd

    from trainplan.report.memo import _techniques

    inputs = C.CostInputs()
    res = C.cost_and_risk((4500.0, 5000.0, 5600.0), n_gpus=32, n_params=N13B, total_tokens=1e10, d2h_Bps=50e9,
                          inputs=inputs)
    doc = C.memo_cost(res, inputs)
    assert C.point_usd(res, 5000.0) == pytest.approx(res["point"]["usd"], rel=1e-12)
    faster = C.point_usd(res, 6250.0)
    assert faster < res["point"]["usd"] and res["point"]["usd"] - faster < 0.2 * res["point"]["usd"]
    assert C.point_usd({}, 5000.0) is None
    tech = pd.DataFrame([{"technique": "FP8 matmuls (tensorwise, torchao Float8)", "used_by_best": False,
                          "delta_frac": 0.25, "verdict": "buys +25.0%"}])
    (row,) = _techniques(tech, doc)
    assert row["fp8_saved_usd"] == pytest.approx(res["point"]["usd"] - faster)
    used = _techniques(tech.assign(used_by_best=True), doc)[0]
    assert used["fp8_saved_usd"] == pytest.approx(C.point_usd(res, 4000.0) - res["point"]["usd"])


def test_an_fp8_recipe_the_plan_does_not_run_is_priced_against_the_plan_not_bf16():
    """With one FP8 recipe opted in, the other recipe's change is measured against bf16 on the same layout, but the
    p50 throughput is the opted-in recipe's: its cost is the plan's at that recipe's own throughput (the fp8 study's
    rowwise row was priced at the p50 × its bf16 ratio, $273 instead of $669 over the plan)."""
    import pandas as pd

    from trainplan.report.memo import _techniques

    inputs = C.CostInputs()
    res = C.cost_and_risk((6800.0, 7465.0, 8500.0), n_gpus=32, n_params=N13B, total_tokens=1e10, d2h_Bps=50e9,
                          inputs=inputs)
    doc = C.memo_cost(res, inputs)
    tech = pd.DataFrame([
        {"technique": "FP8 matmuls (tensorwise, torchao Float8)", "used_by_best": True, "delta_frac": 7465 / 5832 - 1,
         "tokens_per_s_per_gpu_with": 7465.0, "tokens_per_s_per_gpu_without": 5832.0, "verdict": "buys +28.0%"},
        {"technique": "FP8 matmuls (rowwise, torchao Float8)", "used_by_best": False, "delta_frac": 4703 / 5832 - 1,
         "tokens_per_s_per_gpu_with": 4703.0, "tokens_per_s_per_gpu_without": 5832.0, "verdict": "costs 19.3%"}])
    used, other = _techniques(tech, doc)
    assert used["fp8_vs_plan"] is None
    assert used["fp8_saved_usd"] == pytest.approx(C.point_usd(res, 5832.0) - res["point"]["usd"])
    assert other["fp8_vs_plan"] == pytest.approx(4703 / 7465 - 1)
    assert other["fp8_saved_usd"] == pytest.approx(res["point"]["usd"] - C.point_usd(res, 4703.0))
    # without an opted-in recipe both are against bf16, which is then the plan
    (row,) = _techniques(tech.iloc[[1]].assign(used_by_best=False), doc)
    assert row["fp8_vs_plan"] is None
    assert row["fp8_saved_usd"] == pytest.approx(res["point"]["usd"] - C.point_usd(res, 7465.0 * 4703 / 5832))


def test_checkpoint_interval_is_young_daly_but_never_shorter_than_a_write():
    """Sync: the stall is the write, so τ = sqrt(2·C·M) (≫ C). Async: the stall is only the D2H copy, so Young/Daly
    would checkpoint before the last write finished; the interval is then the write time."""
    sync = C.CostInputs.from_config({"checkpoint_async": False})
    s = C.schedule(4000.0, inputs=sync, **KW)
    yd = C.young_daly_interval_s(s["checkpoint_stall_s"], s["job_mtbf_h"] * C.HOUR)
    assert s["checkpoint_interval_h"] * C.HOUR == pytest.approx(yd) and yd > s["checkpoint_write_s"]
    slow_async = C.CostInputs.from_config({"checkpoint_async": True, "checkpoint_write_GBps": 0.01})
    a = C.schedule(4000.0, inputs=slow_async, **KW)
    assert C.young_daly_interval_s(a["checkpoint_stall_s"], a["job_mtbf_h"] * C.HOUR) < a["checkpoint_write_s"]
    assert a["checkpoint_interval_h"] * C.HOUR == pytest.approx(a["checkpoint_write_s"])


def test_schedule_charges_an_async_checkpoint_in_flight_as_lost_work():
    i = C.CostInputs.from_config({"checkpoint_async": True})
    s = C.schedule(4000.0, inputs=i, **KW)
    kw = dict(startup_s=i.startup_s, eval_frac=i.eval_frac, stall_s=s["checkpoint_stall_s"],
              interval_s=s["checkpoint_interval_h"] * C.HOUR, mtbf_s=s["job_mtbf_h"] * C.HOUR, restart_s=i.restart_s)
    train = s["train_h"] * C.HOUR
    with_write = C.wall_clock_s(train, **kw, unsaved_s=s["checkpoint_write_s"])
    assert s["wall_h"] * C.HOUR == pytest.approx(with_write)
    assert with_write > C.wall_clock_s(train, **kw)


def test_expected_failures_are_over_the_wall_clock_not_the_training_time():
    s = C.schedule(4000.0, inputs=C.CostInputs(), **KW)
    assert s["expected_failures"] == pytest.approx(s["wall_h"] / s["job_mtbf_h"], rel=1e-9)


@pytest.mark.parametrize("p50,p90,verdict", [(10.0, 11.0, "pass"), (10.0, 13.0, "at risk"), (13.0, 14.0, "fail")])
def test_deadline_and_budget_pass_only_at_the_pessimistic_p90(p50, p90, verdict):
    res = {"intervals": {"wall_h": {"p10": 9.0, "p50": p50, "p90": p90},
                         "usd": {"p10": 9.0, "p50": p50, "p90": p90}},
           "tokens_per_s_per_gpu": {"p10": 1.0, "p50": 2.0, "p90": 3.0}}
    t = C.check_targets(res, {"window_h": 12.0, "budget_usd": 12.0})
    assert t["deadline"]["verdict"] == verdict and t["budget_usd"]["verdict_usd"] == verdict


@pytest.mark.parametrize("p10,p50,verdict", [(4100.0, 4500.0, "pass"), (3900.0, 4500.0, "at risk"),
                                              (3500.0, 3900.0, "fail")])
def test_throughput_target_passes_only_at_the_pessimistic_p10(p10, p50, verdict):
    res = {"intervals": {}, "tokens_per_s_per_gpu": {"p10": p10, "p50": p50, "p90": 5000.0}}
    assert C.check_targets(res, {"min_tokens_per_s_per_gpu": 4000})["throughput"]["verdict"] == verdict


def test_negative_interruptions_are_a_config_error():
    with pytest.raises(ConfigError) as e:
        C.CostInputs.from_config({"failures": {"interruptions": -1, "days": 10, "gpus": 8, "source": "x"}})
    assert e.value.key == "cost.failures"
