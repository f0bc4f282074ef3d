"""RUN_SPEC parsing (defaults, ConfigError on bad input) and the RECORD JSON schema (docs/proxy-record.md)."""

from __future__ import annotations

from typing import Any

from trainplan.model.arch import ModelSpec, hf_unsupported_reason, resolve_model
from trainplan.model.base import ConfigError
from trainplan.model.layout import Layout

FAMILIES = ("depth", "width", "scaleout", "layout", "preflight")
RUN_DEFAULTS: dict[str, Any] = {
    "family": "layout", "seq_len": 128, "global_batch": 4, "steps": 20, "warmup": 3, "nproc_per_node": 1,
    "nnodes": 1, "device": "cpu", "dtype": "fp32", "finetune": "full", "lora_rank": 8, "lora_targets": ["q", "v"],
    "compile": False, "seed": 0, "timeout_s": 300, "mem_limit_bytes": None, "data": "synthetic", "lr": 3e-3,
    "model_impl": "trainplan",
}
STATUSES = ("ok", "oom", "timeout", "error")
# trainplan: the harness's own Transformer; hf: transformers' LlamaForCausalLM (proxy.model.build_model's impl)
MODEL_IMPLS = ("trainplan", "hf")


def _choice(spec: dict, key: str, allowed: tuple) -> None:
    if spec[key] not in allowed:
        raise ConfigError(key, spec[key], "must be one of " + ", ".join(map(str, allowed)))


RUN_MAX = {"nproc_per_node": 1024, "nnodes": 1024, "seq_len": 2**21, "global_batch": 2**20, "steps": 100_000,
           "warmup": 100_000, "lora_rank": 65536, "timeout_s": 7 * 86400, "seed": 2**32 - 1}  # no 10⁶-rank spec


def _pos_int(spec: dict, key: str, minimum: int = 1) -> None:
    v, hi = spec[key], RUN_MAX.get(key, 2**31)
    if isinstance(v, bool) or not isinstance(v, int) or not minimum <= v <= hi:
        raise ConfigError(key, v, f"must be an integer in {minimum}..{hi}")


def uses_autocast(layout: Layout, dtype: str) -> bool:
    """Whether a bf16 proxy runs under ``torch.autocast`` over fp32 parameters (``proxy.run``): when nothing is
    sharded or there is one data-parallel rank, since ``parallelize`` applies FSDP2 (and its bf16
    ``MixedPrecisionPolicy``) only with dp > 1 and a sharding."""
    return dtype == "bf16" and (layout.sharding == "none" or layout.dp == 1)


def normalize_run_spec(raw: dict) -> dict[str, Any]:
    """RUN_SPEC with defaults filled in and every field checked; ``model``/``layout`` as plain dicts."""
    if not isinstance(raw, dict):
        raise ConfigError("run_spec", type(raw).__name__, "a JSON object (see docs/ARCHITECTURE.md RUN_SPEC)")
    known = set(RUN_DEFAULTS) | {"id", "model", "layout"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(unknown[0], raw[unknown[0]], "unknown RUN_SPEC key; valid: " + ", ".join(sorted(known)))
    for k in ("id", "model", "layout"):
        if k not in raw:
            raise ConfigError(k, None, "required in a RUN_SPEC")
    spec = {**RUN_DEFAULTS, **raw}
    if not isinstance(spec["id"], str) or not spec["id"] or "/" in spec["id"]:
        raise ConfigError("id", spec["id"], "a non-empty string without '/'")
    model: ModelSpec = resolve_model(spec["model"])
    layout = Layout.from_dict(spec["layout"]) if isinstance(spec["layout"], dict) else None
    if layout is None:
        raise ConfigError("layout", spec["layout"], "a JSON object of Layout fields")
    spec["model"], spec["layout"] = model.to_dict(), layout.to_dict()
    _choice(spec, "family", FAMILIES)
    _choice(spec, "device", ("cpu", "cuda"))
    _choice(spec, "dtype", ("fp32", "bf16"))
    _choice(spec, "finetune", ("full", "lora"))
    _choice(spec, "data", ("synthetic",))
    _choice(spec, "model_impl", MODEL_IMPLS)
    for k in ("seq_len", "global_batch", "steps", "nproc_per_node", "nnodes", "lora_rank", "timeout_s"):
        _pos_int(spec, k)
    _pos_int(spec, "warmup", 0)
    _pos_int(spec, "seed", 0)
    if spec["warmup"] >= spec["steps"]:
        raise ConfigError("warmup", spec["warmup"], f"must be < steps={spec['steps']} (timed steps follow warm-up)")
    world = spec["nproc_per_node"] * spec["nnodes"]
    if layout.world_size != world:
        raise ConfigError("layout", layout.describe(),
                          f"dp·tp·pp·cp = {layout.world_size} but nproc_per_node·nnodes = {world}")
    if spec["global_batch"] % (layout.dp * layout.micro_batch):
        raise ConfigError("global_batch", spec["global_batch"],
                          f"a multiple of dp·micro_batch = {layout.dp}·{layout.micro_batch}")
    if spec["seq_len"] > model.max_seq_len:
        raise ConfigError("seq_len", spec["seq_len"], f"≤ max_seq_len={model.max_seq_len}")
    if layout.sp and spec["seq_len"] % layout.tp:
        raise ConfigError("seq_len", spec["seq_len"], f"divisible by tp={layout.tp} with sequence parallelism")
    if model.heads % layout.tp or model.kv_heads % layout.tp or model.ffn_hidden % layout.tp:
        raise ConfigError("layout.tp", layout.tp, "must divide heads, kv_heads and ffn_hidden")
    if spec["finetune"] == "lora" and layout.tp > 1:
        raise ConfigError("finetune", "lora", "LoRA proxies run with dp only (tp=1)")
    if spec["model_impl"] == "hf":
        _check_hf(spec, model, layout)
    m = spec["mem_limit_bytes"]
    if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
        raise ConfigError("mem_limit_bytes", m, "null or a positive integer (bytes per rank)")
    spec["lora_targets"] = list(spec["lora_targets"])
    return spec


def _check_hf(spec: dict, model: ModelSpec, layout: Layout) -> None:
    """What the Hugging Face model cannot run, refused before start (not an ``error`` record later)."""
    if layout.tp > 1:
        raise ConfigError("model_impl", "hf", "TP proxies run the harness's own model (transformers' "
                          "LlamaForCausalLM has no DTensor TP plan here): model_impl trainplan, or tp=1")
    if spec["finetune"] == "lora":
        raise ConfigError("model_impl", "hf", "LoRA proxies run the harness's own model (its adapter wraps "
                          "attention.wq/wv): model_impl trainplan, or finetune full")
    why = hf_unsupported_reason(model)
    if why:
        raise ConfigError("model_impl", "hf", f"{model.name} is not expressible as LlamaForCausalLM: {why}")


_NUM = {"type": ["number", "null"]}
_INT = {"type": ["integer", "null"]}

RECORD_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "trainplan proxy RECORD",
    "type": "object",
    "required": ["schema_version", "id", "status", "message", "spec", "environment", "timing", "loss",
                 "flops", "memory", "comm", "params", "predicted"],
    "properties": {
        "schema_version": {"const": 1},
        "id": {"type": "string"},
        "status": {"enum": list(STATUSES)},
        "message": {"type": "string"},
        "spec": {"type": "object", "required": ["model", "layout", "seq_len", "global_batch"]},
        "environment": {"type": "object", "properties": {
            "torch_version": {"type": "string"}, "device_name": {"type": "string"},
            "world_size": {"type": "integer"}, "backend": {"type": "string"}, "hostname_count": {"type": "integer"},
            "slurm_nodes": {"type": "array", "items": {"type": "string"}},
            "alloc_conf": {"type": ["string", "null"]},
            "compiled_graphs": {"type": "integer", "minimum": 0}}},
        "timing": {"type": "object", "properties": {
            "step_times_s": {"type": "array", "items": {"type": "number"}},
            "step_time_median_s": _NUM, "step_time_p10_s": _NUM, "step_time_p90_s": _NUM,
            "tokens_per_s": _NUM, "tokens_per_step": _INT, "wall_s": _NUM}},
        "loss": {"type": "array", "items": {"type": "number"}},
        "flops": {"type": "object", "properties": {
            "measured_total_per_rank_step": _INT, "attention_recompute_per_rank_step": _INT,
            "measured_model_per_rank_step": _INT, "analytic_model_per_rank_step": _NUM, "by_op": {"type": "object"}}},
        "memory": {"type": "object", "properties": {
            "state_bytes_per_rank": {"type": "array"}, "saved_activations": {"type": ["object", "null"]},
            "cuda_max_allocated_bytes": _INT, "cuda_max_reserved_bytes": _INT, "mem_limit_bytes": _INT}},
        "comm": {"type": "object", "additionalProperties": {
            "type": "object", "required": ["calls", "bytes"],
            "properties": {"calls": {"type": "integer"}, "bytes": {"type": "integer"}}}},
        "params": {"type": "object", "properties": {"module": _INT, "spec": _INT, "trainable": _INT}},
        "predicted": {"type": "object"},
    },
}


def validate_record(record: dict) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``record`` matches :data:`RECORD_SCHEMA`."""
    import jsonschema

    jsonschema.validate(record, RECORD_SCHEMA)
