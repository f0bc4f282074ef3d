"""Cost, schedule and failure model: wall-clock, GPU-hours, dollars and goodput, as intervals.

Total tokens ÷ throughput gives the training time; a real job adds start-up, checkpoint stalls,
evaluation and the expected loss from interruptions (lost work since the last checkpoint plus a
restart), with the checkpoint interval chosen by Young/Daly. Every term is one pure, numpy-broadcasting
function, so :func:`cost_and_risk` evaluates them on arrays of samples: the throughput interval (from
the production prediction) and each assumption's range, drawn with a fixed seed.

Dollar outputs carry ``usd`` in their key; nothing else depends on the price (tested).

Config (``cost:`` section; human units): ``price_per_gpu_hour_usd``, ``price_range_usd``, ``startup_h``,
``checkpoint_write_GBps`` (aggregate to shared storage), ``checkpoint_async``, ``eval_overhead_frac``,
``restart_h``, ``failures: {interruptions, days, gpus, source}``; optional ranges ``startup_h_range``,
``checkpoint_write_GBps_range``, ``eval_overhead_frac_range``, ``restart_h_range``,
``failure_rate_x_range`` (multiplier on the derived rate), ``checkpoint_bytes_per_param_range``.
``targets:``: ``window_h`` (deadline), ``budget_usd``, ``min_tokens_per_s_per_gpu``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from trainplan.model.base import ConfigError

HOUR = 3600.0
DAY = 24 * HOUR
Z90 = 1.2815515655446004  # standard normal quantile at 0.9: p10/p90 are median·exp(∓Z90·σ)


# ------------------------------------------------------------------------------------- cost terms
def failure_rate_per_gpu_hour(interruptions: float, days: float, gpus: int) -> float:
    """Interruptions per GPU-hour = count / (days·24·GPUs) (Llama 3, arXiv 2407.21783 §3.3.4, Table 5)."""
    return interruptions / (days * 24.0 * gpus)


def job_mtbf_s(rate_per_gpu_hour: Any, n_gpus: int) -> Any:
    """Mean time between interruptions of the whole job: 1/(rate·N) for independent GPU failures."""
    with np.errstate(divide="ignore"):  # rate 0 (no failures): an infinite MTBF
        return HOUR / (np.asarray(rate_per_gpu_hour) * n_gpus)


# Bytes per model parameter in one checkpoint, by fine-tune: (value, (low, high)). A full fine-tune's DCP save of
# FSDP2 (torchtitan, Accelerate, trainplan.train_entry) holds the fp32 sharded weights 4 + Adam m, v 8 = 12 B
# (ZeRO's 16Ψ less the gradients, which no checkpoint saves); DeepSpeed adds its bf16 weights: 14. A LoRA/QLoRA
# save holds the frozen base weights (fp32 shards in train_entry: 4; 2 if kept in bf16) and the adapters' few MB.
CHECKPOINT_BYTES_PER_PARAM = {"full": (12.0, (12.0, 14.0)), "lora": (4.0, (2.0, 4.0)), "qlora": (4.0, (2.0, 4.0))}


def checkpoint_bytes(n_params: float, bytes_per_param: Any = CHECKPOINT_BYTES_PER_PARAM["full"][0]) -> Any:
    """Bytes of one checkpoint: ``n_params`` × bytes per parameter (:data:`CHECKPOINT_BYTES_PER_PARAM`)."""
    return n_params * np.asarray(bytes_per_param)


def checkpoint_write_s(ckpt_bytes: Any, write_Bps: Any) -> Any:
    """Time to persist one checkpoint: bytes / aggregate storage write bandwidth (all ranks write shards)."""
    return np.asarray(ckpt_bytes) / np.asarray(write_Bps)


def checkpoint_stall_s(ckpt_bytes: Any, write_Bps: Any, n_gpus: int, d2h_Bps: float, async_: bool) -> Any:
    """Training time lost per checkpoint: the whole write if sync; if async (torch DCP ``async_save``), only
    the device-to-host staging of each GPU's shard, bytes/N ÷ PCIe bandwidth (PyTorch DCP async docs)."""
    if async_:
        return np.broadcast_to(np.asarray(ckpt_bytes) / n_gpus / d2h_Bps, np.shape(write_Bps)).astype(float)
    return checkpoint_write_s(ckpt_bytes, write_Bps)


def young_daly_interval_s(ckpt_cost_s: Any, mtbf_s: Any) -> Any:
    """Optimal checkpoint interval τ = sqrt(2·C·M) (Young 1974; Daly 2006 first-order term)."""
    return np.sqrt(2.0 * np.asarray(ckpt_cost_s) * np.asarray(mtbf_s))


def train_time_s(total_tokens: Any, tokens_per_s_per_gpu: Any, n_gpus: int) -> Any:
    """Pure training time: tokens ÷ (tokens/s/GPU · GPUs)."""
    return np.asarray(total_tokens) / (np.asarray(tokens_per_s_per_gpu) * n_gpus)


def wall_clock_s(train_s: Any, *, startup_s: Any, eval_frac: Any, stall_s: Any, interval_s: Any,
                 mtbf_s: Any, restart_s: Any, unsaved_s: Any = 0.0) -> Any:
    """Expected wall-clock with checkpoints and failures (first-order, Daly 2006): work W' = T(1 + e + C/τ)
    + startup; each interruption (rate 1/M over the wall-clock) costs τ/2 lost + restart R (+ ``unsaved_s``: an
    async checkpoint still being written when it strikes is no checkpoint, so its write time is lost too), so
    wall = W' / (1 − (τ/2 + unsaved + R)/M)."""
    work = np.asarray(train_s) * (1.0 + np.asarray(eval_frac) + np.asarray(stall_s) / interval_s) + startup_s
    with np.errstate(invalid="ignore"):  # no failures (M = ∞, τ = ∞): nothing is lost, not ∞/∞ = NaN
        loss_frac = np.where(np.isinf(mtbf_s), 0.0,
                             (np.asarray(interval_s) / 2.0 + np.asarray(unsaved_s) + restart_s) / mtbf_s)
    return np.where(loss_frac < 1.0, work / np.maximum(1.0 - loss_frac, 1e-12), np.inf)


# ------------------------------------------------------------------------------------ assumptions
@dataclass(frozen=True, kw_only=True)
class CostInputs:
    """The cost section in SI units, each assumption with its (low, high) range."""

    price_per_gpu_hour_usd: float = 3.0
    price_range_usd: tuple[float, float] = (2.0, 6.88)
    startup_s: float = 0.5 * HOUR
    startup_s_range: tuple[float, float] = (0.25 * HOUR, 1.0 * HOUR)  # assumption
    checkpoint_write_Bps: float = 5e9
    checkpoint_write_Bps_range: tuple[float, float] = (2e9, 20e9)  # assumption: NFS … parallel FS
    checkpoint_async: bool = True
    eval_frac: float = 0.02
    eval_frac_range: tuple[float, float] = (0.0, 0.05)  # assumption
    restart_s: float = 0.25 * HOUR
    restart_s_range: tuple[float, float] = (0.1 * HOUR, 1.0 * HOUR)  # assumption
    failure_rate_per_gpu_hour: float = failure_rate_per_gpu_hour(419, 54, 16384)
    failure_rate_x_range: tuple[float, float] = (0.5, 3.0)  # assumption: smaller/older fleets fail more
    failure_source: str = "Dubey et al. 2024, arXiv 2407.21783, §3.3.4"
    bytes_per_param: float = CHECKPOINT_BYTES_PER_PARAM["full"][0]
    bytes_per_param_range: tuple[float, float] = CHECKPOINT_BYTES_PER_PARAM["full"][1]

    @classmethod
    def from_config(cls, cost: dict[str, Any], finetune: str = "full") -> CostInputs:
        """Human units (hours, GB/s) → SI; every range checked to be (low ≤ value ≤ high). ``finetune`` (full, lora,
        qlora) sets what a checkpoint holds (:data:`CHECKPOINT_BYTES_PER_PARAM`)."""
        c = dict(cost or {})
        if finetune not in CHECKPOINT_BYTES_PER_PARAM:
            raise ConfigError("training.finetune", finetune, "one of " + ", ".join(CHECKPOINT_BYTES_PER_PARAM))
        ck_bytes, ck_range = CHECKPOINT_BYTES_PER_PARAM[finetune]
        d = cls(bytes_per_param=ck_bytes, bytes_per_param_range=ck_range)
        fail = c.get("failures") or {}
        rate = d.failure_rate_per_gpu_hour
        if fail:
            for k in ("interruptions", "days", "gpus"):
                if k not in fail:
                    raise ConfigError(f"cost.failures.{k}", None, "required: interruptions, days, gpus, source")
            if not fail["days"] > 0 or not fail["gpus"] >= 1 or fail["interruptions"] < 0:
                raise ConfigError("cost.failures", fail, "days > 0, gpus ≥ 1, interruptions ≥ 0")
            rate = failure_rate_per_gpu_hour(fail["interruptions"], fail["days"], fail["gpus"])

        def get(key: str, default: float, scale: float = 1.0) -> float:
            v = c.get(key, default / scale)
            if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
                raise ConfigError(f"cost.{key}", v, "must be a non-negative number")
            return float(v) * scale

        def rng(key: str, default: tuple[float, float], value: float, scale: float = 1.0) -> tuple[float, float]:
            r = c.get(key)
            lo, hi = (default if r is None else (float(r[0]) * scale, float(r[1]) * scale))
            lo, hi = min(lo, value), max(hi, value)  # a default range always contains the configured value
            if r is not None and not (float(r[0]) * scale <= value <= float(r[1]) * scale):
                raise ConfigError(f"cost.{key}", list(r), f"must be [low, high] around the value {value / scale}")
            return (lo, hi)

        price = get("price_per_gpu_hour_usd", d.price_per_gpu_hour_usd)
        if price <= 0:
            raise ConfigError("cost.price_per_gpu_hour_usd", price, "must be > 0")
        startup = get("startup_h", d.startup_s, HOUR)
        write = get("checkpoint_write_GBps", d.checkpoint_write_Bps, 1e9)
        if write <= 0:
            raise ConfigError("cost.checkpoint_write_GBps", write / 1e9, "must be > 0")
        ev = get("eval_overhead_frac", d.eval_frac)
        restart = get("restart_h", d.restart_s, HOUR)
        return cls(
            price_per_gpu_hour_usd=price, price_range_usd=rng("price_range_usd", d.price_range_usd, price),
            startup_s=startup, startup_s_range=rng("startup_h_range", d.startup_s_range, startup, HOUR),
            checkpoint_write_Bps=write,
            checkpoint_write_Bps_range=rng("checkpoint_write_GBps_range", d.checkpoint_write_Bps_range, write, 1e9),
            checkpoint_async=bool(c.get("checkpoint_async", d.checkpoint_async)),
            eval_frac=ev, eval_frac_range=rng("eval_overhead_frac_range", d.eval_frac_range, ev),
            restart_s=restart, restart_s_range=rng("restart_h_range", d.restart_s_range, restart, HOUR),
            failure_rate_per_gpu_hour=rate,
            failure_rate_x_range=rng("failure_rate_x_range", d.failure_rate_x_range, 1.0),
            failure_source=str(fail.get("source", d.failure_source)),
            bytes_per_param=d.bytes_per_param,
            bytes_per_param_range=rng("checkpoint_bytes_per_param_range", d.bytes_per_param_range, d.bytes_per_param),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------------------- the schedule
def schedule(tokens_per_s_per_gpu: Any, *, n_gpus: int, n_params: float, total_tokens: Any,
             d2h_Bps: float, inputs: CostInputs, write_Bps: Any = None, startup_s: Any = None,
             eval_frac: Any = None, restart_s: Any = None, failure_x: Any = 1.0,
             bytes_per_param: Any = None) -> dict[str, Any]:
    """Every schedule quantity for one point or arrays of samples (no dollars: see :func:`dollars`)."""
    i = inputs
    write = i.checkpoint_write_Bps if write_Bps is None else write_Bps
    ck_bytes = checkpoint_bytes(n_params, i.bytes_per_param if bytes_per_param is None else bytes_per_param)
    stall = checkpoint_stall_s(ck_bytes, write, n_gpus, d2h_Bps, i.checkpoint_async)
    mtbf = job_mtbf_s(i.failure_rate_per_gpu_hour * np.asarray(failure_x), n_gpus)
    # Young/Daly on the stall; the next checkpoint cannot start before the last one is written.
    interval = np.maximum(young_daly_interval_s(stall, mtbf), checkpoint_write_s(ck_bytes, write))
    train = train_time_s(total_tokens, tokens_per_s_per_gpu, n_gpus)
    restart = i.restart_s if restart_s is None else restart_s
    write_s = checkpoint_write_s(ck_bytes, write)
    wall = wall_clock_s(train, startup_s=i.startup_s if startup_s is None else startup_s,
                        eval_frac=i.eval_frac if eval_frac is None else eval_frac, stall_s=stall,
                        interval_s=interval, mtbf_s=mtbf, restart_s=restart,
                        unsaved_s=write_s if i.checkpoint_async else 0.0)
    return {
        "train_h": train / HOUR, "wall_h": wall / HOUR, "gpu_hours": wall / HOUR * n_gpus,
        "goodput": train / wall, "checkpoint_gb": ck_bytes / 1e9, "checkpoint_write_s": write_s,
        "checkpoint_stall_s": stall, "checkpoint_interval_h": interval / HOUR, "job_mtbf_h": mtbf / HOUR,
        "expected_failures": wall / mtbf,
    }


def point_usd(detail: dict[str, Any], tokens_per_s_per_gpu: float) -> float | None:
    """The point cost (every assumption at its base value, as cost.json's ``point``) at another throughput, from
    cost.json's ``detail``; None when it lacks what the schedule needs. What a technique that changes the
    throughput by a factor saves: fixed costs (start-up) do not scale with it."""
    try:
        inputs = CostInputs(**{k: tuple(v) if isinstance(v, list) else v for k, v in detail["assumptions"].items()})
        s = schedule(float(tokens_per_s_per_gpu), n_gpus=int(detail["n_gpus"]), n_params=float(detail["n_params"]),
                     total_tokens=float(detail["total_tokens"]), d2h_Bps=float(detail["d2h_Bps"]), inputs=inputs)
    except (KeyError, TypeError, ValueError):
        return None
    return float(dollars(s["gpu_hours"], inputs.price_per_gpu_hour_usd))


def duration_text(hours: float) -> str:
    """A duration as people read it: whole minutes below an hour (a 0.34 h checkpoint interval is "20 min"),
    hours to one decimal above. The memo and the launch checks print the checkpoint interval with it."""
    return f"{60 * hours:.0f} min" if hours < 1 else f"{hours:,.1f} h"


def dollars(gpu_hours: Any, price_per_gpu_hour_usd: Any) -> Any:
    """Dollars = GPU-hours × price per GPU-hour."""
    return np.asarray(gpu_hours) * price_per_gpu_hour_usd


def lognormal_from_quantiles(p10: float, p50: float, p90: float, u: np.ndarray) -> np.ndarray:
    """Samples of a split log-normal through (p10, p50, p90) from standard-normal draws ``u``."""
    if not 0 < p10 <= p50 <= p90:
        raise ConfigError("tokens_per_s_per_gpu", (p10, p50, p90), "need 0 < p10 ≤ p50 ≤ p90")
    s_lo, s_hi = np.log(p50 / p10) / Z90, np.log(p90 / p50) / Z90
    return p50 * np.exp(np.where(u < 0, s_lo, s_hi) * u)


def _q(a: Any) -> dict[str, float]:
    """p10/p50/p90 of samples. Linear interpolation between two infinite samples is inf − inf = NaN: with no
    failures (``failures.interruptions: 0``) every MTBF and checkpoint-interval sample is +inf, so non-finite samples
    take the order statistics themselves (``inverted_cdf``), and the interval reads inf, not NaN."""
    a = np.asarray(a, dtype=float)
    method = "linear" if np.isfinite(a).all() else "inverted_cdf"
    p10, p50, p90 = np.quantile(a, [0.1, 0.5, 0.9], method=method)
    return {"p10": float(p10), "p50": float(p50), "p90": float(p90)}


def cost_and_risk(tokens_per_s_per_gpu: tuple[float, float, float], *, n_gpus: int, n_params: float,
                  total_tokens: float, d2h_Bps: float, inputs: CostInputs, targets: dict[str, Any] | None = None,
                  n_samples: int = 4000, seed: int = 0, calibration_source: str = "defaults") -> dict[str, Any]:
    """Point estimate and p10/p50/p90 of schedule and cost, sampling throughput and every assumption."""
    i = inputs
    rng = np.random.default_rng(seed)
    z = rng.standard_normal(n_samples)
    u = rng.random((7, n_samples))  # one stream per assumption, drawn whatever the values: price-independent

    def span(r: tuple[float, float], k: int) -> np.ndarray:
        return r[0] + (r[1] - r[0]) * u[k]

    tps = lognormal_from_quantiles(*tokens_per_s_per_gpu, z)
    kw = dict(n_gpus=n_gpus, n_params=n_params, total_tokens=total_tokens, d2h_Bps=d2h_Bps, inputs=i)
    point = schedule(tokens_per_s_per_gpu[1], **kw)
    samp = schedule(tps, write_Bps=span(i.checkpoint_write_Bps_range, 0), startup_s=span(i.startup_s_range, 1),
                    eval_frac=span(i.eval_frac_range, 2), restart_s=span(i.restart_s_range, 3),
                    failure_x=span(i.failure_rate_x_range, 4), bytes_per_param=span(i.bytes_per_param_range, 5),
                    **kw)
    price_samples = span(i.price_range_usd, 6)
    out: dict[str, Any] = {
        "calibration_source": calibration_source, "n_gpus": n_gpus, "n_params": n_params, "d2h_Bps": d2h_Bps,
        "total_tokens": total_tokens, "seed": seed, "n_samples": n_samples,
        "tokens_per_s_per_gpu": dict(zip(("p10", "p50", "p90"), map(float, tokens_per_s_per_gpu), strict=True)),
        "failure_rate_per_gpu_hour": i.failure_rate_per_gpu_hour, "failure_source": i.failure_source,
        "point": {k: float(v) for k, v in point.items()},
        "intervals": {k: _q(v) for k, v in samp.items()},
        "assumptions": i.to_dict(),
    }
    out["point"]["usd"] = float(dollars(point["gpu_hours"], i.price_per_gpu_hour_usd))
    out["point"]["usd_at_price_low"] = float(dollars(point["gpu_hours"], i.price_range_usd[0]))
    out["point"]["usd_at_price_high"] = float(dollars(point["gpu_hours"], i.price_range_usd[1]))
    out["intervals"]["usd"] = _q(dollars(samp["gpu_hours"], i.price_per_gpu_hour_usd))
    out["intervals"]["usd_price_range"] = _q(dollars(samp["gpu_hours"], price_samples))
    out["targets"] = check_targets(out, targets or {})
    return out


def _verdict(p50_ok: bool, p90_ok: bool) -> str:
    return "pass" if p90_ok else ("at risk" if p50_ok else "fail")


def check_targets(result: dict[str, Any], targets: dict[str, Any]) -> dict[str, Any]:
    """Pass (holds at the pessimistic p90/p10), at risk (holds at p50 only) or fail, with the p50 margin."""
    iv = result["intervals"]
    out: dict[str, Any] = {}
    if "window_h" in targets:
        t, w = float(targets["window_h"]), iv["wall_h"]
        out["deadline"] = {"target_h": t, "p50_h": w["p50"], "p90_h": w["p90"],
                           "margin_frac": (t - w["p50"]) / t, "verdict": _verdict(w["p50"] <= t, w["p90"] <= t)}
    if "budget_usd" in targets:
        t, c = float(targets["budget_usd"]), iv["usd"]
        out["budget_usd"] = {"target_usd": t, "p50_usd": c["p50"], "p90_usd": c["p90"],
                             "margin_frac_usd": (t - c["p50"]) / t, "verdict_usd": _verdict(c["p50"] <= t, c["p90"] <= t)}
    if "min_tokens_per_s_per_gpu" in targets:
        t, q = float(targets["min_tokens_per_s_per_gpu"]), result["tokens_per_s_per_gpu"]
        out["throughput"] = {"target": t, "p50": q["p50"], "p10": q["p10"],
                             "margin_frac": (q["p50"] - t) / t if t else float("inf"),
                             "verdict": _verdict(q["p50"] >= t, q["p10"] >= t)}
    return out


# ---------------------------------------------------------------------------- Snakemake stage glue
TARGET_ROWS = (  # cost_and_risk key, memo name, unit, interval key, target key, direction
    ("deadline", "wall-clock", "h", "wall_h", "target_h", "max"),
    ("budget_usd", "cost", "$", "usd", "target_usd", "max"),
    ("throughput", "tokens/s per GPU", "tokens/s", None, "target", "min"),
)


def memo_cost(res: dict[str, Any], inputs: CostInputs) -> dict[str, Any]:
    """The memo's view of a :func:`cost_and_risk` result (hours, GPU-hours, dollars, overheads, targets, ask)."""
    iv, pt = res["intervals"], res["point"]
    train_h, wall_h = pt["train_h"], pt["wall_h"]
    eval_h = train_h * inputs.eval_frac
    ckpt_h = train_h * pt["checkpoint_stall_s"] / (pt["checkpoint_interval_h"] * HOUR)
    startup_h = inputs.startup_s / HOUR
    targets = []
    for key, name, unit, ivk, tk, direction in TARGET_ROWS:
        t = res["targets"].get(key)
        if not t:
            continue
        q = iv[ivk] if ivk else res["tokens_per_s_per_gpu"]
        verdict = t.get("verdict", t.get("verdict_usd"))
        targets.append({"name": name, "unit": unit, "p10": q["p10"], "p50": q["p50"], "p90": q["p90"],
                        "target": t[tk], "direction": direction, "verdict": verdict, "pass": verdict == "pass"})
    lo, hi = inputs.price_range_usd
    return {
        "train_hours": iv["train_h"], "wallclock_hours": iv["wall_h"], "gpu_hours": iv["gpu_hours"],
        "dollars": iv["usd"],
        "price_per_gpu_hour": {"default": inputs.price_per_gpu_hour_usd, "low": lo, "high": hi},
        "dollars_price_range": {"low": float(dollars(iv["gpu_hours"]["p50"], lo)),
                                "high": float(dollars(iv["gpu_hours"]["p50"], hi))},
        "overheads_hours": {"startup": startup_h, "evaluation": eval_h, "checkpoint stalls": ckpt_h,
                            "failures (lost work + restarts)": wall_h - train_h - eval_h - ckpt_h - startup_h},
        "goodput_frac": pt["goodput"], "checkpoint_interval_h": pt["checkpoint_interval_h"],
        "checkpoint_gib": pt["checkpoint_gb"] * 1e9 / 1024**3, "expected_interruptions": pt["expected_failures"],
        # failures as a Poisson process: the chance of at least one in the run
        "p_any_interruption": float(-np.expm1(-pt["expected_failures"])),
        # the same at the p90 of the joint draws (the failure-rate multiplier and the wall-clock vary there)
        "expected_interruptions_p90": iv["expected_failures"]["p90"],
        "p_any_interruption_p90": float(-np.expm1(-iv["expected_failures"]["p90"])),
        "failure_rate_per_1000_gpu_h": res["failure_rate_per_gpu_hour"] * 1000.0,
        "failure_source": res["failure_source"], "targets": targets,
        "ask": {"gpu_hours": iv["gpu_hours"]["p90"], "dollars": iv["usd"]["p90"], "window_h": iv["wall_h"]["p90"]},
        "detail": res,
    }


def stage_cost_and_risk(production: dict[str, Any], *, n_params: float, n_gpus: int, total_tokens: float,
                        d2h_Bps: float, cost_cfg: dict[str, Any], targets: dict[str, Any],
                        seed: int = 0, finetune: str = "full") -> tuple[dict[str, Any], CostInputs]:
    """cost.json content for the chosen layout's throughput interval (production.json ``chosen``)."""
    chosen = production.get("chosen")
    if not chosen:
        raise ConfigError("prediction.chosen", None, "a feasible layout (the search found none: see families.csv)")
    inputs = CostInputs.from_config(cost_cfg, finetune)
    tps = tuple(float(chosen[f"tokens_per_s_per_gpu_{q}"]) for q in ("p10", "p50", "p90"))
    res = cost_and_risk(tps, n_gpus=n_gpus, n_params=n_params, total_tokens=total_tokens, d2h_Bps=d2h_Bps,
                        inputs=inputs, targets=targets, seed=seed,
                        calibration_source=str(production.get("source", "defaults")))
    doc = memo_cost(res, inputs)
    doc["layout"] = chosen.get("layout")
    doc["calibration_source"] = res["calibration_source"]
    return doc, inputs
