"""Study configuration: YAML → validated, defaulted dict → specs.

``load_config`` accepts a path, a list of paths (later files are deep-merged onto earlier ones, the way
``snakemake --configfile variant.yaml`` layers a variant on ``config/config.yaml``) or a dict (what the
Snakefile passes). It validates against ``config/config.schema.yaml`` (filling its defaults), builds the
specs, and checks a pinned layout against model and cluster. Any problem raises
:class:`~trainplan.specs.ConfigError` naming the key, the value and what is valid — before any job runs.

Human units in the file (GB/s, µs, GB), SI inside (``*_Bps``, ``*_s``, ``*_bytes``).
This module imports neither torch nor snakemake.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from trainplan.specs import (
    ClusterSpec,
    ConfigError,
    Layout,
    ModelSpec,
    TrainingSpec,
    check_layout,
    resolve_gpu,
    resolve_model,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO_ROOT / "config" / "config.schema.yaml"
DEFAULT_CONFIG_PATH = REPO_ROOT / "config" / "config.yaml"

# Which config sections each rule depends on: its ``params:`` slice and so its provenance hash.
# Changing the price (cost) reruns cost_and_risk and what is downstream of it, nothing upstream.
RULE_SECTIONS: dict[str, tuple[str, ...]] = {
    "analytic_model": ("model", "cluster", "training", "layout", "search", "efficiency"),
    "select_proxies": ("model", "training", "proxies"),
    "proxy_run": ("proxies",),
    "aggregate": ("model", "efficiency"),
    "calibrate": ("cluster", "efficiency", "calibration"),
    "fit_scaling": ("model", "cluster", "calibration"),  # extrapolation targets: depth, width, world size
    "predict_production": ("model", "cluster", "training", "layout", "search", "calibration"),
    # the sensitivity re-runs the layout search under each assumption (layout flips), hence search inputs
    "cost_and_risk": ("model", "cluster", "training", "layout", "search", "cost", "targets"),
    "figures": ("study", "targets"),
    "memo": ("*",),  # the memo attaches the whole resolved config, so it depends on all of it
    "launch_artifacts": ("model", "cluster", "training", "launch"),
}

GB, US = 1e9, 1e-6


@dataclass(frozen=True)
class StudyConfig:
    """A loaded study: specs for the analytic core, plain dicts for the stages, and the raw config."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    layout: Layout | None
    search: dict
    efficiency: Any  # trainplan.efficiency.Efficiency (a dict of overrides until that module exists)
    proxies: dict
    calibration: dict
    cost: dict
    targets: dict
    memo: dict
    study: dict = field(default_factory=dict)
    launch: dict = field(default_factory=dict)
    raw: dict = field(default_factory=dict)

    def slice(self, rule: str) -> dict:
        return config_slice(self.raw, rule)


def config_slice(raw: Mapping[str, Any], rule: str) -> dict:
    """The part of the (validated) config a rule depends on: ``{section: value}`` for its sections."""
    if rule not in RULE_SECTIONS:
        raise ConfigError("rule", rule, "one of " + ", ".join(RULE_SECTIONS))
    if RULE_SECTIONS[rule] == ("*",):
        return copy.deepcopy(dict(raw))
    return {s: copy.deepcopy(raw.get(s)) for s in RULE_SECTIONS[rule]}


# ------------------------------------------------------------------------------------------ loading
def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict:
    """``over`` layered onto ``base``: mappings merge recursively, everything else replaces."""
    out = copy.deepcopy(dict(base))
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def read_yaml(path: str | Path) -> dict:
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError("configfile", str(p), "no such file") from None
    except yaml.YAMLError as e:
        raise ConfigError("configfile", str(p), f"not valid YAML ({e})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("configfile", str(p), "must hold a YAML mapping of sections")
    return data


@lru_cache(maxsize=1)
def load_schema() -> dict:
    return read_yaml(SCHEMA_PATH)


def _fill_defaults(node: Any, schema: Mapping[str, Any]) -> Any:
    """Insert schema ``default`` values for missing properties (recursively, objects only)."""
    if not isinstance(node, dict) or schema.get("type") != "object":
        return node
    for name, sub in schema.get("properties", {}).items():
        if name not in node and "default" in sub:
            node[name] = copy.deepcopy(sub["default"])
        if name in node:
            node[name] = _fill_defaults(node[name], sub)
    return node


def _schema_at(schema: Mapping[str, Any], path: Iterable[Any]) -> Mapping[str, Any]:
    s = schema
    for part in path:
        props = s.get("properties", {})
        if isinstance(part, str) and part in props:
            s = props[part]
        elif "items" in s:
            s = s["items"]
        else:
            return {}
    return s


def validate_raw(raw: dict) -> dict:
    """Fill defaults and check ``raw`` against the schema; ConfigError on the first (best) problem."""
    import jsonschema

    schema = load_schema()
    raw = _fill_defaults(copy.deepcopy(raw), schema)
    validator = jsonschema.Draft202012Validator(schema)
    err = jsonschema.exceptions.best_match(validator.iter_errors(raw))
    if err is None:
        return raw
    path = [str(p) for p in err.absolute_path]
    value: Any = err.instance
    if err.validator == "required":
        missing = [r for r in err.validator_value if not isinstance(err.instance, dict) or r not in err.instance]
        path.append(missing[0] if missing else "?")
        value = None
        sub = _schema_at(schema, [*err.absolute_path, path[-1]])
        valid = "required" + (f": {sub['description']}" if sub.get("description") else "")
    elif err.validator == "additionalProperties":
        extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
        path.append(extra[0] if extra else "?")
        value = err.instance.get(path[-1]) if extra else None
        valid = "unknown key; valid: " + ", ".join(sorted(err.schema.get("properties", {})))
    else:
        desc = _schema_at(schema, err.absolute_path).get("description", "")
        valid = err.message.replace(repr(err.instance), "value", 1) if len(repr(err.instance)) < 200 else err.message
        valid += f" ({desc})" if desc else ""
    raise ConfigError(".".join(path) or "config", value, valid)


def _section(key: str, fn: Any, *args: Any, **kw: Any) -> Any:
    """Call ``fn``; prefix the key of any ConfigError with the config section it came from."""
    try:
        return fn(*args, **kw)
    except ConfigError as e:
        k = e.key if e.key.startswith(key + ".") or e.key == key else f"{key}.{e.key}"
        raise ConfigError(k, e.value, e.valid) from None


def build_cluster(c: Mapping[str, Any]) -> ClusterSpec:
    """ClusterSpec from the config's human units (GB/s, µs, GB)."""
    return ClusterSpec(
        nodes=c["nodes"],
        gpus_per_node=c["gpus_per_node"],
        gpu=_section("cluster", resolve_gpu, c["gpu"]),
        intra_busbw_Bps=c["intra_busbw_GBps"] * GB,
        inter_busbw_Bps=c["inter_busbw_GBps"] * GB,
        intra_latency_s=c["intra_latency_us"] * US,
        inter_latency_s=c["inter_latency_us"] * US,
        nics_per_node=c["nics_per_node"],
        host_to_device_Bps=c["host_to_device_GBps"] * GB,
        host_mem_bytes=int(c["host_mem_GB"] * GB),
    )


def build_efficiency(overrides: Mapping[str, Any]) -> Any:
    """``Efficiency.from_dict(overrides)``; a plain dict while trainplan.efficiency does not exist yet."""
    try:
        from trainplan.efficiency import Efficiency
    except ImportError:
        return dict(overrides)
    return _section("efficiency", Efficiency.from_dict, dict(overrides))


def _check_semantics(raw: Mapping[str, Any], model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> None:
    lo, hi = raw["cost"]["price_range_usd"]
    p = raw["cost"]["price_per_gpu_hour_usd"]
    if not lo <= p <= hi:
        raise ConfigError("cost.price_range_usd", [lo, hi], f"must be [low, high] with low ≤ price_per_gpu_hour_usd={p} ≤ high")
    qlo, qhi = raw["calibration"]["interval"]
    if not qlo < qhi:
        raise ConfigError("calibration.interval", [qlo, qhi], "must be [lower, upper] quantiles with lower < upper")
    if training.seq_len > model.max_seq_len:
        raise ConfigError("training.seq_len", training.seq_len,
                          f"at most the model's max_seq_len={model.max_seq_len} ({model.name})")
    if cluster.n_gpus < 1:  # pragma: no cover - ClusterSpec already enforces it
        raise ConfigError("cluster", cluster.n_gpus, "at least one GPU")


def load_config(path_or_dict: str | Path | Mapping[str, Any] | Iterable[str | Path]) -> StudyConfig:
    """Load, default, validate and resolve a study config; ConfigError names the first bad key."""
    if isinstance(path_or_dict, Mapping):
        raw: dict = copy.deepcopy(dict(path_or_dict))
    elif isinstance(path_or_dict, str | Path):
        raw = read_yaml(path_or_dict)
    else:
        raw = {}
        for p in path_or_dict:
            raw = deep_merge(raw, read_yaml(p))
    raw = validate_raw(raw)

    model = _section("model", resolve_model, raw["model"])
    cluster = _section("cluster", build_cluster, raw["cluster"])
    tr = raw["training"]
    training = _section("training", TrainingSpec, **{**tr, "lora_targets": tuple(tr["lora_targets"])})
    layout = None
    if raw.get("layout") is not None:
        layout = _section("layout", Layout.from_dict, raw["layout"])
        check_layout(model, cluster, training, layout)
    _check_semantics(raw, model, cluster, training)
    return StudyConfig(
        model=model, cluster=cluster, training=training, layout=layout,
        search=raw["search"], efficiency=build_efficiency(raw["efficiency"]), proxies=raw["proxies"],
        calibration=raw["calibration"], cost=raw["cost"], targets=raw["targets"], memo=raw["memo"],
        study=raw["study"], launch=raw["launch"], raw=raw,
    )
