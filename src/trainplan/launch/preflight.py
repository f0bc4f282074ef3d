"""One-node preflight: the production layout at full width and reduced depth, checked against the plan.

Before the one 32-GPU job of the quarter starts, run the *depth slice* of the chosen layout on one node
(the production widths, few layers, a few steps) through the proxy harness (``trainplan proxy``, a
subprocess) and compare what it measured with the analytic prediction for exactly that run:

* per-rank parameter / gradient / optimizer bytes vs the planner's ``memory_breakdown`` terms
  (:data:`STATE_REL_TOL`);
* saved activation bytes per decoder layer vs ``memory.saved_activation_bytes_per_layer``
  (:data:`ACT_REL_TOL`);
* CUDA only: peak reserved memory vs the predicted per-GPU total (:data:`PEAK_REL_TOL`); the production run's
  modelled peak times the slice's measured memory error against the HBM headroom limit (the study's
  ``search.max_hbm_frac``, :data:`HEADROOM_FRAC` by default: the same rule the search ranked by); and the median
  step time vs ``timing.step_time`` (:data:`TIME_REL_TOL`).

On CPU the run is at debug size (a tiny model, gloo): it proves the path and the device-independent byte
accounting; its step time says nothing about an H100 and is reported as "not comparable on CPU".
A check whose prediction or measurement is missing fails: a preflight that could not look does not pass.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from trainplan.calibration.gpu import harness_layout, harness_training
from trainplan.io import read_json, write_json
from trainplan.launch.artifacts import DAY1_THROUGHPUT_STEPS, launch_judge, load_inputs, peak_as_launched
from trainplan.model.arch import ModelSpec, resolve_model
from trainplan.model.base import ConfigError
from trainplan.model.estimate import DEFAULT_MAX_MEM_FRAC
from trainplan.model.hardware import ClusterSpec
from trainplan.model.layout import Layout
from trainplan.model.memory import memory_breakdown
from trainplan.model.timing import attention_kernel_rel, step_time
from trainplan.model.training import TrainingSpec
from trainplan.proxy.aggregate import attn_kernel_of
from trainplan.proxy.record import predicted_state_terms
from trainplan.proxy.schema import RUN_DEFAULTS
from trainplan.proxy.torchrun import ALLOC_CONF, allocator_env
from trainplan.report.memo import Judge, fit_fallback, memory_fallback, switch_runner_up
from trainplan.search.layouts import runner_up_row

__all__ = ["ACT_REL_TOL", "HEADROOM_FRAC", "PEAK_REL_TOL", "STATE_REL_TOL", "TIME_REL_TOL", "Check",
           "evaluate", "fallback_line", "format_report", "main", "memory_error_ratio", "preflight_fallback",
           "preflight_layout", "preflight_spec", "production_peak_of", "run_preflight"]

STATE_REL_TOL = 0.02  # state bytes are exact arithmetic; 2% covers FSDP padding of uneven shards
ACT_REL_TOL = 0.10  # saved activations per layer: the planner's closed form vs saved_tensors_hooks
PEAK_REL_TOL = 0.15  # CUDA peak reserved vs predicted total (allocator fragmentation, NCCL buffers)
TIME_REL_TOL = 0.25  # CUDA median step time vs the (calibrated) analytic step time
HEADROOM_FRAC = DEFAULT_MAX_MEM_FRAC  # search.max_hbm_frac's default: the headroom verdict, peak ≤ 90% of usable HBM
CPU_DEBUG_MODEL = "debug"  # the CPU preflight's model (specs.MODEL_PRESETS), at the slice depth
CPU_SEQ_LEN = 128


@dataclass(frozen=True)
class Check:
    """One comparison: PASS, FAIL, NOT_COMPARABLE (reported, not judged) or MISSING (counts as FAIL)."""

    name: str
    measured: float | None
    predicted: float | None
    rel_tol: float | None
    status: str
    note: str = ""

    @property
    def rel_err(self) -> float | None:
        if self.measured is None or not self.predicted:
            return None
        return self.measured / self.predicted - 1.0


def _compare(name: str, measured: Any, predicted: Any, rel_tol: float, note: str = "") -> Check:
    if measured is None or predicted is None:
        what = "measurement" if measured is None else "prediction"
        return Check(name, measured, predicted, rel_tol, "MISSING", f"no {what}" + (f"; {note}" if note else ""))
    m, p = float(measured), float(predicted)
    ok = abs(m - p) <= rel_tol * abs(p) if p else m == 0
    return Check(name, m, p, rel_tol, "PASS" if ok else "FAIL", note)


# ---------------------------------------------------------------------------------------- the slice
def preflight_layout(layout: Layout, world: int) -> tuple[Layout, list[str]]:
    """The layout on ``world`` ranks of one node, as the proxy harness can run it; notes say what changed."""
    notes: list[str] = []
    tp, pp, cp = layout.tp, layout.pp, layout.cp
    if pp > 1:
        notes.append(f"pp={pp} dropped: proxies run dp×tp (a depth slice holds few layers per stage anyway)")
        pp = 1
    if cp > 1:
        notes.append(f"cp={cp} dropped: proxies do not run context parallelism")
        cp = 1
    if world % tp:
        notes.append(f"tp={tp} does not divide the {world} preflight ranks; tp=1")
        tp = 1
    dp = world // tp
    sharding, group = layout.sharding, layout.shard_group
    if sharding == "zero1":
        notes.append("zero1 → zero2: FSDP2 has no optimizer-only sharding")
        sharding = "zero2"
    if sharding == "hsdp" and (group is None or group >= dp or dp % group):
        notes.append(f"hsdp → zero3: on one node of {world} ranks the shard group spans the whole slice")
        sharding, group = "zero3", None
    if sharding == "none" and tp > 1:
        sharding = "zero3"
        notes.append("DDP with tp>1 → zero3 (FSDP2 composes with TP)")
    if layout.offload != "none":
        notes.append("optimizer offload is not proxied; state bytes are checked as if on the GPU")
    out = replace(layout, dp=dp, tp=tp, pp=1, vpp=1, pp_schedule="1f1b", cp=1, sharding=sharding,
                  shard_group=group if sharding == "hsdp" else None, sp=layout.sp and tp > 1, offload="none")
    return out, notes


def preflight_spec(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout, *,
                   device: str = "cuda", layers: int = 2, steps: int = 6, warmup: int = 2, nproc: int | None = None,
                   timeout_s: int = 900) -> tuple[dict[str, Any], list[str]]:
    """The RUN_SPEC of the depth slice (ARCHITECTURE.md) and the notes on how it differs from production."""
    if device not in ("cpu", "cuda"):
        raise ConfigError("device", device, "cpu or cuda")
    if not isinstance(layers, int) or layers < 1:
        raise ConfigError("layers", layers, "a positive integer (depth of the slice)")
    world = nproc or (cluster.gpus_per_node if device == "cuda" else 2)
    lay, notes = preflight_layout(layout, world)
    if device == "cuda":
        slice_model, seq = model.with_layers(layers), training.seq_len
        dtype = "bf16" if training.half else "fp32"
        if training.fp8:
            notes.append(f"{training.precision} runs as bf16: the harness has no FP8 path (same memory: the bf16 "
                         "states stay, FP8 copies are made per GEMM); its step time is judged against bf16's")
    else:
        base = resolve_model(CPU_DEBUG_MODEL)
        slice_model, seq, dtype = base.with_layers(layers), min(CPU_SEQ_LEN, base.max_seq_len), "fp32"
        notes.append(f"CPU: debug model '{CPU_DEBUG_MODEL}' (hidden {base.hidden}) at seq {seq}, fp32, gloo — "
                     "proves the path and the byte accounting, not H100 speed")
        if slice_model.heads % lay.tp or slice_model.kv_heads % lay.tp:
            lay = replace(lay, dp=lay.dp * lay.tp, tp=1, sp=False)
            notes.append("CPU: tp dropped (the debug model's heads do not divide)")
    spec = {"id": f"preflight-{device}-L{layers}", "family": "preflight", "model": slice_model.to_dict(),
            "layout": lay.to_dict(), "seq_len": seq, "global_batch": lay.dp * lay.micro_batch, "steps": steps,
            "warmup": warmup, "nproc_per_node": world, "nnodes": 1, "device": device, "dtype": dtype,
            "finetune": "full" if training.finetune == "full" else "lora", "timeout_s": int(timeout_s)}
    if training.finetune != "full":  # the plan's adapters, not the harness's default rank and targets
        spec.update(lora_rank=training.lora_rank, lora_targets=list(training.lora_targets))
    if training.finetune == "qlora":
        notes.append("QLoRA runs as LoRA (bf16 base weights): the harness has no NF4 path")
    notes.append("one micro-batch per step (grad_accum=1): peak memory does not grow with accumulation")
    return spec, notes


# ------------------------------------------------------------------------------------- evaluation
def _predicted_cuda(record: dict, cluster: ClusterSpec, eff: Any) -> tuple[float, float]:
    """(predicted peak bytes, predicted step seconds) for the slice on one node of this cluster's GPUs, as the proxy
    harness runs it (the GPU check's conventions, ``calibration.gpu.record_specs``): eager kernels (compiled with
    ``compile``), its save-every-matmul SAC and DTensor SP, the attention kernel the run dispatched, autocast over
    fp32 weights where no FSDP runs (dp = 1), no sharding at dp = 1, and the run's fine-tune (LoRA: its rank and
    targets)."""

    spec = record["spec"]
    model, layout = ModelSpec.from_dict(spec["model"]), Layout.from_dict(spec["layout"])
    node = ClusterSpec(nodes=1, gpus_per_node=spec["nproc_per_node"], gpu=cluster.gpu,
                       intra_busbw_Bps=cluster.intra_busbw_Bps, intra_latency_s=cluster.intra_latency_s)
    training = harness_training(seq_len=spec["seq_len"], global_batch=spec["global_batch"], dtype=spec["dtype"],
                                layout=layout, cluster=cluster, compile=bool(spec.get("compile")),
                                attn_kernel=attn_kernel_of(record), model_impl=spec.get("model_impl", "trainplan"),
                                finetune=spec.get("finetune", "full"),  # the adapters count only with LoRA
                                lora_rank=int(spec.get("lora_rank", RUN_DEFAULTS["lora_rank"])),
                                lora_targets=tuple(spec.get("lora_targets", RUN_DEFAULTS["lora_targets"])))
    layout = harness_layout(layout)
    peak = float(memory_breakdown(model, node, training, layout, eff)["total"])
    time_s = float(step_time(model, node, training, layout, eff)["step_time_s"])
    return peak, time_s


def attention_kernel_check(record: dict, planned: str | None) -> Check:
    """Which flash kernel the run's SDPA dispatched (read off its FLOP counter) against the plan's
    ``training.attn_kernel``: reported, not judged. cuDNN where the plan assumed FlashAttention-2 means the plan's
    throughput is low by the measured kernel ratio on the attention share (the Sensitivity table prices it)."""
    ran = attn_kernel_of(record)
    if not ran:
        return Check("attention kernel", None, None, None, "NOT_COMPARABLE",
                     "no flash SDPA op in the run's FLOP count (CPU or the math path)")
    if planned is None or ran == planned:
        return Check("attention kernel", None, None, None, "NOT_COMPARABLE",
                     f"the run dispatched {ran}" + (f", as planned (training.attn_kernel: {planned})" if planned else ""))
    return Check("attention kernel", None, None, None, "NOT_COMPARABLE",
                 f"the run dispatched {ran}; the plan assumed training.attn_kernel: {planned} — the plan's attention "
                 f"time is off by the measured kernel ratio ({attention_kernel_rel('cudnn'):.2f}x cuDNN over FA2); "
                 "the memo's Sensitivity row attention_rate_x prices it")


def evaluate(record: dict, cluster: ClusterSpec, eff: Any = None, planned_attn_kernel: str | None = None,
             max_hbm_frac: float = HEADROOM_FRAC, production_peak: float | None = None) -> tuple[str, list[Check]]:
    """Verdict (PASS/FAIL) and the checks of one preflight RECORD (schema: proxy/schema.py); on CUDA also the
    attention kernel the run dispatched against ``planned_attn_kernel`` (reported, not judged).

    Headroom (CUDA): the production run's modelled peak (``production_peak``, bytes) times the slice's measured
    memory error (reserved ÷ modelled slice peak) must be within ``max_hbm_frac`` of usable HBM (the study's
    ``search.max_hbm_frac``, the rule its search ranked by). A 2-layer slice's own peak is far below any limit;
    what it measures is the model's error, which the full-depth run carries. Without ``production_peak``, the
    slice's own reserved bytes are held to the limit."""
    checks: list[Check] = []
    if record.get("status") != "ok":
        checks.append(Check("run", None, None, None, "FAIL", f"status {record.get('status')}: {record.get('message')}"))
        return "FAIL", checks
    mem, pred = record.get("memory") or {}, record.get("predicted") or {}
    state, source = predicted_state_terms(pred.get("memory"))
    ranks = mem.get("state_bytes_per_rank") or []
    for term, key in (("weights", "params_bytes"), ("gradients", "grads_bytes"), ("optimizer", "optimizer_bytes")):
        measured = max((r.get(key, 0) + (r.get("frozen_params_bytes", 0) if key == "params_bytes" else 0))
                       for r in ranks) if ranks else None
        checks.append(_compare(f"{term} bytes/rank", measured, state.get(term), STATE_REL_TOL,
                               f"max over ranks vs {source}"))
    saved = mem.get("saved_activations") or {}
    checks.append(_compare("saved activations bytes/layer", saved.get("mean_layer_bytes"),
                           (pred.get("memory") or {}).get("activation_bytes_per_layer"), ACT_REL_TOL,
                           "saved_tensors_hooks vs memory.saved_activation_bytes_per_layer"))
    device = record["spec"]["device"]
    median = (record.get("timing") or {}).get("step_time_median_s")
    if device == "cuda":
        peak_pred, time_pred = _predicted_cuda(record, cluster, eff)
        reserved = mem.get("cuda_max_reserved_bytes")
        checks.append(_compare("peak reserved bytes", reserved, peak_pred, PEAK_REL_TOL, "vs memory_breakdown total"))
        limit = max_hbm_frac * cluster.gpu.hbm_bytes
        at_risk, what = reserved, "the slice's reserved bytes"
        if production_peak is not None:
            at_risk = production_peak * reserved / peak_pred if reserved is not None and peak_pred else None
            what = (f"the production run's modelled peak ({production_peak / 2**30:.1f} GiB) × the slice's memory "
                    "error (reserved ÷ modelled)")
        checks.append(Check("peak within headroom", at_risk, limit, None,
                            "MISSING" if at_risk is None else ("PASS" if at_risk <= limit else "FAIL"),
                            f"{what} ≤ {max_hbm_frac:.0%} of {cluster.gpu.name} HBM (search.max_hbm_frac)"))
        checks.append(_compare("median step time s", median, time_pred, TIME_REL_TOL, "vs timing.step_time"))
        checks.append(attention_kernel_check(record, planned_attn_kernel))
    else:
        checks.append(Check("median step time s", median, None, None, "NOT_COMPARABLE",
                            "not comparable on CPU (debug-size model, gloo; says nothing about an H100)"))
    judged = [c for c in checks if c.status != "NOT_COMPARABLE"]
    verdict = "PASS" if judged and all(c.status == "PASS" for c in judged) else "FAIL"
    return verdict, checks


def _fmt(v: float | None, name: str) -> str:
    if v is None:
        return "—"
    if "bytes" in name:
        return f"{v / 2**20:,.3f} MiB" if v < 2**30 else f"{v / 2**30:,.2f} GiB"
    return f"{v:.4g}"


def format_report(verdict: str, checks: Sequence[Check], notes: Sequence[str] = ()) -> str:
    """The human report: one line per check with the numbers, then the verdict."""
    lines = ["trainplan preflight", *[f"  note: {n}" for n in notes]]
    for c in checks:
        err = "" if c.rel_err is None else f" ({c.rel_err:+.1%})"
        tol = "" if c.rel_tol is None else f", tol ±{c.rel_tol:.0%}"
        lines.append(f"  {c.status:<14} {c.name}: measured {_fmt(c.measured, c.name)} vs predicted "
                     f"{_fmt(c.predicted, c.name)}{err}{tol}" + (f" — {c.note}" if c.note else ""))
    lines.append(f"PREFLIGHT {verdict}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- run
def _proxy_command(spec_path: Path, record_path: Path) -> list[str]:
    """``trainplan proxy SPEC --out RECORD`` in this interpreter (no reliance on PATH)."""
    return [sys.executable, "-c", "import sys; from trainplan.cli import main; sys.exit(main())", "proxy",
            str(spec_path), "--out", str(record_path)]


def _run_proxy(cmd: list[str], timeout_s: float) -> tuple[int, str, str]:
    """Run ``trainplan proxy`` and wait for it. SIGINT/SIGTERM/SIGHUP to the preflight are passed on to it
    (it kills its ranks, removes its work folder, writes no record), and once it has exited the preflight
    exits ``128 + signal`` too, judging nothing."""
    import signal
    import threading

    got: list[int] = []
    # the slice runs under the production scripts' allocator setting, so its reserved bytes are theirs
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=allocator_env(os.environ))

    def forward(signum: int, _frame: object) -> None:
        if not got:
            got.append(signum)
            proc.send_signal(signum)

    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    main = threading.current_thread() is threading.main_thread()
    old = {s: signal.signal(s, forward) for s in sigs} if main else {}
    try:
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.terminate()  # the launcher's own SIGTERM path: kill the tree, clean up
            stdout, stderr = proc.communicate()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if got:
        print(f"trainplan preflight: interrupted ({signal.Signals(got[0]).name}); the proxy stopped "
              f"(exit {proc.returncode}), nothing judged", file=sys.stderr)
        raise SystemExit(128 + got[0])
    return proc.returncode, stdout, stderr


def run_preflight(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout,
                  out_dir: str | Path, *, device: str = "cuda", layers: int = 2, steps: int = 6, warmup: int = 2,
                  nproc: int | None = None, eff: Any = None, timeout_s: int = 900,
                  max_hbm_frac: float = HEADROOM_FRAC) -> dict[str, Any]:
    """Run the depth slice through ``trainplan proxy`` and judge it (:func:`evaluate`); writes spec, record,
    preflight.json."""
    out = Path(out_dir)
    spec, notes = preflight_spec(model, cluster, training, layout, device=device, layers=layers, steps=steps,
                                 warmup=warmup, nproc=nproc, timeout_s=timeout_s)
    spec_path, rec_path = out / "preflight_spec.json", out / "preflight_record.json"
    write_json(spec_path, spec)
    rc, stdout, stderr = _run_proxy(_proxy_command(spec_path, rec_path), timeout_s + 120)
    if rec_path.exists():
        record = read_json(rec_path)
    else:
        tail = (stderr or stdout).strip().splitlines()[-3:]
        record = {"status": "error", "message": f"trainplan proxy exited {rc}: " + " | ".join(tail),
                  "spec": spec}
    env = record.get("environment") or {}
    if "alloc_conf" in env:  # what the reserved-bytes check measured under (the launch scripts set ALLOC_CONF)
        same = env["alloc_conf"] == ALLOC_CONF
        notes.append(f"CUDA allocator settings: {env['alloc_conf'] or 'torch defaults'}"
                     + (" (as the launch scripts)" if same else f" (the launch scripts set {ALLOC_CONF})"))
    production_peak, peak_notes = production_peak_of(model, cluster, training, layout, eff)
    notes.extend(peak_notes)
    verdict, checks = evaluate(record, cluster, eff, planned_attn_kernel=training.attn_kernel,
                               max_hbm_frac=max_hbm_frac, production_peak=production_peak)
    result = {"verdict": verdict, "device": device, "notes": notes, "spec": spec,
              "production_layout": layout.to_dict(),
              "thresholds": {"state_rel_tol": STATE_REL_TOL, "act_rel_tol": ACT_REL_TOL,
                             "peak_rel_tol": PEAK_REL_TOL, "time_rel_tol": TIME_REL_TOL,
                             "headroom_frac": max_hbm_frac},
              "checks": [asdict(c) | {"rel_err": c.rel_err} for c in checks]}
    write_json(out / "preflight.json", result)
    return result


def production_peak_of(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout,
                       eff: Any = None) -> tuple[float, list[str]]:
    """(bytes, notes): the modelled peak per GPU of the production run the sbatch starts, which the headroom
    verdict holds to the limit. Where its trainer deviates from the plan (QLoRA as LoRA over a bf16 base,
    torchtitan's gathered K/V, ...: :func:`~trainplan.launch.artifacts.as_launched`), the peak of what it runs,
    not the plan's; the plan's where the memory model cannot size what runs (the notes say which)."""
    peak = float(memory_breakdown(model, cluster, training, layout, eff)["total"])
    launched = launch_judge(model, cluster, training, eff)(layout, step=False)
    ran = peak_as_launched(launched, peak)
    if launched is None:
        return peak, []
    if ran is None:
        return peak, [f"{launched['trainer']} runs what the memory model cannot size ({_changes_text(launched)}); "
                      "headroom judged on the plan's peak"]
    return ran, [f"headroom judged on what {launched['trainer']} runs ({_changes_text(launched)}): modelled "
                 f"peak {ran / 2**30:.1f} GiB, the plan's {peak / 2**30:.1f} GiB"]


def _changes_text(launched: dict[str, Any]) -> str:
    """What an :func:`as_launched` result runs instead of the plan, in its deviations' few words."""
    return "; ".join(launched["changes"])


def memory_error_ratio(checks: Sequence[Check]) -> float | None:
    """The slice's peak reserved memory over its modelled peak (CUDA only): the memory model's error measured on
    the production widths and micro-batch; None without both numbers (a CPU preflight)."""
    c = next((c for c in checks if c.name == "peak reserved bytes"), None)
    return float(c.measured) / float(c.predicted) if c is not None and c.measured and c.predicted else None


def preflight_fallback(candidates: str | Path, mem_ratio: float | None = None,
                       max_hbm_frac: float = HEADROOM_FRAC, judge: Judge | None = None) -> dict[str, Any] | None:
    """The layout to switch to when the preflight fails, from the study's ``candidates.csv``; ``None`` when there
    is none (or no candidates file): no-go, re-plan.

    With a measured memory error above the model (``mem_ratio`` > 1, :func:`memory_error_ratio`): the fastest
    other layout whose modelled peak × ``mem_ratio`` is within ``max_hbm_frac`` of usable HBM, i.e. the
    search's choice had it known the error (the sensitivity's ``memory_x``). Otherwise the memo's day-1 fallback
    (``memo.memory_fallback``: a fixed margin more headroom than the chosen layout). ``judge``
    (:func:`~trainplan.launch.artifacts.launch_judge`): every peak is that of what the launch runs, as on page 1."""
    import pandas as pd  # not at module level: `trainplan preflight --help` stays light

    path = Path(candidates)
    if not path.exists():
        return None
    cand = pd.read_csv(path, low_memory=False)
    ok = cand[cand["feasible"].astype(bool)] if "feasible" in cand else cand.iloc[:0]
    if not len(ok):
        return None
    chosen = ok.sort_values("rank").iloc[0].to_dict()
    if mem_ratio is None or not mem_ratio > 1.0:
        return memory_fallback(ok, chosen, judge)
    fb = fit_fallback(ok, chosen, mem_ratio, max_hbm_frac, judge)  # the memo names the same rule at the p90 error
    if fb and "pin" in fb and {"dp", "tp", "pp", "cp", "sharding"} <= set(ok.columns):
        ru = runner_up_row(ok)
        if ru is not None and str(ru["layout_text"]) == fb["layout"]:  # check 2's runner-up is this switch itself
            fb["switch_is_runner_up"] = True
            fb["second"] = switch_runner_up(ok, chosen, fb, judge)  # what check 2 measures instead, at this error
    return fb


def fallback_line(fallback: dict[str, Any] | None) -> str:
    """What to do after a FAIL, worded as the memo's day-1 check; with how to switch (the overlay that pins the
    layout) where the fallback carries it."""
    if not fallback:
        return "FALLBACK: none with more headroom among the feasible layouts — no-go, re-plan."
    line = _fallback_what(fallback)
    if fallback.get("pin"):
        line += (f" To switch: put `{fallback['pin']}` in a config overlay and rerun the study with it; its launch "
                 "files and preflight follow the pinned layout.")
    if fallback.get("switch_is_runner_up"):
        two = fallback.get("second")
        line += (" This switch is the runner-up that day-1 check 2 would measure"
                 + (f": after it, if the first {DAY1_THROUGHPUT_STEPS} steps run below its p10, measure "
                    f"{two['layout']} instead "
                    f"({abs(two['slower_frac']):.1%} {'slower' if two['slower_frac'] >= 0 else 'faster'} than the "
                    f"switch; the next strategy that fits at ×{fallback['mem_ratio']:.2f}) and keep the faster."
                    if two else f"; no other strategy fits at ×{fallback['mem_ratio']:.2f}: there is nothing else "
                    "to measure."))
    return line


def _fallback_what(fallback: dict[str, Any]) -> str:
    if fallback.get("mem_ratio"):
        r, frac = fallback["mem_ratio"], fallback.get("max_hbm_frac", HEADROOM_FRAC)
        return (f"FALLBACK: the slice reserved {r:.2f}× its modelled peak; at that error the fastest layout within "
                f"{frac:.0%} of usable HBM is {fallback['layout']} ({fallback['mem_total_gib']:.1f} GiB "
                f"modelled, {fallback['mem_expected_gib']:.1f} GiB at ×{r:.2f}, {fallback['slower_frac']:.1%} "
                "slower): switch to it and rerun the preflight; if that fails too, no-go, re-plan.")
    return (f"FALLBACK: switch to {fallback['layout']} ({fallback['mem_total_gib']:.1f} GiB, "
            f"{fallback['headroom_frac']:.0%} headroom, {fallback['slower_frac']:.1%} slower) and rerun the "
            "preflight; if that fails too, no-go, re-plan.")


def _check_run_flags(a: argparse.Namespace) -> None:
    """The slice's run flags, before anything runs: a typo is bad input (exit 2), not a FAIL verdict on disk."""
    for flag, v, low in (("--layers", a.layers, 1), ("--steps", a.steps, 2), ("--warmup", a.warmup, 0),
                         ("--timeout-s", a.timeout_s, 1), ("--nproc", a.nproc, 1)):
        if v is not None and v < low:
            raise ConfigError(flag, v, f"an integer ≥ {low}")
    if a.warmup >= a.steps:
        raise ConfigError("--warmup", a.warmup, f"fewer than --steps={a.steps} (at least one step is timed)")


def main(argv: Sequence[str] | None = None) -> int:
    """``trainplan preflight``: exit 0 on PASS, 1 on FAIL, 2 on bad input."""
    ap = argparse.ArgumentParser(
        prog="trainplan preflight", description="One-node depth-slice run of the chosen layout, checked "
        "against the analytic prediction (memory bytes; step time on CUDA only).",
        epilog="example: trainplan preflight --summary results/analytic/summary.json --config config/config.yaml "
               "--out results/preflight --device cpu")
    ap.add_argument("--summary", required=True, help="analytic summary.json (its 'layout' is used)")
    ap.add_argument("--config", required=True, nargs="+",
                    help="the study config; several files are deep-merged in order (a variant overlay after "
                         "config/config.yaml), or the study's launch/study_config.yaml")
    ap.add_argument("--out", help="output directory (spec, record, preflight.json); default: preflight/ "
                    "beside the summary's analytic/ directory (results/preflight)")
    ap.add_argument("--candidates", help="candidates.csv for the fallback named on FAIL (default: beside --summary)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda on a production node")
    ap.add_argument("--layers", type=int, default=2, help="depth of the slice (default 2)")
    ap.add_argument("--steps", type=int, default=6, help="steps incl. warm-up (default 6)")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up steps not timed (default 2)")
    ap.add_argument("--nproc", type=int, help="ranks (default: GPUs per node on cuda, 2 on cpu)")
    ap.add_argument("--timeout-s", type=int, default=900, help="proxy timeout (default 900)")
    a = ap.parse_args(argv)
    try:
        _check_run_flags(a)
        cfg, model, cluster, training, layout = load_inputs(a.summary, a.config)
        if a.layers > model.layers:
            raise ConfigError("--layers", a.layers, f"at most the model's {model.layers} layers (a depth slice)")
        eff = cfg.efficiency if not isinstance(cfg.efficiency, dict) else None
        out = Path(a.out) if a.out else Path(a.summary).resolve().parent.parent / "preflight"
        if out.exists() and not out.is_dir():
            raise ConfigError("--out", str(out), "a directory (for preflight.json, its spec and record), not a file")
        frac = float(cfg.search.get("max_hbm_frac", HEADROOM_FRAC))
        res = run_preflight(model, cluster, training, layout, out, device=a.device, layers=a.layers,
                            steps=a.steps, warmup=a.warmup, nproc=a.nproc, eff=eff, timeout_s=a.timeout_s,
                            max_hbm_frac=frac)
    except ConfigError as e:
        print(f"trainplan preflight: {e}", file=sys.stderr)
        return 2
    checks = [Check(**{k: v for k, v in c.items() if k != "rel_err"}) for c in res["checks"]]
    print(format_report(res["verdict"], checks, res["notes"]))
    if res["verdict"] == "PASS":
        return 0
    fallback = preflight_fallback(a.candidates or Path(a.summary).parent / "candidates.csv",
                                  mem_ratio=memory_error_ratio(checks), max_hbm_frac=frac,
                                  judge=launch_judge(model, cluster, training, eff))
    write_json(out / "preflight.json", {**res, "fallback": fallback, "fallback_line": fallback_line(fallback)})
    print(fallback_line(fallback))
    return 1


if __name__ == "__main__":
    sys.exit(main())
