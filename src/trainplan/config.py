"""Study configuration: YAML → validated, defaulted dict → specs.

``load_config`` accepts a path, a list of paths (later files are deep-merged onto earlier ones, the way
``snakemake --configfile variant.yaml`` layers a variant on ``config/config.yaml``) or a dict (what the
Snakefile passes). It validates against the package's ``config.schema.yaml`` (filling its defaults), builds the
specs, and checks a pinned layout against model and cluster. Any problem raises
:class:`~trainplan.model.base.ConfigError` naming the key, the value and what is valid — before any job runs.

Human units in the file (GB/s, µs, GB), SI inside (``*_Bps``, ``*_s``, ``*_bytes``).
This module imports neither torch nor snakemake.
"""

from __future__ import annotations

import copy
import json
import math
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from trainplan import pkgdata
from trainplan.io import InputFileError, check_depth, read_text_checked
from trainplan.model.arch import (
    CPU_PROXY_HEAD_DIM,
    ModelSpec,
    cpu_proxy_heads,
    hf_unsupported_reason,
    resolve_model,
)
from trainplan.model.base import ConfigError
from trainplan.model.efficiency import Efficiency
from trainplan.model.hardware import ClusterSpec, link_default_notes, resolve_gpu
from trainplan.model.layout import Layout, check_layout, check_lora_targets, check_precision
from trainplan.model.training import TrainingSpec


def schema_path() -> Path:
    """The config schema (JSON Schema in YAML, package data) the CLI, the stages and the Snakefile use."""
    return pkgdata.path(pkgdata.SCHEMA)


def default_config_path() -> Path:
    """The embedded default study (package data; ``trainplan plan`` without a config argument plans it)."""
    return pkgdata.path(pkgdata.DEFAULT_CONFIG)


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
    "launch_artifacts": ("*",),  # every launch file prints the study hash: the hash of the whole config
}

GB, US = 1e9, 1e-6
MAX_CONFIG_BYTES = 1024**2  # a study config is a few KB; a bigger file is a mistake (or an attack)
_DEEP_FLOW = re.compile(r"(?:[\[{][ \t\r\n]*){65}")  # more than 64 nested flow collections in a row


@dataclass(frozen=True)
class StudyConfig:
    """A loaded study: specs for the analytic core, plain dicts for the stages, and the raw config."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    layout: Layout | None
    search: dict
    efficiency: Any  # trainplan.model.efficiency.Efficiency
    proxies: dict
    calibration: dict
    cost: dict
    targets: dict
    memo: dict
    study: dict = field(default_factory=dict)
    launch: dict = field(default_factory=dict)
    raw: dict = field(default_factory=dict)
    warnings: tuple[str, ...] = ()  # one line each; also written to stderr by load_config(warn=True)

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


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` without aliases (``*ref``: a billion-laughs bomb expands from a few lines) and
    without duplicate keys (a careless second ``seq_len:`` would silently win)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.constructor.ConstructorError(None, None, f"YAML alias *{event.anchor} is not allowed in a "
                                                    "config (write the value out)", event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                dup = key in seen
                seen.add(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(None, None, "a mapping key must be a plain value",
                                                        key_node.start_mark) from None
            if dup:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def _one_line(e: Exception, limit: int = 160) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[:limit] + "…"


def read_yaml(path: str | Path) -> dict:
    """A config file: a regular UTF-8 file of at most 1 MiB holding a YAML mapping, no aliases, no
    duplicate keys, at most 64 levels deep; ConfigError('configfile', path, why) otherwise."""
    p = Path(path)
    try:
        text = read_text_checked(p, max_bytes=MAX_CONFIG_BYTES)
        if _DEEP_FLOW.search(text):  # a run of openers: refuse before the (pure-Python) YAML scanner sees it
            raise RecursionError
        data = check_depth(yaml.load(text, Loader=StrictLoader))  # noqa: S506 - StrictLoader is a SafeLoader
    except FileNotFoundError:
        raise ConfigError("configfile", str(p), "no such file") from None
    except InputFileError as e:
        raise ConfigError("configfile", str(p), str(e)) from None
    except RecursionError:
        raise ConfigError("configfile", str(p), "nested too deep") from None
    except yaml.YAMLError as e:
        raise ConfigError("configfile", str(p), f"not valid YAML ({_one_line(e)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("configfile", str(p), "must hold a YAML mapping of sections")
    return data


@lru_cache(maxsize=1)
def load_schema() -> dict:
    return read_yaml(schema_path())


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


# A YAML 1.2 number that YAML 1.1 loaders (PyYAML, so Snakemake's --configfile too) read as a string: an exponent
# without a sign or without a dot (1e9, 1.0e9, 2.5E10). Only these forms: anything else stays the string it was.
_YAML12_EXP_FLOAT = re.compile(r"[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+")


def _yaml12_numbers(node: Any, schema: Mapping[str, Any]) -> Any:
    """Read the exponent forms of ``_YAML12_EXP_FLOAT`` as numbers where the schema asks for a number (and not a
    string): ``dataset_tokens: 1.0e9`` means 10⁹ whichever YAML loader read the file. An integer field gets an
    int when the value is integral (else the schema refuses it, naming the key)."""
    if isinstance(node, dict) and schema.get("type") == "object":
        for name, sub in schema.get("properties", {}).items():
            if name in node:
                node[name] = _yaml12_numbers(node[name], sub)
        return node
    types = schema.get("type")
    types = set(types) if isinstance(types, list) else {types}
    if isinstance(node, str) and types & {"number", "integer"} and "string" not in types \
            and _YAML12_EXP_FLOAT.fullmatch(node):
        v = float(node.replace("_", ""))
        return int(v) if "integer" in types and v.is_integer() and abs(v) < 2**63 else v
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


def _check_finite(node: Any, path: str = "") -> None:
    """NaN and ±inf pass JSON-schema bounds (``.nan`` satisfies ``exclusiveMinimum``): refuse them first,
    naming the key. Also refuses non-string mapping keys (YAML allows ``1: x``)."""
    stack = [(node, path)]
    while stack:
        v, where = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(where or "config", v, "must be a finite number")
        if isinstance(v, dict):
            for k, sub in v.items():
                if not isinstance(k, str):
                    raise ConfigError(f"{where}.{k}" if where else str(k), sub, "keys must be strings")
                if not k.isprintable():  # a key with a newline would break the one-line error
                    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in k)
                    raise ConfigError(f"{where}.{shown}" if where else shown, _short(sub), "unknown key (control "
                                      "characters in a key)")
                stack.append((sub, f"{where}.{k}" if where else k))
        elif isinstance(v, list):
            stack.extend((sub, f"{where}[{i}]") for i, sub in enumerate(v))


def _check_size(raw: Any) -> None:
    """A dict from Snakemake's own YAML loader may be an alias bomb (shared nodes) or absurdly deep."""
    try:
        check_depth(raw)
    except InputFileError as e:
        raise ConfigError("config", "{...}", str(e)) from None


def _short(value: Any, limit: int = 200) -> Any:
    r = repr(value)
    return value if len(r) <= limit else r[:limit] + "…"


def validate_raw(raw: dict) -> dict:
    """Fill defaults and check ``raw`` against the schema; ConfigError on the first (best) problem."""
    import jsonschema

    schema = load_schema()
    _check_size(raw)
    raw = _yaml12_numbers(copy.deepcopy(raw), schema)  # before the finiteness check: "1e999" reads as inf
    eff = raw.get("efficiency")
    if isinstance(eff, dict):  # Efficiency's fields are numbers (the schema lists none: they are its to_dict())
        raw["efficiency"] = {k: _yaml12_numbers(v, {"type": "number"}) for k, v in eff.items()}
    _check_finite(raw)
    raw = _fill_defaults(raw, schema)
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
        r = repr(err.instance)
        if len(r) < 200:
            valid = err.message.replace(r, "value", 1)
        else:  # never echo a huge value; say what was wrong with it
            valid = f"{err.validator} {_short(err.validator_value, 120)} not satisfied"
        valid += f" ({desc})" if desc else ""
    raise ConfigError(".".join(path) or "config", _short(value), valid)


def _section(key: str, fn: Any, *args: Any, **kw: Any) -> Any:
    """Call ``fn``; prefix the key of any ConfigError with the config section it came from."""
    try:
        return fn(*args, **kw)
    except ConfigError as e:
        k = e.key if e.key.startswith(key + ".") or e.key == key else f"{key}.{e.key}"
        raise ConfigError(k, e.value, e.valid) from None


# ClusterSpec's SI field → the config key it comes from (errors name the key the user wrote).
_CLUSTER_KEYS = {"intra_busbw_Bps": "intra_busbw_GBps", "inter_busbw_Bps": "inter_busbw_GBps",
                 "intra_latency_s": "intra_latency_us", "inter_latency_s": "inter_latency_us",
                 "host_to_device_Bps": "host_to_device_GBps", "host_mem_bytes": "host_mem_GB"}


def build_cluster(c: Mapping[str, Any]) -> ClusterSpec:
    """ClusterSpec from the config's human units (GB/s, µs, GB)."""
    try:
        return _build_cluster(c)
    except ConfigError as e:
        key = _CLUSTER_KEYS.get(e.key, e.key)
        raise ConfigError(key, c.get(key, e.value), e.valid) from None


def _build_cluster(c: Mapping[str, Any]) -> ClusterSpec:
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


def build_efficiency(overrides: Mapping[str, Any], gpu: Any = None) -> Any:
    """The Efficiency fitted on ``gpu``'s generation (``Efficiency.for_gpu``) with the config's overrides on top;
    without a GPU, the class defaults with the overrides."""

    def build(d: dict) -> Any:
        base = Efficiency.from_dict(d)  # checks the keys and values first
        return Efficiency.for_gpu(gpu, **d) if gpu is not None else base

    return _section("efficiency", build, dict(overrides))


def require_proxy_torch(proxies: Mapping[str, Any], torch_version: str | None = None) -> None:
    """Refuse ``proxies.device: cuda`` when this interpreter's torch is a CPU-only build (``2.13.0+cpu``, what
    ``scripts/setup.sh`` installs by default): every proxy job runs this interpreter and would fail on the GPU
    nodes after queueing (no CUDA, no NCCL), three times with the Slurm profile's retries. Read from the installed
    distribution's version, without importing torch; a build without the ``+cpu`` tag is let through (PyPI's Linux
    wheel is the CUDA one). Nothing to check when no proxy family runs."""
    if proxies.get("device") != "cuda" or not proxies.get("families", True):
        return
    if torch_version is None:
        try:
            torch_version = metadata.version("torch")
        except metadata.PackageNotFoundError:
            torch_version = "not installed"
    if torch_version == "not installed" or "+cpu" in torch_version:
        raise ConfigError("proxies.device", "cuda",
                          f"cpu, or a CUDA build of torch in this interpreter ({sys.executable}: torch "
                          f"{torch_version}); `TRAINPLAN_TORCH=cuda ./scripts/setup.sh` installs one")


def require_proxy_executor(proxies: Mapping[str, Any], executor: str | None, pending_rules: Iterable[str]) -> None:
    """Refuse ``proxies.nnodes > 1`` when Snakemake's own ``local`` executor would start the proxies: it runs every
    job on this machine, where a multi-node proxy's ranks cannot be placed (they need a Slurm allocation of that many
    nodes). Called from the Snakefile's ``onstart``, the first point at which the executor is known (at parse time
    it is not), after the DAG is built and before any job starts. Nothing to refuse when no proxy job is pending
    (records made on a cluster, the memo rebuilt here) or under a cluster executor."""
    nnodes = int(proxies.get("nnodes", 1))
    if nnodes <= 1 or executor != "local" or not proxies.get("families", True):
        return
    if not {"select_proxies", "proxy_run"} & set(pending_rules):
        return
    raise ConfigError("proxies.nnodes", nnodes,
                      "1 for a local run (`snakemake --cores N` starts every proxy on this machine); a multi-node "
                      "proxy runs under `snakemake --profile slurm` (or another cluster executor)")


def check_relative_dir(key: str, value: Any) -> None:
    """A directory the study writes into: non-empty, relative, no ``..``: it stays inside the working
    directory (``results_dir: ""`` or ``/`` would write results into the current or root directory)."""
    p = Path(value) if isinstance(value, str) else None
    if p is None or not value.strip() or "\0" in value or p.is_absolute() or ".." in p.parts \
            or value.startswith("~") or p == Path("."):
        raise ConfigError(key, value, "a non-empty relative directory inside the working directory "
                                      "(no absolute path, '..', '~' or '.')")


def seq_len_notes(model: ModelSpec, seq_len: int, *, key: str = "training.seq_len") -> list[str]:
    """Warnings about a sequence beyond the model's context window (long-context fine-tuning with RoPE
    scaling is common, so a warning); ConfigError where the model cannot run it at all."""
    if model.sliding_window is not None and seq_len > model.sliding_window:
        raise ConfigError(key, seq_len, f"at most the model's sliding_window={model.sliding_window} ({model.name}: "
                                        "every layer attends within that window, which trainplan does not model; "
                                        "it models full causal attention, equal to the window at or below it)")
    if seq_len <= model.max_seq_len:
        return []
    if model.pos_embedding == "learned":
        raise ConfigError(key, seq_len, f"at most the model's max_seq_len={model.max_seq_len} ({model.name}: "
                                        "learned position embeddings have no row beyond it)")
    return [f"{key}={seq_len} exceeds {model.name}'s max_seq_len={model.max_seq_len}: planned as given "
            "(long-context fine-tuning needs RoPE scaling or position interpolation)"]


def _check_proxies(px: Mapping[str, Any], cluster: ClusterSpec, model: ModelSpec) -> None:
    """Proxy settings that would otherwise fail (or silently drop runs) inside a job."""
    if px.get("model_impl") == "hf":
        why = hf_unsupported_reason(model)
        if why:
            raise ConfigError("proxies.model_impl", "hf", f"{model.name} is not expressible as transformers' "
                                                          f"LlamaForCausalLM: {why}; use trainplan")
    if px.get("device", "cpu") == "cpu":
        for h in px.get("width_hidden", []):
            if h % cpu_proxy_heads(h):
                raise ConfigError("proxies.width_hidden", h, "each divisible by its CPU proxy's heads, max(1, "
                                  f"width // {CPU_PROXY_HEAD_DIM}): {h} has {cpu_proxy_heads(h)} (multiples of "
                                  f"{CPU_PROXY_HEAD_DIM} always are)")
    if px["warmup"] >= px["steps"]:
        raise ConfigError("proxies.warmup", px["warmup"], f"must be < proxies.steps={px['steps']}")
    if px["nproc_per_node"] > cluster.gpus_per_node:
        over = [n for n in px["scaleout_world_sizes"] if n > cluster.gpus_per_node]
        raise ConfigError("proxies.nproc_per_node", px["nproc_per_node"],
                          f"at most cluster.gpus_per_node={cluster.gpus_per_node} (a proxy node stands for one "
                          "cluster node)" + (f"; proxies.scaleout_world_sizes={over} must then come down too "
                                             f"(each at most {cluster.gpus_per_node})" if over else ""))
    if px["nnodes"] > cluster.nodes:
        raise ConfigError("proxies.nnodes", px["nnodes"], f"at most cluster.nodes={cluster.nodes}")
    world = px["nproc_per_node"] * px["nnodes"]
    if px["global_batch"] % world:
        raise ConfigError("proxies.global_batch", px["global_batch"],
                          f"must be a multiple of the proxy world size nproc_per_node·nnodes = {world}")
    for n in px["scaleout_world_sizes"]:
        if n > cluster.gpus_per_node:
            raise ConfigError("proxies.scaleout_world_sizes", n,
                              f"each at most cluster.gpus_per_node={cluster.gpus_per_node} (one node)")
        if px["global_batch"] % n:
            raise ConfigError("proxies.scaleout_world_sizes", n,
                              f"each must divide proxies.global_batch={px['global_batch']}")


def _check_layout_flags(lay: Mapping[str, Any] | None) -> None:
    """Settings that only apply to one sharding or schedule are refused elsewhere, not ignored."""
    if not lay:
        return
    if lay.get("shard_group") is not None and lay.get("sharding", "zero3") != "hsdp":
        raise ConfigError("layout.shard_group", lay["shard_group"],
                          f"only applies to sharding: hsdp (sharding is {lay.get('sharding', 'zero3')})")
    if lay.get("cp_kind", "ring") != "ring" and lay.get("cp", 1) == 1:
        raise ConfigError("layout.cp_kind", lay["cp_kind"], "only applies with cp > 1")
    if lay.get("pp_schedule", "1f1b") != "1f1b" and lay.get("pp", 1) == 1:
        raise ConfigError("layout.pp_schedule", lay["pp_schedule"], "only applies with pp > 1")


def _check_semantics(raw: Mapping[str, Any], model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> None:
    check_relative_dir("study.results_dir", raw["study"]["results_dir"])
    check_precision(cluster, training)  # FP8 only on GPUs with FP8 tensor cores
    check_lora_targets(model, training)
    _check_proxies(raw["proxies"], cluster, model)
    lo, hi = raw["cost"]["price_range_usd"]
    p = raw["cost"]["price_per_gpu_hour_usd"]
    if not lo <= p <= hi:
        raise ConfigError("cost.price_range_usd", [lo, hi], f"must be [low, high] with low ≤ price_per_gpu_hour_usd={p} ≤ high")
    qlo, qhi = raw["calibration"]["interval"]
    if not qlo < qhi:
        raise ConfigError("calibration.interval", [qlo, qhi], "must be [lower, upper] quantiles with lower < upper")
    if cluster.n_gpus < 1:  # pragma: no cover - ClusterSpec already enforces it
        raise ConfigError("cluster", cluster.n_gpus, "at least one GPU")


def _proxy_defaults(raw: dict) -> dict:
    """Proxy defaults that fit the cluster: on a node with one GPU the default 2 ranks (and the [1, 2]
    scale-out ladder) would be refused, so unset ones shrink to it. Set values are checked, not changed."""
    gpn = raw.get("cluster", {}).get("gpus_per_node") if isinstance(raw.get("cluster"), dict) else None
    px = raw.get("proxies", {})
    if not (isinstance(gpn, int) and not isinstance(gpn, bool) and 1 <= gpn < 2 and isinstance(px, dict)):
        return raw
    px = dict(px)
    px.setdefault("nproc_per_node", gpn)
    px.setdefault("scaleout_world_sizes", [1])
    return {**raw, "proxies": px}


def _model_ref(ref: Any, seq_len: int) -> Any:
    """A custom architecture (a mapping without ``preset``, or with ``preset: null``: an overlay cannot delete the
    base config's preset) without ``max_seq_len`` has no context cap: its window is the study's sequence (learned
    positions get exactly the rows the sequence needs)."""
    if isinstance(ref, Mapping) and "preset" in ref and ref["preset"] is None:
        ref = {k: v for k, v in ref.items() if k != "preset"}
    if isinstance(ref, Mapping) and "preset" not in ref and "max_seq_len" not in ref:
        return {**ref, "max_seq_len": seq_len}
    return ref


# The fields that make a model another architecture; given all with a preset, the preset's other shape fields stay.
_ARCH_CORE = ("layers", "hidden", "heads", "vocab")


def model_preset_notes(ref: Any, model: ModelSpec) -> list[str]:
    """A warning when a model mapping gives a whole new shape (layers, hidden, heads, vocab) on top of a preset
    (config/config.yaml's ``preset: llama2-13b``, merged under every overlay): the preset's MLP width and KV heads
    stay unless given, which a custom architecture rarely means."""
    if not (isinstance(ref, Mapping) and ref.get("preset") and all(k in ref for k in _ARCH_CORE)):
        return []
    kept = [f"{k}={getattr(model, k)}" for k in ("ffn_hidden", "kv_heads") if k not in ref]
    if not kept:
        return []
    return [f"model: layers, hidden, heads and vocab are given over preset {ref['preset']}, whose {' and '.join(kept)} "
            "are kept; give them, or set model.preset: null for an architecture of your own"]


def load_config(path_or_dict: str | Path | Mapping[str, Any] | Iterable[str | Path], *,
                warn: bool = True) -> StudyConfig:
    """Load, default, validate and resolve a study config; ConfigError names the first bad key.

    Warnings (a sequence above the model's context window) are one line each in ``StudyConfig.warnings``
    and, with ``warn=True``, on stderr.
    """
    if isinstance(path_or_dict, Mapping):
        _check_size(path_or_dict)  # before deepcopy, which recurses
        raw: dict = copy.deepcopy(dict(path_or_dict))
    elif isinstance(path_or_dict, str | Path):
        raw = read_yaml(path_or_dict)
    else:
        raw = {}
        for p in path_or_dict:
            raw = deep_merge(raw, read_yaml(p))
    raw = validate_raw(_proxy_defaults(raw))

    tr = raw["training"]
    model = _section("model", resolve_model, _model_ref(raw["model"], tr["seq_len"]))
    cluster = _section("cluster", build_cluster, raw["cluster"])
    training = _section("training", TrainingSpec, **{**tr, "lora_targets": tuple(tr["lora_targets"])})
    notes = model_preset_notes(raw["model"], model) + seq_len_notes(model, training.seq_len) + link_default_notes(
        cluster, "cluster.intra_busbw_GBps", "cluster.inter_busbw_GBps", "cluster.host_to_device_GBps")
    layout = None
    if raw.get("layout") is not None:
        _check_layout_flags(raw["layout"])
        layout = _section("layout", Layout.from_dict, raw["layout"])
        check_layout(model, cluster, training, layout)
    _check_semantics(raw, model, cluster, training)
    if warn:
        for n in notes:
            sys.stderr.write(f"trainplan: warning: {n}\n")
    return StudyConfig(
        model=model, cluster=cluster, training=training, layout=layout,
        search=raw["search"], efficiency=build_efficiency(raw["efficiency"], cluster.gpu), proxies=raw["proxies"],
        calibration=raw["calibration"], cost=raw["cost"], targets=raw["targets"], memo=raw["memo"],
        study=raw["study"], launch=raw["launch"], raw=raw, warnings=tuple(notes),
    )


# ------------------------------------------------------------------------------------- reference
REFERENCE_HEADER = """# Config reference

Generated from `src/trainplan/config.schema.yaml` by `python -m trainplan.config > docs/config-reference.md`
(a unit test fails when this file and the schema disagree). Every key of a study config, with its type or
allowed values, its default (filled in before any rule runs; "required" where there is none) and what it means.
Units are in the key names (GB/s, µs, h, $). Overlays (`config/lora.yaml`, …) change a few keys of
`config/config.yaml`: `snakemake --cores 2 --configfile config/lora.yaml`, `trainplan plan config/config.yaml config/lora.yaml`.
"""


def _ref_type(node: Mapping[str, Any]) -> str:
    """A schema node's type in a few words: enum values, type with bounds, array of items, or its alternatives."""
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    if "oneOf" in node:
        return " or ".join(_ref_type(n) for n in node["oneOf"])
    t = node.get("type", "any")
    t = " or ".join(str(x) for x in t) if isinstance(t, list) else str(t)
    if t == "array" and isinstance(node.get("items"), Mapping):
        t = f"list of {_ref_type(node['items'])}"
    bounds = [f"≥ {node['minimum']}" if "minimum" in node else "", f"> {node['exclusiveMinimum']}"
              if "exclusiveMinimum" in node else "", f"≤ {node['maximum']}" if "maximum" in node else ""]
    bounds = [b for b in bounds if b]
    if "pattern" in node:
        bounds.append(f"matching `{node['pattern']}`")
    return t + (f" ({', '.join(bounds)})" if bounds else "")


def _ref_rows(node: Mapping[str, Any], prefix: str, required: Iterable[str] = ()) -> list[tuple[str, str, str, str]]:
    rows = []
    need = set(required)
    for key, sub in (node.get("properties") or {}).items():
        name = f"{prefix}.{key}" if prefix else key
        if "default" in sub:
            default = "`" + json.dumps(sub["default"], ensure_ascii=False) + "`"
        else:
            default = "required" if key in need else "—"
        desc = " ".join(str(sub.get("description", "")).split()).replace("|", "\\|")
        props = sub.get("properties") or next((o.get("properties") for o in sub.get("oneOf", [])
                                               if isinstance(o, Mapping) and o.get("properties")), None)
        kind = "mapping, below" if props and prefix else _ref_type(sub)
        if not prefix:
            continue
        rows.append((f"`{name}`", kind, default, desc))
        if props:
            inner = sub if sub.get("properties") else next(o for o in sub["oneOf"] if isinstance(o, Mapping)
                                                          and o.get("properties"))
            rows += _ref_rows(inner, name, inner.get("required", ()))
    return rows


def reference_markdown(schema: Mapping[str, Any] | None = None) -> str:
    """docs/config-reference.md: one table per top-level section of the schema (key, type, default, meaning)."""
    schema = schema or load_schema()
    out = [REFERENCE_HEADER]
    need = set(schema.get("required", ()))
    for section, node in schema["properties"].items():
        desc = " ".join(str(node.get("description", "")).split())
        out.append(f"## `{section}`{' (required)' if section in need else ''}\n\n{desc}\n")
        rows = _ref_rows(node, section, node.get("required", ()))
        if not rows:
            alts = [o for o in node.get("oneOf", []) if isinstance(o, Mapping)]
            obj = next((o for o in alts if o.get("properties")), None)
            rows = _ref_rows(obj, section, obj.get("required", ())) if obj else []
        if rows:
            out.append("| key | type | default | meaning |\n|---|---|---|---|")
            out += [f"| {k} | {t} | {d} | {m} |" for k, t, d, m in rows]
            out.append("")
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(reference_markdown())
