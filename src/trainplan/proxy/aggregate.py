"""Flatten proxy RECORDs into one table (records.csv): predicted next to measured, with relative errors.

Each compared metric m (:data:`METRICS`) has exactly ``<m>_pred``, ``<m>_meas`` and ``<m>_rel_err`` =
predicted/measured − 1 (:func:`rel_err`, the sign used throughout the package).

Nothing unreadable is flattened: :func:`check_record` loads one RECORD and checks it against the schema
(``proxy.schema.RECORD_SCHEMA``), its id and what flattening needs; :func:`aggregate` with ``expected_ids``
(the ids of ``proxy_set.json``) also checks that every promised run is there. All problems are collected
and raised together as :class:`RecordsError`, each with the file's path.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from trainplan.proxy.record import STATE_TERMS, predicted_state_terms
from trainplan.proxy.schema import validate_record

# The compared metrics: each has exactly the columns ``<m>_pred`` (the analytic model), ``<m>_meas`` (the proxy
# run, rank 0) and ``<m>_rel_err`` = ``<m>_pred / <m>_meas − 1`` (the package-wide sign: positive when the model
# over-predicts; None when either side is missing or the measurement is 0). docs/proxy-record.md lists them.
METRICS = ("params", "state_bytes", "state_bytes_exact", "saved_act_bytes", "flops_per_step")


def rel_err(predicted: Any, measured: Any) -> float | None:
    """predicted/measured − 1; None when either is missing (None/NaN) or ``measured`` is 0."""
    if predicted is None or measured is None:
        return None
    p, m = float(predicted), float(measured)
    if math.isnan(p) or math.isnan(m) or m == 0:
        return None
    return p / m - 1.0


def record_row(rec: dict[str, Any]) -> dict[str, Any]:
    """One flat row of a RECORD (rank 0's per-rank figures)."""
    spec, lay = rec["spec"], rec["spec"]["layout"]
    mem, fl, pred = rec["memory"], rec["flops"], rec["predicted"]
    st = (mem.get("state_bytes_per_rank") or [{}])[0]
    ex = pred.get("exact_state_bytes") or {}
    am = pred.get("memory") or {}
    saved = mem.get("saved_activations") or {}
    timing = rec.get("timing", {})
    state_meas = sum(st.get(k, 0) for k in ("params_bytes", "frozen_params_bytes", "grads_bytes",
                                             "optimizer_bytes")) if st else None
    state_exact = sum(ex.values()) if ex else None
    rest, _ = predicted_state_terms(am)  # what is resident between steps (the preflight compares the same)
    state_analytic = sum(rest.values()) if len(rest) == len(STATE_TERMS) else None
    act_meas = saved.get("mean_layer_bytes") if saved.get("complete", True) else None
    act_pred = am.get("activation_bytes_per_layer")
    row: dict[str, Any] = {
        "id": rec["id"], "family": rec.get("family"), "status": rec["status"], "message": rec["message"],
        "layout_family": rec.get("layout_family"), "layout": rec.get("layout_describe"),
        "model": spec["model"]["name"], "layers": spec["model"]["layers"], "hidden": spec["model"]["hidden"],
        "seq_len": spec["seq_len"], "global_batch": spec["global_batch"], "micro_batch": lay["micro_batch"],
        "dp": lay["dp"], "tp": lay["tp"], "sp": lay["sp"], "sharding": lay["sharding"], "recompute": lay["recompute"],
        "finetune": spec["finetune"], "device": spec["device"], "dtype": spec["dtype"],
        "world_size": rec["environment"].get("world_size"),
        **_compared({
            "params": (rec["params"].get("spec"), rec["params"].get("module")),
            "state_bytes": (state_analytic, state_meas),  # the analytic model's resident state
            "state_bytes_exact": (state_exact, state_meas),  # the harness's exact closed form
            "saved_act_bytes": (act_pred, act_meas),  # saved activation bytes per layer
            # what ran outside the flash backward's own QKᵀ: the model's FLOPs plus what activation checkpointing
            # recomputes (zero without it, and under the harness's save-every-matmul selective policy)
            "flops_per_step": (fl.get("analytic_hardware_per_rank_step"), fl.get("measured_model_per_rank_step")),
        }),
        "loss0": rec["loss"][0] if rec["loss"] else None, "loss_last": rec["loss"][-1] if rec["loss"] else None,
        "step_time_median_s": timing.get("step_time_median_s"), "step_time_p10_s": timing.get("step_time_p10_s"),
        "step_time_p90_s": timing.get("step_time_p90_s"), "tokens_per_s": timing.get("tokens_per_s"),
        "cuda_max_allocated_bytes": mem.get("cuda_max_allocated_bytes"),
        "cuda_max_reserved_bytes": mem.get("cuda_max_reserved_bytes"),
    }
    row.update(_spec_columns(rec))
    for kind, c in (rec.get("comm") or {}).items():
        row[f"comm_{kind}_bytes"] = c["bytes"]
        row[f"comm_{kind}_calls"] = c["calls"]
    return row


def _compared(pairs: dict[str, tuple[Any, Any]]) -> dict[str, Any]:
    """``<m>_pred``, ``<m>_meas``, ``<m>_rel_err`` for each metric m of :data:`METRICS` (in that order)."""
    out: dict[str, Any] = {}
    for m in METRICS:
        pred, meas = pairs[m]
        out[f"{m}_pred"], out[f"{m}_meas"], out[f"{m}_rel_err"] = pred, meas, rel_err(pred, meas)
    return out


def attn_kernel_of(rec: dict[str, Any]) -> str:
    """The flash kernel SDPA ran, read off the FLOP counter's op names (``flops.by_op``): ``cudnn`` for
    ``aten._scaled_dot_product_cudnn_attention``, ``fa2`` for the flash op, ``""`` when neither ran (CPU, math)."""
    ops = " ".join((rec.get("flops") or {}).get("by_op") or {})
    return "cudnn" if "cudnn_attention" in ops else "fa2" if "flash_attention" in ops else ""


def _spec_columns(rec: dict[str, Any]) -> dict[str, Any]:
    """What rebuilding the run's specs needs (``trainplan.calibration.gpu.record_specs``): the full model and
    layout as JSON, the GPU's name, launch shape, LoRA and compile flags, and the timed step times."""
    spec, model, env = rec["spec"], rec["spec"]["model"], rec.get("environment") or {}
    timing = rec.get("timing") or {}
    steps = list(timing.get("step_times_s") or [])
    warm = int(spec.get("warmup", 0) or 0)
    return {
        "heads": model.get("heads"), "kv_heads": model.get("kv_heads"), "ffn_hidden": model.get("ffn_hidden"),
        "vocab": model.get("vocab"), "mlp": model.get("mlp"), "tied_embeddings": model.get("tied_embeddings"),
        "pp": spec["layout"].get("pp", 1), "cp": spec["layout"].get("cp", 1),
        "model_json": json.dumps(model, sort_keys=True), "layout_json": json.dumps(spec["layout"], sort_keys=True),
        "gpu_name": env.get("device_name"), "backend": env.get("backend"), "hostname_count": env.get("hostname_count"),
        "nproc_per_node": spec.get("nproc_per_node"), "nnodes": spec.get("nnodes", 1),
        "lora_rank": spec.get("lora_rank"), "lora_targets": ",".join(spec.get("lora_targets") or []),
        "compile": bool(spec.get("compile", False)), "warmup": warm, "steps": spec.get("steps"),
        "model_impl": spec.get("model_impl", "trainplan"), "attn_kernel": attn_kernel_of(rec),
        # the harness builds torch.optim.AdamW with its defaults (foreach on CUDA); an ingested log names its own
        "optimizer_impl": spec.get("optimizer_impl", "foreach"),
        "step_times_json": json.dumps([float(t) for t in steps[warm:]]),  # the timed steps (after warm-up)
    }


class RecordsError(ValueError):
    """One or more proxy RECORD files are missing or unusable: ``problems`` = [(path, why)]."""

    def __init__(self, problems: list[tuple[Path, str]]):
        self.problems = problems
        super().__init__(f"{len(problems)} proxy record(s) missing or invalid: "
                         + "; ".join(f"{p}: {why}" for p, why in problems))

    @property
    def paths(self) -> list[Path]:
        return [p for p, _ in self.problems]


def check_record(path: str | Path, expected_id: str | None = None) -> dict[str, Any]:
    """The RECORD in ``path``, loaded and checked; :class:`RecordsError` naming the file if it is missing,
    not JSON (truncated), not an object, off the schema, another run's, or missing what a row needs."""
    import jsonschema


    p = Path(path)

    def bad(why: str) -> RecordsError:
        return RecordsError([(p, why)])

    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise bad("missing") from None
    except (OSError, UnicodeDecodeError) as e:
        raise bad(f"unreadable ({type(e).__name__}: {e})") from None
    try:
        rec = json.loads(text)
    except json.JSONDecodeError as e:
        raise bad(f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno} of {len(text)} characters: "
                  "truncated or overwritten?)") from None
    if not isinstance(rec, dict):
        raise bad(f"a JSON {type(rec).__name__}, not a RECORD object")
    try:
        validate_record(rec)
    except jsonschema.ValidationError as e:
        where = "/".join(str(x) for x in e.absolute_path) or "the top level"
        raise bad(f"not a valid RECORD (docs/proxy-record.md): {e.message} at {where}") from None
    if expected_id is not None and rec["id"] != expected_id:
        raise bad(f"holds the record of run {rec['id']!r}, not {expected_id!r}")
    try:
        record_row(rec)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise bad(f"a RECORD without what its row needs ({type(e).__name__}: {e})") from None
    return rec


def check_records(record_paths: Iterable[str | Path],
                  expected_ids: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Every RECORD checked (:func:`check_record`); with ``expected_ids`` also one file ``{id}.json`` per
    promised id, holding that id, and none more. Raises one :class:`RecordsError` with every problem."""
    paths = [Path(p) for p in record_paths]
    problems: list[tuple[Path, str]] = []
    if expected_ids is not None:
        expected = list(expected_ids)
        have = {p.stem for p in paths}
        where = paths[0].parent if paths else Path(".")
        problems += [(where / f"{i}.json", "missing (named in proxy_set.json)") for i in expected if i not in have]
        problems += [(p, "not a run of proxy_set.json") for p in paths if p.stem not in set(expected)]
    recs = []
    for p in paths:
        if any(q == p for q, _ in problems):
            continue
        try:
            recs.append(check_record(p, p.stem if expected_ids is not None else None))
        except RecordsError as e:
            problems += e.problems
    if problems:
        raise RecordsError(problems)
    return recs


def aggregate(record_paths: Iterable[str | Path], expected_ids: Iterable[str] | None = None) -> pd.DataFrame:
    """The records.csv table: one row per RECORD file (see :func:`record_row`), plus ``loss0_rel_spread``
    (|loss0 − median|/median), ``comm_bytes_meas`` (all collectives' bytes) and ``loss_step0`` (= loss0).
    Every file is checked first (:func:`check_records`); a bad one raises :class:`RecordsError`."""
    rows = [record_row(r) for r in check_records(record_paths, expected_ids)]
    df = pd.DataFrame(rows)
    if len(df) and "loss0" in df and df["loss0"].notna().any():
        ref = df.groupby(["model", "seq_len", "global_batch", "finetune"])["loss0"].transform("median")
        df["loss0_rel_spread"] = (df["loss0"] - ref).abs() / ref
    comm = [c for c in df.columns if c.startswith("comm_") and c.endswith("_bytes")]
    if comm:
        df["comm_bytes_meas"] = df[comm].fillna(0).sum(axis=1)
    if "loss0" in df:
        df["loss_step0"] = df["loss0"]
    return df
