"""Measurements flow back: a trainer's step log becomes a calibration RECORD that ``calibrate`` reads.

``trainplan ingest LOG --out data/calibration/gpu/NAME.json`` turns

* the JSON-lines step log of :mod:`trainplan.train_entry` (one ``start`` event describing model, world, layout
  and device; one ``step`` event per optimizer step: loss, step time, tokens, peak memory), or
* a torchtitan console log (its metric lines ``step: N loss: X ... memory: G GiB ... tps: T ... mfu: M%``; the
  model and layout then come from ``--model`` / ``--layout``)

into a proxy RECORD (``docs/proxy-record.md``, schema ``trainplan.proxy.schema.RECORD_SCHEMA``; family
``production``): ``spec`` (model, layout, seq_len, global batch, device, dtype), ``environment`` (device name,
world size), ``timing`` (every step time; the first ``--warmup`` steps of each launch are warm-up), ``loss``,
``memory.cuda_max_reserved_bytes`` (CUDA runs), the analytic model FLOPs beside it. Put it in
``calibration.gpu_records_dir`` (``data/calibration/gpu/`` by default) and rerun: ``calibrate_gpu`` fits the
efficiencies to it together with the GPU proxies, and the production prediction moves.

``--min-tokens-per-s-per-gpu X`` makes it the day-1 throughput check (exit 1 below X or on a non-finite loss);
``--check-resume`` the day-1 checkpoint check (a second launch started where a checkpoint left off, the steps
are contiguous, the losses finite); ``--loss-parity REF`` the FP8 study's day-1 loss check (:func:`check_loss_parity`:
this log's loss against a bf16 run's from the same weights and data, REF).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainplan.io import write_json
from trainplan.model.arch import ModelSpec, resolve_model
from trainplan.model.base import ConfigError
from trainplan.model.flops import model_train_step_flops
from trainplan.model.layout import Layout
from trainplan.proxy.schema import validate_record
from trainplan.search.layouts import FP8_LOSS_MAX_REL, FP8_LOSS_STEPS

__all__ = ["LOSS_PARITY_MAX_REL", "LOSS_PARITY_STEPS", "check_loss_parity", "check_resume", "main", "parse_torchtitan_log", "read_step_log", "record_from_log"]

DEFAULT_WARMUP = 3  # steps after each (re)start that are not timed: allocator warm-up, first collectives
# The FP8 day-1 loss check's steps and tolerance (search.layouts.FP8_RISK states them)
LOSS_PARITY_STEPS = FP8_LOSS_STEPS
LOSS_PARITY_MAX_REL = FP8_LOSS_MAX_REL


def read_step_log(path: str | Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(start events, step events) of a train_entry JSON-lines log, in file order (each step tagged ``segment``)."""
    starts: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            raise ConfigError(f"{path}:{n}", line[:60], "a JSON object per line (a train_entry step log)") from None
        if not isinstance(ev, dict):
            continue
        if ev.get("event") == "start":
            starts.append(ev)
        elif ev.get("event") == "step":
            steps.append({**ev, "segment": max(0, len(starts) - 1)})
    return starts, steps


_TT = re.compile(r"step:\s*(?P<step>\d+).*?loss:\s*(?P<loss>[-+]?(?:nan|inf)|[-+0-9.eE]+)"
                 r"(?:.*?memory:\s*(?P<mem>[0-9.]+)\s*GiB)?(?:.*?tps:\s*(?P<tps>[0-9,]+))?"
                 r"(?:.*?mfu:\s*(?P<mfu>[0-9.]+)%)?")


def log_format(path: str | Path, fmt: str = "auto") -> str:
    """``fmt``, or for auto what the log is: JSON lines (train_entry's steps.jsonl) or a torchtitan console log."""
    if fmt != "auto":
        return fmt
    return "jsonl" if Path(path).read_text(encoding="utf-8", errors="replace").lstrip().startswith("{") else "torchtitan"


def parse_torchtitan_log(path: str | Path) -> list[dict[str, Any]]:
    """Step events from torchtitan's metric lines (rank 0 console). Step time = tokens per rank ÷ tps is not
    recoverable without the batch, so ``tps`` (tokens/s per GPU) is kept and converted by the caller."""
    return _titan_steps(Path(path).read_text(encoding="utf-8", errors="replace"))


def _titan_steps(text: str) -> list[dict[str, Any]]:
    """The step events of torchtitan console text (:func:`parse_torchtitan_log`'s parser)."""
    out = []
    seg = 0
    for line in text.splitlines():
        if "Training starts at step" in line or "Loading the checkpoint" in line:
            seg += 1 if out else 0
        m = _TT.search(line)
        if not m or "tps" not in line:
            continue
        out.append({"event": "step", "step": int(m["step"]), "loss": float(m["loss"]),
                    "tokens_per_s_per_gpu": float(m["tps"].replace(",", "")) if m["tps"] else None,
                    "mfu": float(m["mfu"]) / 100 if m["mfu"] else None,
                    "peak_mem_bytes": int(float(m["mem"]) * 2**30) if m["mem"] else None,
                    "peak_mem_kind": "cuda_max_reserved", "segment": seg})
    return out


def _timed(steps: list[dict[str, Any]], warmup: int) -> tuple[list[float], list[float]]:
    """(warm-up step times, timed step times): the first ``warmup`` steps of every launch are warm-up."""
    warm, timed = [], []
    seen: dict[int, int] = {}
    for s in steps:
        k = seen.get(s["segment"], 0)
        seen[s["segment"]] = k + 1
        (warm if k < warmup else timed).append(float(s["step_time_s"]))
    return warm, timed


def _pct(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    return ys[min(len(ys) - 1, max(0, round(q * (len(ys) - 1))))]


def _positive(v: Any, key: str, step: dict[str, Any]) -> float:
    """A step's measured value as a positive finite float, or a ConfigError naming the step and the key."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        x = math.nan
    if isinstance(v, bool) or not (math.isfinite(x) and x > 0):
        raise ConfigError(f"step {step.get('step', '?')}: {key}", v, "a positive number (seconds or tokens/s)")
    return x


def record_from_log(path: str | Path, *, record_id: str | None = None, warmup: int = DEFAULT_WARMUP,
                    model: str | ModelSpec | None = None, layout: Layout | dict | None = None,
                    device_name: str | None = None, fmt: str = "auto", seq_len: int | None = None,
                    global_batch: int | None = None, world_size: int | None = None) -> dict[str, Any]:
    """A RECORD (schema_version 1, family ``production``) from a step log; see the module docstring."""

    p = Path(path)
    kind = log_format(p, fmt)
    start: dict[str, Any] = {}
    if kind == "jsonl":
        starts, steps = read_step_log(p)
        start = starts[0] if starts else {}
    else:
        steps = parse_torchtitan_log(p)
    if not steps:
        raise ConfigError("log", str(p), "no step events (train_entry JSON lines or torchtitan metric lines)")
    mspec = (resolve_model(model) if model is not None else
             ModelSpec.from_dict(start["model_spec"]) if start.get("model_spec") else
             resolve_model(start["model_config"]) if start.get("model_config") else None)
    if mspec is None:
        raise ConfigError("model", None, "the log has no model_spec: pass --model (preset or config.json)")
    if layout is not None and not isinstance(layout, Layout | dict):
        raise ConfigError("layout", layout, "a JSON object of layout fields, e.g. '{\"dp\": 32, \"sharding\": \"zero3\"}'")
    lay_d = layout.to_dict() if isinstance(layout, Layout) else dict(layout or start.get("layout") or {})
    if not lay_d:
        raise ConfigError("layout", None, "the log has no layout: pass --layout '{\"dp\": 32, ...}'")
    lay = Layout.from_dict(lay_d)
    world = int(world_size or start.get("world_size") or lay.world_size)
    seq = int(seq_len or start.get("seq_len") or 0)
    gb = int(global_batch or start.get("global_batch") or 0)
    if not seq or not gb:
        raise ConfigError("seq_len", seq or None, "the log has no seq_len/global_batch: pass --seq-len/--global-batch")
    tokens_per_step = gb * seq
    for s in steps:  # torchtitan logs tokens/s per GPU; the record keeps step times
        if s.get("step_time_s") is None and s.get("tokens_per_s_per_gpu"):
            s["step_time_s"] = tokens_per_step / world / _positive(s["tokens_per_s_per_gpu"], "tokens_per_s_per_gpu", s)
    timed_steps = [s for s in steps if s.get("step_time_s") is not None]
    if not timed_steps:
        raise ConfigError("log", str(p), "no step with a step_time_s (or tokens_per_s_per_gpu) to time")
    for s in timed_steps:  # a measured time is a positive number: a bad one would poison the calibration record
        s["step_time_s"] = _positive(s["step_time_s"], "step_time_s", s)
    steps = timed_steps
    warm, timed = _timed(steps, warmup)
    if not timed:
        raise ConfigError("warmup", warmup, f"leaves no timed step of the log's {len(steps)}")
    med = statistics.median(timed)
    nnodes = int(start.get("nnodes") or 1)
    dev = str(start.get("device") or "cuda")
    name = str(device_name or start.get("device_name") or ("cpu" if dev == "cpu" else "unknown"))
    peaks = [s["peak_mem_bytes"] for s in steps if s.get("peak_mem_bytes") and s.get("peak_mem_kind",
                                                                                        "").startswith("cuda")]
    training_ga = max(1, (gb // lay.dp) // lay.micro_batch)  # specs.grad_accum: micro-batches per rank per step
    fl = model_train_step_flops(mspec, seq, lay.micro_batch) * training_ga / lay.tp
    rid = record_id or re.sub(r"[^A-Za-z0-9._-]+", "-", p.stem)
    losses = [float(s["loss"]) for s in steps]
    return {
        "schema_version": 1, "id": rid, "family": "production", "status": "ok",
        "message": f"ingested from {p.name} ({kind}, {len(steps)} steps, {len(timed)} timed)",
        "spec": {"id": rid, "family": "production", "model": mspec.to_dict(), "layout": lay.to_dict(),
                 "seq_len": seq, "global_batch": gb, "steps": len(steps), "warmup": len(warm),
                 "nproc_per_node": max(1, world // nnodes), "nnodes": nnodes, "device": dev,
                 "dtype": str(start.get("dtype") or "bf16"), "finetune": "full", "lora_rank": 8,
                 # the AdamW kernels the trainer ran (train_entry logs them; torchtitan's default is fused)
                 "optimizer_impl": str(start.get("optimizer_impl") or "fused"),
                 "lora_targets": [], "compile": False, "seed": 0, "data": str(p.name),
                 "source": "trainer log: " + str(start.get("engine") or kind)},
        "layout_family": lay.family, "layout_describe": lay.describe(),
        "environment": {"torch_version": str(start.get("torch_version") or ""), "device_name": name,
                        "world_size": world, "backend": str(start.get("backend") or ("nccl" if dev == "cuda"
                                                                                      else "gloo")),
                        "hostname_count": nnodes, "slurm_nodes": []},
        "timing": {"step_times_s": warm + timed, "step_time_median_s": med, "step_time_p10_s": _pct(timed, 0.1),
                   "step_time_p90_s": _pct(timed, 0.9), "tokens_per_s": tokens_per_step / med,
                   "tokens_per_step": tokens_per_step, "wall_s": sum(warm + timed)},
        "loss": losses,
        "flops": {"measured_total_per_rank_step": None, "attention_recompute_per_rank_step": None,
                  "measured_model_per_rank_step": None, "analytic_model_per_rank_step": fl,
                  "analytic_hardware_per_rank_step": None, "by_op": {}},
        "memory": {"state_bytes_per_rank": [], "saved_activations": None, "cuda_max_allocated_bytes": None,
                   "cuda_max_reserved_bytes": int(max(peaks)) if peaks else None},
        "comm": {}, "params": {"module": start.get("n_params"), "spec": mspec.n_params,
                               "trainable": start.get("n_params")},
        "predicted": {},
    }


_TT_LOAD = re.compile(r"Loading the checkpoint from \S*?step-(?P<step>\d+)")


def check_resume_torchtitan(path: str | Path) -> tuple[bool, str]:
    """The day-1 checkpoint check on a torchtitan console log: a launch loaded ``step-N`` (torchtitan's "Loading the
    checkpoint from …/step-N"), the steps after it continue N+1, N+2, … to the end, every loss finite."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    loads = list(_TT_LOAD.finditer(text))
    if not loads:
        return False, "no launch loaded a checkpoint (no \"Loading the checkpoint from …/step-N\" line)"
    r = int(loads[-1]["step"])
    after = _titan_steps(text[loads[-1].end():])
    if not after:
        return False, f"loaded step-{r} but logged no step after it"
    nums = [s["step"] for s in after]
    if nums != list(range(r + 1, r + 1 + len(nums))):
        return False, f"steps after loading step-{r} are not contiguous from {r + 1}: {nums}"
    if not all(math.isfinite(s["loss"]) for s in after):
        return False, "a loss is not finite"
    return True, f"restored at step {r} and continued to step {nums[-1]} (loss {after[0]['loss']:.4f} first)"


def _losses(path: str | Path, fmt: str) -> dict[int, float]:
    """step -> loss of a step log (train_entry JSON lines or torchtitan console), the last launch's on a repeat."""
    steps = parse_torchtitan_log(path) if log_format(path, fmt) == "torchtitan" else read_step_log(path)[1]
    return {int(s["step"]): float(s["loss"]) for s in steps}


def check_loss_parity(path: str | Path, reference: str | Path, *, max_rel: float = LOSS_PARITY_MAX_REL,
                      fmt: str = "auto", min_steps: int | None = None) -> tuple[bool, str]:
    """The FP8 day-1 loss check: the mean loss of ``path`` (the FP8 run) over the last quarter of the steps both
    logs have is within ``max_rel`` of ``reference``'s (a bf16 run from the same weights and data) over the same
    steps, and every loss of both is finite. Fewer than 8 common steps is a failure: too short to tell; so is a log
    that stops before ``min_steps`` (a run cut short compares a shorter window than the check promises)."""
    run, ref = _losses(path, fmt), _losses(reference, fmt)
    for name, log in (("run", run), ("reference", ref)):
        if min_steps and max(log, default=0) < min_steps:
            return False, f"the {name} log ends at step {max(log, default=0)} of {min_steps}: the run did not finish"
    common = sorted(set(run) & set(ref))
    if len(common) < 8:
        return False, f"{len(common)} steps in both logs: at least 8 are needed ({LOSS_PARITY_STEPS} planned)"
    bad = [(n, k) for n, log in (("run", run), ("reference", ref)) for k in common if not math.isfinite(log[k])]
    if bad:
        return False, f"the {bad[0][0]}'s loss at step {bad[0][1]} is not finite"
    window = common[-max(1, len(common) // 4):]
    m_run = statistics.fmean(run[k] for k in window)
    m_ref = statistics.fmean(ref[k] for k in window)
    rel = m_run / m_ref - 1.0
    ok = abs(rel) <= max_rel
    return ok, (f"mean loss over steps {window[0]}–{window[-1]}: {m_run:.4f} against the reference's {m_ref:.4f} "
                f"({rel:+.2%}; {'within' if ok else 'beyond'} ±{max_rel:.0%})")


def check_resume(path: str | Path, fmt: str = "auto") -> tuple[bool, str]:
    """The day-1 checkpoint check on a train_entry log: a later launch resumed (start_step > 0) from a
    checkpoint the log records, steps are contiguous 1..N across launches, every loss finite. A torchtitan console
    log (``fmt`` torchtitan, or auto and not JSON lines): :func:`check_resume_torchtitan`."""
    if log_format(path, fmt) == "torchtitan":
        return check_resume_torchtitan(path)
    starts, steps = read_step_log(path)
    ckpts = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if '"checkpoint"' in line:
            ev = json.loads(line)
            if ev.get("event") == "checkpoint":
                ckpts[ev["step"]] = ev
    resumed = [s for s in starts if s.get("start_step", 0) > 0]
    if not resumed:
        return False, "no launch resumed from a checkpoint (every start_step is 0)"
    bad = [r["start_step"] for r in resumed if r["start_step"] not in ckpts]
    if bad:
        return False, f"resumed at step {bad[0]} but the log has no checkpoint saved there"
    nums = [s["step"] for s in steps]
    if nums != list(range(1, len(nums) + 1)):
        return False, f"steps are not contiguous across the restore: {nums}"
    if not all(math.isfinite(float(s["loss"])) for s in steps):
        return False, "a loss is not finite"
    r = resumed[-1]["start_step"]
    before = next(s["loss"] for s in steps if s["step"] == r)
    after = next(s["loss"] for s in steps if s["step"] == r + 1)
    return True, f"restored at step {r} and continued to step {nums[-1]} (loss {before:.4f} -> {after:.4f})"


def main(argv: Sequence[str] | None = None) -> int:
    """``trainplan ingest``: exit 0 written/passed, 1 a day-1 check failed, 2 bad input."""
    ap = argparse.ArgumentParser(prog="trainplan ingest", description=__doc__.split("\n\n")[0],
                                 epilog="example: trainplan ingest run/steps.jsonl --out data/calibration/gpu/"
                                        "production-day1.json")
    ap.add_argument("log", help="train_entry steps.jsonl, or a torchtitan console log")
    ap.add_argument("--out", help="RECORD path (e.g. data/calibration/gpu/<name>.json)")
    ap.add_argument("--id", help="record id (default: the log's file stem)")
    ap.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="untimed steps after each launch (default 3)")
    ap.add_argument("--model", help="preset or config.json (needed for torchtitan logs)")
    ap.add_argument("--layout", help="layout JSON (needed for torchtitan logs)")
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--global-batch", type=int)
    ap.add_argument("--world-size", type=int)
    ap.add_argument("--device-name", help="GPU name (default: from the log)")
    ap.add_argument("--format", choices=("auto", "jsonl", "torchtitan"), default="auto")
    ap.add_argument("--min-tokens-per-s-per-gpu", type=float, help="day-1 throughput check: fail below this")
    ap.add_argument("--check-resume", action="store_true", help="day-1 checkpoint check on the log (no record)")
    ap.add_argument("--loss-parity", metavar="REF", help="FP8 day-1 loss check (no record): the log's mean loss over "
                    "the last quarter of the common steps within --max-loss-rel of REF's, a bf16 run's step log")
    ap.add_argument("--max-loss-rel", type=float, default=LOSS_PARITY_MAX_REL,
                    help=f"--loss-parity tolerance (default {LOSS_PARITY_MAX_REL})")
    ap.add_argument("--min-steps", type=int, help="--loss-parity: both logs must reach this step (the runs finished)")
    a = ap.parse_args(argv)
    try:
        if a.warmup < 0:
            raise ConfigError("--warmup", a.warmup, "an integer ≥ 0 (untimed steps after each launch)")
        if a.min_tokens_per_s_per_gpu is not None and not (math.isfinite(a.min_tokens_per_s_per_gpu)
                                                          and a.min_tokens_per_s_per_gpu > 0):
            raise ConfigError("--min-tokens-per-s-per-gpu", a.min_tokens_per_s_per_gpu, "a positive number")
        if a.out and (Path(a.out).is_dir() or any(p.exists() and not p.is_dir() for p in Path(a.out).parents)):
            raise ConfigError("--out", a.out, "a file path whose folders are folders (the RECORD is written there)")
        try:
            layout_arg = json.loads(a.layout) if a.layout else None
        except json.JSONDecodeError as e:
            raise ConfigError("--layout", a.layout, f"layout JSON ({e.msg} at char {e.pos})") from None
        if a.loss_parity is not None:
            if not (math.isfinite(a.max_loss_rel) and 0 < a.max_loss_rel < 1):
                raise ConfigError("--max-loss-rel", a.max_loss_rel, "a fraction in (0, 1), e.g. 0.01")
            if a.min_steps is not None and a.min_steps < 1:
                raise ConfigError("--min-steps", a.min_steps, "a positive number of steps")
            ok, msg = check_loss_parity(a.log, a.loss_parity, max_rel=a.max_loss_rel, fmt=a.format,
                                        min_steps=a.min_steps)
            print(f"trainplan ingest: loss parity {'PASS' if ok else 'FAIL'}: {msg}")
            return 0 if ok else 1
        if a.check_resume:
            ok, msg = check_resume(a.log, a.format)
            print(f"trainplan ingest: checkpoint restore {'PASS' if ok else 'FAIL'}: {msg}")
            return 0 if ok else 1
        rec = record_from_log(a.log, record_id=a.id, warmup=a.warmup, model=a.model,
                              layout=layout_arg, device_name=a.device_name,
                              fmt=a.format, seq_len=a.seq_len, global_batch=a.global_batch, world_size=a.world_size)
    except (ConfigError, OSError, json.JSONDecodeError, KeyError) as e:
        print(f"trainplan ingest: {e}", file=sys.stderr)
        return 2

    validate_record(rec)
    tps = rec["timing"]["tokens_per_s"] / rec["environment"]["world_size"]
    if a.out:
        write_json(a.out, rec)
        print(f"{a.out}: {rec['message']}; median step {rec['timing']['step_time_median_s']:.4g} s, "
              f"{tps:,.0f} tokens/s/GPU")
    if a.min_tokens_per_s_per_gpu is not None:
        finite = all(math.isfinite(x) for x in rec["loss"])
        ok = finite and tps >= a.min_tokens_per_s_per_gpu
        print(f"trainplan ingest: throughput {'PASS' if ok else 'FAIL'}: {tps:,.0f} tokens/s/GPU "
              f"(need >= {a.min_tokens_per_s_per_gpu:,.0f}){'' if finite else '; a loss is not finite'}")
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
