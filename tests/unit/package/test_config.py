"""Config loading: the default study, variants, schema defaults in sync with specs, bad input named."""

from __future__ import annotations

import copy
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from trainplan.config import (
    RULE_SECTIONS,
    config_slice,
    load_config,
    load_schema,
    require_proxy_executor,
    require_proxy_torch,
)
from trainplan.model.base import ConfigError
from trainplan.model.hardware import ClusterSpec

ROOT = Path(__file__).resolve().parents[3]
DEFAULT = ROOT / "config" / "config.yaml"


def raw() -> dict:
    return yaml.safe_load(DEFAULT.read_text())


def test_default_study_resolves_to_the_brief():
    c = load_config(DEFAULT)
    assert c.model.name == "llama2-13b" and c.model.n_params == 13_015_864_320  # HF config.json count
    assert (c.cluster.nodes, c.cluster.gpus_per_node, c.cluster.gpu.name) == (4, 8, "h100-sxm-80gb")
    assert (c.training.seq_len, c.training.global_batch, c.training.total_tokens) == (4096, 256, 10e9)
    assert c.training.finetune == "full" and c.layout is None
    assert c.cost["price_per_gpu_hour_usd"] == 3.0 and c.cost["price_range_usd"] == [2.0, 6.88]
    assert c.targets == {"window_h": 72, "budget_usd": 15000, "min_tokens_per_s_per_gpu": 4000}


def test_human_units_are_converted_to_si():
    c = load_config(DEFAULT)
    r = c.raw["cluster"]
    assert c.cluster.inter_busbw_Bps == r["inter_busbw_GBps"] * 1e9
    assert c.cluster.intra_latency_s == pytest.approx(r["intra_latency_us"] * 1e-6)


@pytest.mark.parametrize("variant", ["lora", "qlora", "seq8k", "tiny"])
def test_variants_overlay_the_default(variant):
    c = load_config([DEFAULT, ROOT / "config" / f"{variant}.yaml"])
    over = yaml.safe_load((ROOT / "config" / f"{variant}.yaml").read_text())
    for section, vals in over.items():
        for k, v in vals.items():
            assert c.raw[section][k] == v


def test_schema_cluster_defaults_match_clusterspec_defaults():
    """The schema's human-unit defaults and ClusterSpec's SI defaults must not drift apart."""
    props = load_schema()["properties"]["cluster"]["properties"]
    d = {f.name: f.default for f in fields(ClusterSpec)}
    assert props["intra_busbw_GBps"]["default"] * 1e9 == d["intra_busbw_Bps"]
    assert props["inter_busbw_GBps"]["default"] * 1e9 == d["inter_busbw_Bps"]
    assert props["intra_latency_us"]["default"] * 1e-6 == pytest.approx(d["intra_latency_s"])
    assert props["inter_latency_us"]["default"] * 1e-6 == pytest.approx(d["inter_latency_s"])
    assert props["nics_per_node"]["default"] == d["nics_per_node"]
    assert props["host_to_device_GBps"]["default"] * 1e9 == d["host_to_device_Bps"]
    assert props["host_mem_GB"]["default"] * 1e9 == d["host_mem_bytes"]


def test_every_schema_property_has_a_description():
    def walk(node, path):
        for k, sub in node.get("properties", {}).items():
            if path and path[0] in ("model", "layout"):
                continue
            assert "description" in sub or path[:1] == ["cost"] and k in ("interruptions", "days", "gpus", "source"), path + [k]
            walk(sub, path + [k])
    walk(load_schema(), [])


def test_kernel_and_attention_keys_reach_the_training_spec():
    r = raw()
    assert load_config(r).training.kernels == r["training"]["kernels"]
    r["training"].update(kernels="compiled", attn_impl="math")
    t = load_config(r).training
    assert (t.kernels, t.attn_impl) == ("compiled", "math")
    del r["training"]["kernels"], r["training"]["attn_impl"]
    t = load_config(r).training
    assert (t.kernels, t.attn_impl) == ("eager", "flash")  # schema defaults = TrainingSpec defaults


def test_defaults_are_filled():
    r = raw()
    del r["search"], r["cost"]["startup_h"]
    c = load_config(r)
    assert c.search["top_k"] == 10 and c.cost["startup_h"] == 0.5


BAD = [
    ("cluster.gpu", lambda r: r["cluster"].update(gpu="h1000")),
    ("training.seq_len", lambda r: r["training"].pop("seq_len")),
    ("training.global_batch", lambda r: r["training"].update(global_batch=-1)),
    ("training.global_batch", lambda r: r["training"].update(global_batch="many")),
    ("cost.price", lambda r: r["cost"].update(price=3)),
    ("layout", lambda r: r.update(layout={"dp": 8})),
    ("model", lambda r: r.update(model="gpt-17")),
    ("cost.price_range_usd", lambda r: r["cost"].update(price_per_gpu_hour_usd=9.0)),
    ("training.seq_len", lambda r: r["training"].update(seq_len=2**40)),  # bounded: no overflow downstream
    ("cluster.intra_busbw_GBps", lambda r: r["cluster"].update(intra_busbw_GBps=float("nan"))),
    ("cluster.inter_busbw_GBps", lambda r: r["cluster"].update(inter_busbw_GBps=float("inf"))),
    ("cost.startup_h", lambda r: r["cost"].update(startup_h=float("nan"))),
    ("cost.eval_overhead_frac", lambda r: r["cost"].update(eval_overhead_frac=float("inf"))),
    ("targets.budget_usd", lambda r: r["targets"].update(budget_usd=float("nan"))),
    ("training.dataset_tokens", lambda r: r["training"].update(dataset_tokens=float("-inf"))),
    ("cost.price_range_usd[1]", lambda r: r["cost"].update(price_range_usd=[2.0, float("nan")])),
    ("efficiency.gemm_eff_max", lambda r: r.update(efficiency={"gemm_eff_max": float("nan")})),
    ("study.results_dir", lambda r: r["study"].update(results_dir="")),
    ("study.results_dir", lambda r: r["study"].update(results_dir="/")),
    ("study.results_dir", lambda r: r["study"].update(results_dir="../elsewhere")),
    ("study.results_dir", lambda r: r["study"].update(results_dir="results/../..")),
    ("study.results_dir", lambda r: r["study"].update(results_dir=".")),
    ("proxies.warmup", lambda r: r["proxies"].update(warmup=8, steps=8)),
    ("proxies.nproc_per_node", lambda r: r["proxies"].update(nproc_per_node=16)),
    ("proxies.global_batch", lambda r: r["proxies"].update(nproc_per_node=3)),
    ("proxies.nproc_per_node", lambda r: r["proxies"].update(nproc_per_node=1_000_000)),
    ("proxies.nnodes", lambda r: r["proxies"].update(nnodes=5)),
    ("proxies.scaleout_world_sizes", lambda r: r["proxies"].update(scaleout_world_sizes=[1, 3])),
    ("proxies.scaleout_world_sizes", lambda r: r["proxies"].update(scaleout_world_sizes=[1_000_000])),
    ("launch.partition", lambda r: r["launch"].update(partition="gpu$(touch /tmp/pwned)")),
    ("launch.account", lambda r: r["launch"].update(account="a b")),
    ("launch.job_name", lambda r: r["launch"].update(job_name="x;rm -rf ~")),
    ("launch.time_limit_h", lambda r: r["launch"].update(time_limit_h=float("inf"))),
    ("launch.time_limit_h", lambda r: r["launch"].update(time_limit_h=1e9)),
    ("layout.shard_group", lambda r: r.update(layout={"dp": 32, "sharding": "zero3", "shard_group": 8})),
    ("layout.cp_kind", lambda r: r.update(layout={"dp": 32, "cp_kind": "ulysses"})),
    ("cluster.nodes", lambda r: r["cluster"].update(nodes=10**8)),
    ("cluster.gpus_per_node", lambda r: r["cluster"].update(gpus_per_node=10**20)),
    ("training.global_batch", lambda r: r["training"].update(global_batch=2**80)),
    ("search.micro_batches", lambda r: r["search"].update(micro_batches=list(range(1, 1000)))),
    ("calibration.bootstrap", lambda r: r["calibration"].update(bootstrap=10**12)),
    ("model.max_seq_len", lambda r: r.update(model={"preset": "llama2-13b", "max_seq_len": 0})),
    ("model.head_dim", lambda r: r.update(model={"preset": "llama2-13b", "head_dim": -1})),
    ("cluster.nodes", lambda r: r["cluster"].update(nodes=0)),
    ("training.kernels", lambda r: r["training"].update(kernels="triton")),
    ("training.attn_impl", lambda r: r["training"].update(attn_impl="sdpa")),
    ("calibration.source", lambda r: r["calibration"].update(source="cpu-proxies")),
    ("cost", lambda r: r.pop("cost")),  # was a KeyError traceback in the semantic checks
    ("training.global_batch", lambda r: r["training"].update(global_batch="2.55e1")),  # 25.5: not integral
    ("training.global_batch", lambda r: r["training"].update(global_batch="2e")),  # not a number at all
    ("training.dataset_tokens", lambda r: r["training"].update(dataset_tokens="1e999")),  # reads as inf
    ("layout.pp_schedule", lambda r: r.update(layout={"dp": 32, "pp_schedule": "interleaved"})),  # was ignored
    ("proxies.width_hidden", lambda r: r["proxies"].update(width_hidden=[64, 100])),  # 6 heads: failed in a job
    ("proxies.model_impl", lambda r: r.update(model={"preset": "llama2-13b", "mlp": "gelu"}) or r["proxies"].update(
        model_impl="hf")),  # transformers' Llama has no GELU MLP: failed in the select_proxies job
    ("model.kv_heads", lambda r: r.update(model={"preset": "llama2-13b", "layers": 32, "hidden": 2560, "heads": 16,
                                                 "vocab": 32000})),  # the preset's 40 KV heads
]


@pytest.mark.parametrize(("key", "mutate"), BAD, ids=[f"{k}-{i}" for i, (k, _) in enumerate(BAD)])
def test_bad_config_names_the_key(key, mutate):
    r = raw()
    mutate(r)
    with pytest.raises(ConfigError) as e:
        load_config(r)
    assert e.value.key.startswith(key), str(e.value)
    assert e.value.valid  # says what would be valid


def test_yaml12_exponent_numbers_are_numbers_whichever_loader_read_them(tmp_path):
    """``1.0e9`` is a number in YAML 1.2 and a string to YAML 1.1 loaders (PyYAML, hence Snakemake's --configfile):
    where the schema wants a number it is read as one, from a file and from an already-loaded dict alike."""
    text = DEFAULT.read_text()
    assert "dataset_tokens:" in text
    r = raw()
    r["training"].update(dataset_tokens="1.0e9", global_batch="2.56E2")  # as Snakemake's loader hands them over
    r["memo"]["title"] = "1e9"  # a string field keeps its string
    c = load_config(r)
    assert c.training.total_tokens == 1e9 and c.training.global_batch == 256
    assert isinstance(c.raw["training"]["global_batch"], int) and c.raw["memo"]["title"] == "1e9"
    f = tmp_path / "study.yaml"
    f.write_text(yaml.safe_dump({**raw(), "training": {**raw()["training"], "dataset_tokens": "X"}})
                 .replace("dataset_tokens: X", "dataset_tokens: 1.0e9"))
    assert yaml.safe_load(f.read_text())["training"]["dataset_tokens"] == "1.0e9"  # what YAML 1.1 makes of it
    assert load_config(f).training.total_tokens == 1e9


def test_efficiency_overrides_read_exponent_numbers():
    """The efficiency section has no per-key schema (its keys are Efficiency's fields), so ``2e9`` reached
    Efficiency.from_dict as the string YAML 1.1 made of it: 'must be a number'."""
    r = raw()
    r["efficiency"] = {"cpu_optimizer_params_per_s": "2e9", "runtime_overhead_bytes": "2.5e9"}
    c = load_config(r)
    assert c.efficiency.cpu_optimizer_params_per_s == 2e9 and c.efficiency.runtime_overhead_bytes == 2.5e9


def test_a_new_shape_over_a_preset_warns_and_preset_null_drops_it():
    """An overlay's model mapping merges onto config/config.yaml's ``preset: llama2-13b``: a whole new shape keeps the
    preset's MLP width and KV heads (a 2.7B planned as 4.4B), so that is a warning naming them, and ``preset: null``
    (which an overlay can write; it cannot delete a key) makes the mapping the whole architecture."""
    shape = {"name": "my-2.7b", "layers": 32, "hidden": 2560, "heads": 40, "vocab": 32000}
    r = raw()
    r["model"] = {"preset": "llama2-13b", **shape}
    c = load_config(r, warn=False)
    assert c.model.ffn_hidden == 13824 and any("ffn_hidden=13824 and kv_heads=40 are kept" in w for w in c.warnings)
    r["model"] = {"preset": None, **shape}
    c = load_config(r, warn=False)
    assert c.model.ffn_hidden == 6912 and c.model.kv_heads == 40 and not any("preset" in w for w in c.warnings)
    assert c.model.n_params == pytest.approx(2.7e9, rel=0.02)


def test_tp_not_dividing_heads_is_rejected_with_the_reason():
    r = raw()
    r["layout"] = {"dp": 8, "tp": 4, "sharding": "zero3"}
    r["model"] = {"preset": "llama2-13b", "heads": 40, "kv_heads": 40}
    load_config(r)  # tp=4 divides 40: fine
    r["layout"] = {"dp": 4, "tp": 8, "sharding": "zero3"}
    r["model"] = {"preset": "llama2-13b", "hidden": 5100, "heads": 12, "kv_heads": 12}
    with pytest.raises(ConfigError, match="tp=8 does not divide heads=12"):
        load_config(r)


def test_config_slice_has_only_the_rule_sections():
    c = load_config(DEFAULT)
    s = config_slice(c.raw, "cost_and_risk")
    assert set(s) == set(RULE_SECTIONS["cost_and_risk"]) and "proxies" not in s and "memo" not in s
    assert config_slice(c.raw, "memo") == c.raw
    r2 = copy.deepcopy(c.raw)
    r2["cost"]["price_per_gpu_hour_usd"] = 4.0
    assert config_slice(r2, "analytic_model") == config_slice(c.raw, "analytic_model")
    with pytest.raises(ConfigError):
        config_slice(c.raw, "no_such_rule")


def test_sequence_above_the_context_window_is_a_warning(capsys):
    r = raw()
    r["training"]["seq_len"] = 8192  # llama2-13b: max_position_embeddings 4096; RoPE scaling is common
    c = load_config(r)
    assert c.training.seq_len == 8192 and len(c.warnings) == 1 and "max_seq_len=4096" in c.warnings[0]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trainplan: warning: training.seq_len=8192")
    assert load_config(r, warn=False).warnings == c.warnings and capsys.readouterr().err == ""
    assert load_config(DEFAULT).warnings == ()


def test_an_a100_study_at_the_dgx_h100_link_defaults_is_warned_by_key(capsys):
    """cluster.gpu a100-80gb with the default study's NVLink4 busbw and PCIe Gen5 host link: one warning per link
    kind, each naming its config key; the A100's own figures silence both."""
    r = raw()
    r["cluster"]["gpu"] = "a100-80gb"
    c = load_config(r, warn=False)
    assert [w.split(" GB/s")[0] for w in c.warnings] == [
        "cluster.intra_busbw_GBps=360 and cluster.inter_busbw_GBps=46", "cluster.host_to_device_GBps=50"]
    r["cluster"].update(intra_busbw_GBps=230, inter_busbw_GBps=23, host_to_device_GBps=25)
    assert load_config(r, warn=False).warnings == ()


def test_learned_positions_and_sliding_windows_cap_the_sequence():
    r = raw()
    r["model"] = {"layers": 2, "hidden": 64, "heads": 4, "vocab": 100, "pos_embedding": "learned",
                  "max_seq_len": 1024}
    with pytest.raises(ConfigError, match="learned position") as e:
        load_config(r)
    assert e.value.key == "training.seq_len"
    r["model"] = {"preset": "llama2-7b", "sliding_window": 2048}
    with pytest.raises(ConfigError, match="sliding_window=2048"):
        load_config(r)


def test_custom_architecture_without_max_seq_len_has_no_cap():
    r = raw()
    r["training"]["seq_len"] = 65536
    r["model"] = {"layers": 2, "hidden": 256, "heads": 4, "vocab": 1000}
    c = load_config(r)
    assert c.warnings == () and c.model.max_seq_len == 65536
    r["model"]["pos_embedding"] = "learned"  # the table holds exactly the rows the sequence needs
    c = load_config(r)
    assert c.model.n_params_embedding == 2 * 1000 * 256 + 65536 * 256


def test_cluster_errors_name_the_human_unit_key():
    from trainplan.config import build_cluster

    c = {"nodes": 1, "gpus_per_node": 8, "gpu": "h100-sxm-80gb", "intra_busbw_GBps": 0, "inter_busbw_GBps": 46,
         "intra_latency_us": 30, "inter_latency_us": 50, "nics_per_node": 8, "host_to_device_GBps": 50,
         "host_mem_GB": 2000}
    with pytest.raises(ConfigError) as e:
        build_cluster(c)
    assert e.value.key == "intra_busbw_GBps" and e.value.value == 0


def test_launch_values_are_checked_at_config_time_and_never_reach_a_shell():
    r = raw()
    r["launch"].update(partition="gpu-a100_x.1", account="proj-1", job_name="llama13b.ft")
    assert load_config(r).launch["partition"] == "gpu-a100_x.1"
    for bad in ("$(id)", "`id`", "a;b", "a b", "a\nb", "", "x" * 200):
        r["launch"]["partition"] = bad
        with pytest.raises(ConfigError) as e:
            load_config(r)
        assert e.value.key == "launch.partition"


def test_proxy_defaults_fit_a_one_gpu_node():
    r = raw()
    r["cluster"].update(nodes=1, gpus_per_node=1)
    r["training"]["global_batch"] = 4
    del r["proxies"]
    c = load_config(r)
    assert c.proxies["nproc_per_node"] == 1 and c.proxies["scaleout_world_sizes"] == [1]
    r["proxies"] = {"nproc_per_node": 2}  # set by the user: checked, not changed
    with pytest.raises(ConfigError, match="at most cluster.gpus_per_node=1"):
        load_config(r)
    # set both: one error names both keys to lower, not one at a time
    r["proxies"] = {"nproc_per_node": 2, "scaleout_world_sizes": [1, 2]}
    with pytest.raises(ConfigError, match=r"scaleout_world_sizes=\[2\] must then come down too \(each at most 1\)"):
        load_config(r)


def test_the_default_config_leaves_the_proxy_ranks_to_the_cluster(tmp_path):
    """config/config.yaml sets neither nproc_per_node nor scaleout_world_sizes (their defaults, 2 and [1, 2]), so an
    overlay with one GPU per node plans as written: it was refused ('proxies.nproc_per_node=2: at most 1') unless the
    user also lowered both."""
    over = tmp_path / "one_gpu.yaml"
    over.write_text("cluster: {nodes: 4, gpus_per_node: 1}\n")
    c = load_config([DEFAULT, over], warn=False)
    assert c.proxies["nproc_per_node"] == 1 and c.proxies["scaleout_world_sizes"] == [1]
    assert load_config(DEFAULT, warn=False).proxies["nproc_per_node"] == 2


def test_a_key_with_a_newline_is_named_on_one_line():
    r = raw()
    r["study"]["na\nme"] = 1
    with pytest.raises(ConfigError) as e:
        load_config(r)
    assert "\n" not in str(e.value) and e.value.key == "study.na\\nme"


def test_zero_interruptions_is_a_finite_wall_clock():
    """failures.interruptions: 0 (a valid value) once gave wall-clock NaN (∞/∞ in the failure loss)."""
    import math

    from trainplan.cost.budget import stage_cost_and_risk

    r = raw()
    r["cost"]["failures"]["interruptions"] = 0
    c = load_config(r)
    prod = {"chosen": {"tokens_per_s_per_gpu_p10": 4000.0, "tokens_per_s_per_gpu_p50": 4500.0,
                       "tokens_per_s_per_gpu_p90": 5000.0, "layout": {}}, "source": "defaults"}
    doc, _ = stage_cost_and_risk(prod, n_params=c.model.n_params, n_gpus=c.cluster.n_gpus,
                                 total_tokens=c.training.total_tokens, d2h_Bps=c.cluster.host_to_device_Bps,
                                 cost_cfg=c.cost, targets=c.targets)
    assert math.isfinite(doc["goodput_frac"]) and 0 < doc["goodput_frac"] <= 1
    assert doc["expected_interruptions"] == 0 or math.isfinite(doc["expected_interruptions"])
    assert doc["p_any_interruption"] == 0.0 if doc["expected_interruptions"] == 0 else doc["p_any_interruption"] > 0
    # no failures: MTBF and checkpoint interval are +inf in every sample, and so is their p10–p90 (it read NaN)
    for k in ("job_mtbf_h", "checkpoint_interval_h"):
        assert doc["detail"]["intervals"][k] == {"p10": math.inf, "p50": math.inf, "p90": math.inf}, k


SCHEMA_KEYWORDS = {"type", "description", "default", "enum", "minimum", "maximum", "exclusiveMinimum", "minLength",
                   "maxLength", "items", "minItems", "maxItems", "uniqueItems", "properties", "additionalProperties",
                   "required", "oneOf", "pattern", "$schema", "title"}


def _property_nodes(node, path=""):
    for key, sub in (node.get("properties") or {}).items():
        yield f"{path}.{key}".lstrip("."), sub
        yield from _property_nodes(sub, f"{path}.{key}")
        for alt in sub.get("oneOf", []):
            yield from _property_nodes(alt, f"{path}.{key}")


def test_every_schema_key_is_described_and_uses_only_schema_keywords():
    """An unquoted YAML flow value stops at its first comma: 'description: bandwidth, GB/s.' made 'GB/s.' a key of
    its own and cut the description (five such keys). Every property has a description for the reference."""
    for path, node in _property_nodes(load_schema()):
        assert set(node) <= SCHEMA_KEYWORDS, (path, set(node) - SCHEMA_KEYWORDS)
        assert str(node.get("description", "")).strip(), f"{path}: no description"


def test_the_config_reference_is_generated_from_the_schema():
    """docs/config-reference.md is `python -m trainplan.config`'s output: regenerate it when the schema changes."""
    from trainplan.config import reference_markdown

    committed = (ROOT / "docs/config-reference.md").read_text(encoding="utf-8")
    assert committed == reference_markdown(), "stale: python -m trainplan.config > docs/config-reference.md"
    for path, _ in _property_nodes(load_schema()):
        assert f"`{path}`" in committed


def test_gpu_proxies_need_a_cuda_build_of_torch_in_the_jobs_interpreter():
    """With the Slurm profile every proxy job runs the venv's interpreter, whose torch setup.sh makes the CPU wheel:
    `proxies.device: cuda` then failed on the GPU nodes after queueing (no CUDA, no NCCL), retried twice. Refused at
    parse time instead, naming the key and the fix; a CUDA build, CPU proxies or no proxy family pass."""
    with pytest.raises(ConfigError, match=r"CUDA build of torch.*2\.13\.0\+cpu.*TRAINPLAN_TORCH=cuda") as e:
        require_proxy_torch({"device": "cuda"}, "2.13.0+cpu")
    assert e.value.key == "proxies.device"
    with pytest.raises(ConfigError, match="not installed"):
        require_proxy_torch({"device": "cuda"}, "not installed")
    require_proxy_torch({"device": "cuda"}, "2.13.0")  # PyPI's Linux wheel: the CUDA build
    require_proxy_torch({"device": "cuda"}, "2.13.0+cu126")
    require_proxy_torch({"device": "cpu"}, "2.13.0+cpu")
    require_proxy_torch({"device": "cuda", "families": []}, "2.13.0+cpu")  # nothing runs


def test_multi_node_proxies_are_refused_under_the_local_executor_only_while_a_proxy_is_pending():
    """``proxies.nnodes: 2`` under ``snakemake --cores N`` used to pass parse time and fail in every multi-node proxy
    job ("not a Slurm job"), after the analytic stage and the one-node proxies had run. Refused in ``onstart`` now,
    where the executor is first known; a cluster executor, one node, no proxy family, or nothing left to run
    (records made on the cluster, the memo rebuilt here) pass."""
    two = {"nnodes": 2, "families": ["depth"]}
    for pending in (["analytic_model", "select_proxies", "memo"], ["proxy_run", "aggregate"]):
        with pytest.raises(ConfigError, match=r"1 for a local run.*--profile slurm") as e:
            require_proxy_executor(two, "local", iter(pending))
        assert (e.value.key, e.value.value) == ("proxies.nnodes", 2)
    require_proxy_executor(two, "slurm", ["select_proxies"])
    require_proxy_executor(two, None, ["select_proxies"])  # no executor known: not refused on a guess
    require_proxy_executor({**two, "nnodes": 1}, "local", ["select_proxies"])
    require_proxy_executor({**two, "families": []}, "local", ["select_proxies"])
    require_proxy_executor(two, "local", ["calibrate", "memo"])


def test_an_unknown_key_error_lists_the_valid_keys():
    r = raw()
    r["cost"]["price_per_gpu_hour"] = 3.0  # typo of price_per_gpu_hour_usd
    with pytest.raises(ConfigError) as e:
        load_config(r)
    assert e.value.key == "cost.price_per_gpu_hour"
    assert "price_per_gpu_hour_usd" in e.value.valid and "restart_h" in e.value.valid


def test_a_zero_width_calibration_interval_is_refused():
    r = raw()
    r["calibration"]["interval"] = [0.5, 0.5]
    with pytest.raises(ConfigError) as e:
        load_config(r)
    assert e.value.key == "calibration.interval"
