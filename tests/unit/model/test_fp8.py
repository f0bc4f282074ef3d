"""FP8 as a planned technique (training.precision fp8-tensorwise | fp8-rowwise): what it changes in the step time,
where it is refused, how it validates against the open FP8 rows, and what the memo's technique table says."""

import re
from dataclasses import replace

import numpy as np
import pytest

from trainplan.model.arch import resolve_model
from trainplan.model.base import ConfigError
from trainplan.model.efficiency import Efficiency
from trainplan.model.hardware import ClusterSpec, resolve_gpu
from trainplan.model.layout import Layout, check_layout
from trainplan.model.timing import fp8_cast_bytes_mb, step_time, te_fp8, te_fp8_cast_bytes
from trainplan.model.training import TrainingSpec

H100 = ClusterSpec(nodes=4, gpus_per_node=8, gpu=resolve_gpu("h100-sxm-80gb"))
A100 = ClusterSpec(nodes=4, gpus_per_node=8, gpu=resolve_gpu("a100-80gb"))
M = resolve_model("llama2-13b")
T = TrainingSpec(seq_len=4096, global_batch=256, kernels="compiled")
LAY = Layout(dp=32, sharding="zero3")


def test_fp8_is_refused_on_a100_with_the_key_and_the_valid_gpus():
    with pytest.raises(ConfigError, match=r"training\.precision.*a100-80gb has no FP8.*h100-sxm-80gb"):
        check_layout(M, A100, replace(T, precision="fp8-tensorwise"), LAY)
    with pytest.raises(ConfigError, match="no FP8"):
        step_time(M, A100, replace(T, precision="fp8-rowwise"), LAY)


def test_cli_precision_flag_and_a100_refusal(capsys):
    from trainplan.cli import main

    args = ["estimate", "--model", "llama2-13b", "--gpus", "32", "--seq-len", "4096", "--global-batch", "256",
            "--kernels", "compiled", "--json"]
    assert main(args + ["--precision", "fp8-tensorwise"]) == 0
    assert main(args + ["--gpu", "a100-80gb", "--precision", "fp8-tensorwise"]) == 2
    err = capsys.readouterr().err
    assert "training.precision" in err and "Traceback" not in err
    # eager FP8 is answered, with a warning that says why it is slow and what to use instead
    assert main([a for a in args if a not in ("--kernels", "compiled")] + ["--precision", "fp8-tensorwise"]) == 0
    err = capsys.readouterr().err
    assert "torchao's FP8 casts run unfused" in err and "--kernels compiled" in err
    assert main(args + ["--precision", "fp8-tensorwise"]) == 0
    assert "unfused" not in capsys.readouterr().err


def test_fp8_speeds_up_gemms_and_keeps_memory():
    from trainplan.model import memory

    eff = Efficiency.for_gpu(H100.gpu)
    b = step_time(M, H100, T, LAY, eff)
    t = step_time(M, H100, replace(T, precision="fp8-tensorwise"), LAY, eff)
    assert t["step_time_s"] < b["step_time_s"]
    assert memory.memory_breakdown(M, H100, replace(T, precision="fp8-tensorwise"), LAY, eff)["total"] == \
        memory.memory_breakdown(M, H100, T, LAY, eff)["total"]
    # FP8 GEMMs at 0.9 of the (2× bf16) FP8 peak: the step still pays attention, norms, the bf16 output layer and
    # the casts, so it stays well above half the bf16 step (the casts themselves: the tests below)
    inf = step_time(M, H100, replace(T, precision="fp8-tensorwise"), LAY, eff.replace(fp8_gemm_eff_tensorwise=0.9))
    assert inf["step_time_s"] > 0.5 * b["step_time_s"]


def test_rowwise_casts_more_than_tensorwise_and_fsdp_fp8_gather_skips_weight_casts():
    tw = replace(T, precision="fp8-tensorwise")
    rw = replace(T, precision="fp8-rowwise")
    f_tw, b_tw = fp8_cast_bytes_mb(M, tw, 4096.0, np.asarray(1), 1.0)
    f_rw, b_rw = fp8_cast_bytes_mb(M, rw, 4096.0, np.asarray(1), 1.0)
    assert b_rw > b_tw
    f0, _ = fp8_cast_bytes_mb(M, tw, 4096.0, np.asarray(1), 0.0)
    assert f0 < f_tw


def test_eager_torchao_casts_run_as_unfused_op_chains_and_cost_more_than_fp8_saves():
    """Without torch.compile each torchao cast is max(abs(x)), .to(float32), / scale, clamp, .to(float8): one
    kernel per op, 33 B per element against the 5 B of the compiled (fused) chain; so eager FP8 loses to eager bf16
    on the default layout, while compiled FP8 beats compiled bf16."""
    from trainplan.model.timing import FP8_CAST_BYTES, FP8_CAST_BYTES_EAGER

    assert (FP8_CAST_BYTES, FP8_CAST_BYTES_EAGER) == (5.0, 33.0)
    tp = np.asarray(1)
    eager, compiled = (replace(T, kernels=k, precision="fp8-tensorwise") for k in ("eager", "compiled"))
    fe, _ = fp8_cast_bytes_mb(M, eager, 4096.0, tp, 0.0)
    fc, _ = fp8_cast_bytes_mb(M, compiled, 4096.0, tp, 0.0)
    assert fe / fc == pytest.approx(33.0 / 5.0)
    eff = Efficiency.for_gpu(H100.gpu)
    lay = Layout(dp=32, sharding="zero2")

    def speedup(t):
        return (step_time(M, H100, t, lay, eff)["tokens_per_s_per_gpu"]
                / step_time(M, H100, replace(t, precision="bf16"), lay, eff)["tokens_per_s_per_gpu"])

    assert speedup(eager) < 1.0 < speedup(compiled)
    # the technique table of an eager study says so, with what torch.compile would give (tensorwise: a gain)
    from trainplan.search.layouts import fp8_technique_rows

    tw = fp8_technique_rows(M, H100, replace(T, kernels="eager"), lay, eff)[0]
    assert tw["verdict"].startswith("costs") and "unfused" in tw["note"]
    assert re.search(r"under torch\.compile .*\(\+\d+\.\d%\)", tw["note"]), tw["note"]


def test_transformer_engine_casts_are_fused_and_its_weights_cast_once_per_step():
    """kernels=fused + tensorwise is Transformer Engine's delayed scaling: no amax pass, cast and transpose in one
    kernel, the norm / activation before three of the four linears write FP8 themselves, weights cast with the
    step's first micro-batch only. torchao's dynamic recipe, at the same fused shapes, moves more bytes."""
    from trainplan.model.memory import layer_matmul_params_per_rank

    te = replace(T, kernels="fused", precision="fp8-tensorwise")
    assert te_fp8(te) and not te_fp8(replace(te, precision="fp8-rowwise")) and not te_fp8(replace(T, precision="fp8-tensorwise"))
    tp = np.asarray(1)
    f, b, w = te_fp8_cast_bytes(M, te, 4096.0, tp)
    ao_f, ao_b = fp8_cast_bytes_mb(M, te, 4096.0, tp, 1.0)
    assert f + b < 0.5 * (ao_f + ao_b)
    assert w == pytest.approx(4.0 * layer_matmul_params_per_rank(M, tp))
    lf, lb, lw = te_fp8_cast_bytes(M, replace(te, finetune="lora"), 4096.0, tp)  # frozen: no wgrad, no transposes
    assert lf < f and lb < b and lw == w
    # once per step: with m micro-batches the FP8 − bf16 compute difference is m·(per micro-batch) + weights,
    # so 2·Δ(m) − Δ(2m) is the weights' cast alone
    eff = Efficiency.for_gpu(H100.gpu)

    def delta(gb: int) -> float:
        lay, t = Layout(dp=8, sharding="zero1"), replace(te, global_batch=gb)
        return (step_time(M, H100, t, lay, eff)["compute_s"]
                - step_time(M, H100, replace(t, precision="bf16"), lay, eff)["compute_s"])

    weights_s = M.layers * w / (H100.gpu.hbm_bw_Bps * eff.membound_eff)
    assert 2 * delta(32) - delta(64) == pytest.approx(weights_s, rel=1e-6)


def test_technique_table_names_the_fp8_stack_of_the_kernel_class():
    from trainplan.search.layouts import fp8_technique_rows

    eff = Efficiency.for_gpu(H100.gpu)
    fused = [r["technique"] for r in fp8_technique_rows(M, H100, replace(T, kernels="fused"), LAY, eff)]
    assert fused == ["FP8 matmuls (tensorwise, Transformer Engine)", "FP8 matmuls (rowwise, torchao Float8)"]
    assert all("torchao" in r["technique"] for r in fp8_technique_rows(M, H100, T, LAY, eff))


@pytest.fixture(scope="module")
def rows():
    from trainplan.published.tables import validate_all

    return validate_all()


def test_fp8_rows_are_scored_and_nemo_is_held_out(rows):
    from trainplan.published.fit import GEN_FIT

    fp8 = rows[rows["precision"].astype(str).str.startswith("fp8") & (rows["metric"] != "memory_gib")]
    assert {"torchtitan_h100", "torchtitan_asynctp_h100", "nemo2407_h100"} <= set(fp8["table"])
    assert "nemo2407_h100" not in GEN_FIT["h100"]["tables"]  # never fitted on: a held-out check
    nemo = rows[rows["table"] == "nemo2407_h100"]
    assert len(nemo) >= 14 and nemo["in_mape"].all()
    assert not nemo["row"].str.contains("Nemotron").any()  # squared-ReLU MLP: not modelled, not scored


# Held-out NeMo 24.07 FP8 tokens/s/GPU: MAPE and bias reached; torchtitan FP8/bf16 speed-up ratios: every pair
# within this many percent of the published ratio. With torchao's casts charged to TE's runs the table scored 16.1%,
# every row under-predicted (bias −16.1%); TE's fused casts (timing.te_fp8_cast_bytes): 7.2%, bias −2.2%; with the LoRA
# rows' adapter GEMMs (timing.lora_adapter_s) 7.6%, −2.6%; with torchtitan's 405B PP rows at their benchmarked
# micro-batching and FSDP2 gathering once per pipelined step (timing.fsdp_pipelined), the refit's FP8 GEMM efficiency
# moved within its standard error (0.792 → 0.757 ± 0.094): 7.9%, −4.6%. The bias bound is the family bar.
NEMO_MAPE_TOL_PCT = 8.0
NEMO_BIAS_TOL_PCT = 5.0
FP8_RATIO_TOL_PCT = 12.0  # reached: every pair within ±10.0%


def test_nemo_fp8_held_out_mape_and_bias(rows):
    nemo = rows[rows["table"] == "nemo2407_h100"]
    assert nemo["err_pct"].abs().mean() <= NEMO_MAPE_TOL_PCT
    assert abs(nemo["err_pct"].mean()) <= NEMO_BIAS_TOL_PCT


def test_fp8_speedup_ratios_against_the_published_pairs(rows):
    from trainplan.published.fit import fp8_speedups

    r = fp8_speedups(rows)
    assert len(r) >= 6 and {"fp8-tensorwise", "fp8-rowwise"} <= set(r["recipe"])
    assert (r["err_pct"].abs() <= FP8_RATIO_TOL_PCT).all(), r.to_string()
    # rowwise is slower than tensorwise on the 8B async-TP rows, as published
    rw = r[(r["recipe"] == "fp8-rowwise") & (r["model"] == "llama3-8b")]
    tw = r[(r["recipe"] == "fp8-tensorwise") & (r["model"] == "llama3-8b")]
    assert (rw["predicted_ratio"].to_numpy() < tw["predicted_ratio"].to_numpy()).all()


def test_technique_table_gets_fp8_rows_for_the_chosen_layout_and_keeps_bf16():
    from trainplan.search.layouts import fp8_technique_rows, technique_verdicts

    eff = Efficiency.for_gpu(H100.gpu)
    extra = fp8_technique_rows(M, H100, T, LAY, eff)
    assert [r["technique"].split(" (")[0] for r in extra] == ["FP8 matmuls", "FP8 matmuls"]
    assert not any(r["used_by_best"] for r in extra)  # bf16 unless the study opts in
    assert all("day-1" in r["note"] and "loss" in r["note"] for r in extra)
    import pandas as pd

    tech = technique_verdicts(pd.DataFrame(columns=["feasible", "tokens_per_s", "layout_text", "sp", "cp", "offload",
                                                    "recompute", "pp_schedule", "micro_batch", "tp_overlap"]),
                              extra)
    assert tech["technique"].str.startswith("FP8").sum() == 2
    assert fp8_technique_rows(M, A100, T, LAY, Efficiency()) == []
