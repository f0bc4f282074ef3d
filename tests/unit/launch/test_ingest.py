"""Measurements flow back: a production step log becomes a RECORD that calibrate reads, and the prediction moves."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from trainplan.calibration.gpu import analytic_record, calibrate_gpu, load_gpu_records, record_specs
from trainplan.launch import ingest
from trainplan.model.arch import resolve_model
from trainplan.model.efficiency import Efficiency
from trainplan.model.hardware import ClusterSpec
from trainplan.model.layout import Layout
from trainplan.model.timing import step_time
from trainplan.model.training import TrainingSpec
from trainplan.proxy.aggregate import record_row
from trainplan.proxy.schema import validate_record

MODEL = resolve_model("llama2-13b")
H100 = "NVIDIA H100 80GB HBM3"


def _log(path: Path, layout: Layout, world: int, nnodes: int, times, *, gb: int = 256, seq: int = 4096,
         peak: float = 60e9, starts=((0, None),)) -> Path:
    """A train_entry-format step log (start + step events); ``starts``: (start_step, resumed_from) per launch."""
    lines = []
    it = iter(enumerate(times, 1))
    bounds = [s for s, _ in starts[1:]] + [len(times)]
    for (start_step, frm), end in zip(starts, bounds, strict=True):
        lines.append({"event": "start", "model_spec": MODEL.to_dict(), "layout": layout.to_dict(), "world_size": world,
                      "nnodes": nnodes, "device": "cuda", "device_name": H100, "backend": "nccl", "dtype": "bf16",
                      "seq_len": seq, "global_batch": gb, "n_params": MODEL.n_params, "start_step": start_step,
                      "resumed_from": frm, "engine": "synthetic"})
        for _ in range(end - start_step):
            i, t = next(it)
            lines.append({"event": "step", "step": i, "loss": 2.0 - 0.001 * i, "step_time_s": float(t),
                          "tokens": gb * seq, "tokens_per_s_per_gpu": gb * seq / t / world, "mfu": None,
                          "peak_mem_bytes": int(peak), "peak_mem_kind": "cuda_max_reserved"})
            if frm is None and starts[1:] and i == starts[1][0]:
                lines.append({"event": "checkpoint", "step": i, "path": f"ckpt/step-{i}", "reason": "stop"})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_step_log_becomes_a_valid_record_that_aggregate_flattens(tmp_path):
    lay = Layout(dp=32, sharding="zero3", recompute="full", micro_batch=1)
    times = [30.0, 12.0, 11.0] + [10.0 + 0.01 * i for i in range(17)]
    rec = ingest.record_from_log(_log(tmp_path / "prod.jsonl", lay, 32, 4, times), warmup=3)
    validate_record(rec)
    assert rec["family"] == "production" and rec["spec"]["device"] == "cuda"
    assert rec["timing"]["step_times_s"][:3] == [30.0, 12.0, 11.0] and rec["spec"]["warmup"] == 3
    assert rec["timing"]["step_time_median_s"] == pytest.approx(10.08)
    assert rec["memory"]["cuda_max_reserved_bytes"] == int(60e9)
    row = record_row(rec)
    assert (row["device"], row["world_size"], row["gpu_name"], row["nnodes"]) == ("cuda", 32, H100, 4)
    assert json.loads(row["step_times_json"]) == times[3:]  # what calibrate_gpu bootstraps over
    # the AdamW kernels: a log that does not name them ran torchtitan's / train_entry's default (fused) ...
    assert rec["spec"]["optimizer_impl"] == row["optimizer_impl"] == "fused"
    assert record_specs(row)[2].optimizer_impl == "fused"
    # ... and train_entry's start event names them, which the prediction then charges
    log = tmp_path / "foreach.jsonl"
    log.write_text("".join(json.dumps({**json.loads(ln), "optimizer_impl": "foreach"}
                                      if '"start"' in ln else json.loads(ln)) + "\n"
                           for ln in (tmp_path / "prod.jsonl").read_text().splitlines()))
    row2 = record_row(ingest.record_from_log(log, warmup=3))
    assert record_specs(row2)[2].optimizer_impl == "foreach"
    assert analytic_record(row2, Efficiency.for_gpu(record_specs(row2)[1].gpu))[0] > \
        analytic_record(row, Efficiency.for_gpu(record_specs(row)[1].gpu))[0]


def test_warmup_is_dropped_after_every_restart(tmp_path):
    lay = Layout(dp=8, sharding="zero3", micro_batch=1)
    times = [50, 10, 10, 10, 10, 10, 40, 10, 10, 10]  # a restart at step 6: its first step is slow again
    log = _log(tmp_path / "r.jsonl", lay, 8, 1, times, gb=64, starts=((0, None), (6, "ckpt/step-6")))
    rec = ingest.record_from_log(log, warmup=1)
    assert sorted(rec["timing"]["step_times_s"][:2]) == [40, 50] and rec["timing"]["step_time_median_s"] == 10
    ok, msg = ingest.check_resume(log)
    assert ok and "restored at step 6" in msg
    ok, msg = ingest.check_resume(_log(tmp_path / "n.jsonl", lay, 8, 1, times, gb=64))
    assert not ok and "start_step is 0" in msg


def test_torchtitan_console_log_is_read_too(tmp_path):
    log = tmp_path / "titan.log"
    log.write_text("\n".join(
        f"[rank0]:[titan] 2026-12-03 10:00:0{i} - root - INFO - step: {i}  loss:  {8 - 0.1 * i:.4f}  grad_norm:  1.0"
        f"  memory: 61.20GiB(77.3%)  tps: {'1,000' if i < 3 else '2,000'}  tflops: 300.1  mfu: 30.34%"
        for i in range(1, 9)))
    lay = Layout(dp=32, sharding="zero3", micro_batch=1)
    rec = ingest.record_from_log(log, model="llama2-13b", layout=lay, seq_len=4096, global_batch=256,
                                 world_size=32, device_name=H100, warmup=2)
    validate_record(rec)
    assert rec["timing"]["step_time_median_s"] == pytest.approx(256 * 4096 / 32 / 2000)
    assert rec["memory"]["cuda_max_reserved_bytes"] == int(61.2 * 2**30) and len(rec["loss"]) == 8


def test_a_slower_production_log_moves_the_prediction(tmp_path):
    """Synthetic production logs 30% slower than the plan → calibrate_gpu fits to them → the production step
    time predicted for the chosen layout moves from the prior to the measurement."""
    eff0 = Efficiency()
    runs = {"prod32": (Layout(dp=32, sharding="zero3", recompute="full", micro_batch=1), 32, 4, 256),
            "node8": (Layout(dp=8, sharding="zero3", recompute="full", micro_batch=1), 8, 1, 64),
            "node8-mb2": (Layout(dp=8, sharding="zero3", recompute="selective", micro_batch=2), 8, 1, 64),
            "node8-noac": (Layout(dp=8, sharding="zero3", recompute="none", micro_batch=1), 8, 1, 64)}
    gpu_dir = tmp_path / "gpu"
    gpu_dir.mkdir()
    rng = np.random.default_rng(0)
    for name, (lay, world, nodes, gb) in runs.items():
        probe = ingest.record_from_log(_log(tmp_path / f"{name}.jsonl", lay, world, nodes, [1.0] * 10, gb=gb))
        pred_s, pred_mem = analytic_record(pd.Series(record_row(probe)), eff0)
        times = pred_s * 1.3 * (1 + 0.01 * rng.standard_normal(20))
        log = _log(tmp_path / f"{name}.jsonl", lay, world, nodes, times, gb=gb, peak=pred_mem * 1.05)
        assert ingest.main([str(log), "--out", str(gpu_dir / f"{name}.json")]) == 0
    records, files = load_gpu_records(gpu_dir)
    assert len(files) == 4
    fit, why = calibrate_gpu(records, eff0, {"bootstrap": 20, "seed": 0})
    assert fit is not None, why
    cluster = ClusterSpec(nodes=4, gpus_per_node=8, gpu="h100-sxm-80gb")
    training = TrainingSpec(seq_len=4096, global_batch=256, attn_impl="flash", sac_policy="matmul",
                            sp_impl="pytorch")
    chosen = runs["prod32"][0]
    before = step_time(MODEL, cluster, training, chosen, eff0)["step_time_s"]
    after = step_time(MODEL, cluster, training, chosen, fit["efficiency"])["step_time_s"]
    measured = float(records.set_index("id").loc["prod32", "step_time_median_s"])
    assert after / before == pytest.approx(1.3, rel=0.03)  # the prediction moved by the measured 30%
    assert abs(after - measured) / measured < 0.02 < abs(before - measured) / measured


def test_day1_throughput_check_exit_codes(tmp_path):
    lay = Layout(dp=8, sharding="zero3", micro_batch=1)
    log = _log(tmp_path / "d.jsonl", lay, 8, 1, [10.0] * 8, gb=64)  # 64·4096/10/8 = 3,277 tokens/s/GPU
    assert ingest.main([str(log), "--min-tokens-per-s-per-gpu", "3000"]) == 0
    assert ingest.main([str(log), "--min-tokens-per-s-per-gpu", "4000"]) == 1
    assert ingest.main([str(tmp_path / "missing.jsonl")]) == 2


@pytest.mark.parametrize(("times", "flags", "says"), [
    ([10.0, 10.0, -1.0, 10.0, 10.0], [], "step 3: step_time_s=-1.0: a positive number"),
    ([10.0, 10.0, 10.0, "fast", 10.0], [], "step 4: step_time_s='fast': a positive number"),
    ([10.0] * 5, ["--warmup", "-1"], "--warmup=-1: an integer ≥ 0"),
    ([10.0] * 5, ["--min-tokens-per-s-per-gpu", "-5"], "--min-tokens-per-s-per-gpu=-5.0: a positive number"),
    ([10.0] * 5, ["--layout", "[1]", "--model", "llama2-13b"], "layout=[1]: a JSON object of layout fields"),
    ([10.0] * 5, ["--layout", "{bad"], "--layout='{bad': layout JSON"),
])
def test_bad_logs_and_flags_are_refused_not_recorded(tmp_path, capsys, times, flags, says):
    """A step log or flag that would poison a calibration record (a negative or non-numeric step time, a negative
    warm-up or threshold, a layout that is no object) exits 2 naming it; no record is written, no traceback."""
    lay = Layout(dp=8, sharding="zero3", micro_batch=1)
    log = _log(tmp_path / "bad.jsonl", lay, 8, 1, [1.0] * len(times), gb=64)
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    for ev in lines:
        if ev["event"] == "step":
            ev["step_time_s"] = times[ev["step"] - 1]
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "rec.json"
    assert ingest.main([str(log), "--out", str(out), "--warmup", "1", *flags]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and not out.exists()


def test_out_must_be_a_writable_file_path(tmp_path, capsys):
    log = _log(tmp_path / "ok.jsonl", Layout(dp=8, sharding="zero3", micro_batch=1), 8, 1, [10.0] * 5, gb=64)
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out in (tmp_path, afile / "x.json"):
        assert ingest.main([str(log), "--out", str(out)]) == 2
        assert "--out=" in capsys.readouterr().err


def _titan_lines(steps, loss=lambda i: 8 - 0.1 * i) -> list[str]:
    return [f"[rank0]:[titan] 2026-12-03 10:00:00 - root - INFO - step: {i}  loss:  {loss(i):.4f}  grad_norm:  1.0"
            f"  memory: 61.20GiB(77.3%)  tps: 2,000  tflops: 300.1  mfu: 30.34%" for i in steps]


def test_torchtitan_day1_checkpoint_log_is_checked_like_train_entrys(tmp_path, capsys):
    """The day-1 checkpoint job under torchtitan writes no steps.jsonl: ``ingest --check-resume`` reads its console
    log: a second launch loaded step-5 and logged steps 6..10 with finite losses."""
    ckpt = "[rank0]:[titan] ... - root - INFO - Loading the checkpoint from /runs/x/checkpoint/step-5."
    good = tmp_path / "job-1.out"
    good.write_text("\n".join([*_titan_lines(range(1, 6)), "Training starts at step 1", ckpt,
                               *_titan_lines(range(6, 11))]))
    assert ingest.check_resume(good) == (True, "restored at step 5 and continued to step 10 (loss 7.4000 first)")
    assert ingest.main(["--check-resume", "--format", "torchtitan", str(good)]) == 0
    assert "checkpoint restore PASS" in capsys.readouterr().out
    none = tmp_path / "none.out"
    none.write_text("\n".join(_titan_lines(range(1, 11))))
    assert ingest.check_resume(none)[0] is False
    gap = tmp_path / "gap.out"
    gap.write_text("\n".join([ckpt, *_titan_lines([7, 8])]))
    assert "not contiguous from 6" in ingest.check_resume(gap)[1]
    nan = tmp_path / "nan.out"
    nan.write_text("\n".join([ckpt, *_titan_lines(range(6, 11), loss=lambda i: float("nan"))]))
    assert ingest.check_resume(nan) == (False, "a loss is not finite")


def _edit(log: Path, keep=lambda ev: True, change=lambda ev: ev) -> Path:
    """The step log with some events dropped (``keep``) or changed (``change``)."""
    lines = [change(ev) for ev in map(json.loads, log.read_text().splitlines()) if keep(ev)]
    log.write_text("".join(json.dumps(ev) + "\n" for ev in lines))
    return log


def test_day1_throughput_check_fails_on_a_non_finite_loss(tmp_path, capsys):
    """Fast enough but a NaN loss: the day-1 throughput check fails (exit 1) and says why."""
    lay = Layout(dp=8, sharding="zero3", micro_batch=1)
    log = _edit(_log(tmp_path / "d.jsonl", lay, 8, 1, [10.0] * 8, gb=64),
                change=lambda ev: {**ev, "loss": float("nan")} if ev.get("step") == 8 else ev)
    assert ingest.main([str(log), "--min-tokens-per-s-per-gpu", "3000"]) == 1
    assert "a loss is not finite" in capsys.readouterr().out


@pytest.mark.parametrize(("keep", "change", "says"), [
    (lambda ev: ev["event"] != "checkpoint", lambda ev: ev, "no checkpoint saved there"),
    (lambda ev: ev.get("step") != 8, lambda ev: ev, "not contiguous"),
    (lambda ev: True, lambda ev: {**ev, "loss": float("nan")} if ev.get("step") == 9 else ev, "not finite"),
])
def test_resume_check_fails_without_the_checkpoint_on_a_gap_or_a_nan_loss(tmp_path, keep, change, says):
    """The day-1 checkpoint check on a train_entry log fails when the second launch resumed at a step no checkpoint
    was saved at, when a step is missing across the restore, or when a loss after it is not finite."""
    times = [10.0] * 10
    lay = Layout(dp=8, sharding="zero3", micro_batch=1)
    log = _log(tmp_path / "r.jsonl", lay, 8, 1, times, gb=64, starts=((0, None), (6, "ckpt/step-6")))
    assert ingest.check_resume(log)[0]
    ok, msg = ingest.check_resume(_edit(log, keep, change))
    assert not ok and says in msg


def _loss_log(path: Path, losses) -> Path:
    """A train_entry step log with these losses (steps 1..n)."""
    lay = Layout(dp=8, sharding="zero3", micro_batch=1)
    lines = [{"event": "start", "model_spec": MODEL.to_dict(), "layout": lay.to_dict(), "world_size": 8, "nnodes": 1,
              "device": "cuda", "device_name": H100, "backend": "nccl", "dtype": "bf16", "seq_len": 4096,
              "global_batch": 64, "n_params": MODEL.n_params, "start_step": 0, "resumed_from": None}]
    lines += [{"event": "step", "step": i, "loss": float(x), "step_time_s": 10.0, "tokens": 64 * 4096}
              for i, x in enumerate(losses, 1)]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_fp8_loss_parity_compares_the_last_quarters_mean(tmp_path, capsys):
    """The FP8 day-1 check (search.layouts.FP8_RISK): the FP8 run's mean loss over the last quarter of its steps
    against a bf16 run's over the same steps. One step's noise does not fail it; a drift of the window's mean does."""
    rng = np.random.default_rng(0)
    n = ingest.LOSS_PARITY_STEPS
    curve = 3.0 * np.exp(-np.arange(n) / 80) + 2.0
    bf16 = _loss_log(tmp_path / "bf16.jsonl", curve + rng.normal(0, 0.05, n))  # per-step noise of ±2.5%
    close = _loss_log(tmp_path / "fp8.jsonl", curve * 1.004 + rng.normal(0, 0.05, n))
    ok, msg = ingest.check_loss_parity(close, bf16)
    assert ok, msg
    assert f"steps {n - n // 4 + 1}–{n}" in msg
    drift = curve.copy()
    drift[n - n // 4:] *= 1.03  # 3% above bf16 over the window
    far = _loss_log(tmp_path / "far.jsonl", drift)
    assert ingest.main([str(far), "--loss-parity", str(bf16)]) == 1
    assert "loss parity FAIL" in capsys.readouterr().out and not ingest.check_loss_parity(far, bf16)[0]
    assert ingest.main([str(far), "--loss-parity", str(bf16), "--max-loss-rel", "0.05"]) == 0
    nan = curve.copy()
    nan[7] = float("nan")
    ok, msg = ingest.check_loss_parity(_loss_log(tmp_path / "nan.jsonl", nan), bf16)
    assert not ok and "run's loss at step 8 is not finite" in msg
    ok, msg = ingest.check_loss_parity(_loss_log(tmp_path / "short.jsonl", curve[:5]), bf16)
    assert not ok and "5 steps in both logs" in msg
    # a run cut short (a stop request) compares a shorter window than promised: --min-steps fails it
    cut = _loss_log(tmp_path / "cut.jsonl", curve[:60])
    assert ingest.check_loss_parity(cut, bf16)[0]  # 60 steps alike
    ok, msg = ingest.check_loss_parity(cut, bf16, min_steps=n)
    assert not ok and f"the run log ends at step 60 of {n}" in msg
    assert ingest.main([str(bf16), "--loss-parity", str(cut), "--min-steps", str(n)]) == 1
    assert ingest.main([str(close), "--loss-parity", str(bf16), "--min-steps", str(n)]) == 0
    assert ingest.main([str(close), "--loss-parity", str(bf16), "--min-steps", "0"]) == 2
    assert ingest.main([str(close), "--loss-parity", str(tmp_path / "missing.jsonl")]) == 2
    assert ingest.main([str(close), "--loss-parity", str(bf16), "--max-loss-rel", "2"]) == 2
    assert "--max-loss-rel=2.0: a fraction in (0, 1)" in capsys.readouterr().err
