"""Proxy model, LoRA, RUN_SPEC parsing, selection and aggregation (fast, single process)."""

import pandas as pd
import pytest
import torch

from trainplan.model.arch import MODEL_PRESETS, ModelSpec
from trainplan.model.base import ConfigError
from trainplan.model.layout import Layout
from trainplan.model.training import TrainingSpec
from trainplan.proxy import torchrun as tr
from trainplan.proxy.aggregate import record_row, rel_err
from trainplan.proxy.analytic import exact_state_bytes
from trainplan.proxy.lora import apply_lora, lora_trainable_params
from trainplan.proxy.model import build_model, n_params
from trainplan.proxy.record import _status, assemble_record
from trainplan.proxy.schema import normalize_run_spec
from trainplan.proxy.select import select_proxies
from trainplan.proxy.slurm_resources import proxy_job_resources


@pytest.mark.parametrize("name", sorted(MODEL_PRESETS))
def test_module_param_count_equals_spec_for_every_preset(name):
    spec = MODEL_PRESETS[name]
    assert n_params(build_model(spec, device="meta")) == spec.n_params


@pytest.mark.parametrize("kw", [
    {"mlp": "gelu", "norm": "layernorm", "bias": "all", "pos_embedding": "learned"},
    {"mlp": "gelu", "norm": "layernorm", "norm_bias": False, "pos_embedding": "alibi", "tied_embeddings": True},  # MPT
    {"mlp": "gelu", "norm": "layernorm", "bias": "all", "pos_embedding": "learned", "pos_offset": 2},  # OPT
    {"bias": "qkv", "tied_embeddings": True},
    {"mlp": "gelu", "norm": "layernorm", "bias": "mlp", "head_bias": True},  # GPT-J
    {"bias": "mlp", "head_bias": True, "tied_embeddings": True},
    {"bias": "all"},
    {"mlp": "gelu", "norm": "layernorm", "bias": "o_mlp", "pos_embedding": "learned", "tied_embeddings": True},  # GPT-Neo
    {"norm": "layernorm", "bias": "qkv"},  # StableLM with use_qkv_bias: LayerNorm with a gated MLP
    {"mlp": "gelu", "norm": "layernorm", "bias": "all", "pos_embedding": "alibi", "embed_norm": True,
     "tied_embeddings": True},  # BLOOM
])
def test_module_param_count_equals_spec_for_variants(kw):
    spec = ModelSpec(layers=2, hidden=64, heads=4, kv_heads=2, vocab=100, **kw)
    assert n_params(build_model(spec, device="meta")) == spec.n_params


def test_forward_gives_logits_and_is_seeded():
    spec = MODEL_PRESETS["debug"]
    x = torch.randint(0, spec.vocab, (2, 16))
    a, b = build_model(spec, seed=1)(x), build_model(spec, seed=1)(x)
    assert a.shape == (2, 16, spec.vocab)
    assert torch.equal(a, b)
    assert not torch.equal(a, build_model(spec, seed=2)(x))


def test_lora_freezes_base_and_counts_adapters():
    spec = MODEL_PRESETS["debug"]
    m = build_model(spec)
    x = torch.randint(0, spec.vocab, (1, 8))
    before = m(x)
    apply_lora(m, 4, ["q", "v", "down"])
    trainable = sum(p.numel() for p in m.parameters() if p.requires_grad)
    assert trainable == lora_trainable_params(spec, 4, ["q", "v", "down"])
    assert torch.allclose(m(x), before)  # B starts at zero
    with pytest.raises(ConfigError, match="lora_targets"):
        apply_lora(build_model(spec), 4, ["nope"])


def _spec(**kw):
    return {"id": "x", "model": "debug", "layout": {"dp": 2}, "nproc_per_node": 2, **kw}


def test_run_spec_defaults_and_errors_name_the_key():
    s = normalize_run_spec(_spec())
    assert s["model"]["hidden"] == 64 and s["steps"] == 20 and s["layout"]["sharding"] == "zero3"
    for bad, key in [({"steps": 0}, "steps"), ({"device": "tpu"}, "device"), ({"nproc_per_node": 4}, "layout"),
                     ({"bogus": 1}, "bogus"), ({"warmup": 30}, "warmup"), ({"global_batch": 3}, "global_batch"),
                     ({"mem_limit_bytes": -1}, "mem_limit_bytes")]:
        with pytest.raises(ConfigError) as e:
            normalize_run_spec(_spec(**bad))
        assert e.value.key == key


def test_select_proxies_covers_every_family_with_valid_specs():
    df = pd.DataFrame([{**Layout(dp=32).to_dict(), "family": "FSDP", "feasible": True, "rank": 1},
                       {**Layout(dp=4, tp=8, sp=True).to_dict(), "family": "FSDP×TP+SP", "feasible": True, "rank": 2}])
    cfg = {"device": "cpu", "nproc_per_node": 2, "seq_len": 64, "global_batch": 4,
           "depth_layers": [1, 2], "width_hidden": [64, 128], "scaleout_world_sizes": [1, 2]}
    specs = select_proxies(df, MODEL_PRESETS["llama2-13b"], TrainingSpec(seq_len=4096, global_batch=256), cfg)
    ids = [s["id"] for s in specs]
    assert len(ids) == len(set(ids))
    assert {s["family"] for s in specs} == {"depth", "width", "scaleout", "layout"}
    layouts = [Layout.from_dict(s["layout"]) for s in specs]
    assert {"DDP", "FSDP", "HSDP"} <= {x.family for x in layouts}
    assert any(x.tp > 1 and not x.sp for x in layouts) and any(x.tp > 1 and x.sp for x in layouts)  # TP, TP+SP
    assert any(s["finetune"] == "lora" for s in specs)
    for s in specs:
        n = normalize_run_spec(s)
        assert n["model"]["hidden"] <= 256 and n["seq_len"] == 64  # CPU: debug sizes
    capped = select_proxies(df, MODEL_PRESETS["llama2-13b"], TrainingSpec(seq_len=4096, global_batch=256),
                            {**cfg, "max_proxies": 4})
    assert len(capped) == 4 and len({s["family"] for s in capped}) == 4


@pytest.mark.parametrize("preset", [k for k in MODEL_PRESETS if not k.startswith("debug")])
def test_select_proxies_gives_every_preset_runnable_specs_tp_included(preset):
    """A 64k-context Llama-3.1-8B study stopped at its first TP proxy: CPU width 64 gives 4 heads, and Llama 3's
    GQA group of 4 left one KV head, which TP 2 cannot split ("layout.tp=2: must divide heads, kv_heads"). The
    CPU model now shrinks the group to what the proxy's TP degree divides, and keeps GQA where it can."""
    model = MODEL_PRESETS[preset]
    df = pd.DataFrame([{**Layout(dp=4, tp=8, sp=True).to_dict(), "family": "FSDP×TP", "feasible": True, "rank": 1},
                       {**Layout(dp=32).to_dict(), "family": "FSDP", "feasible": True, "rank": 2}])
    cfg = {"device": "cpu", "nproc_per_node": 2, "seq_len": 64, "global_batch": 4,
           "depth_layers": [1, 2], "width_hidden": [64, 128], "scaleout_world_sizes": [1, 2]}
    specs = select_proxies(df, model, TrainingSpec(seq_len=4096, global_batch=256), cfg)
    assert any(s["layout"]["tp"] == 2 for s in specs)  # the depth/width slices run the best layout, TP 2
    for s in specs:
        n = normalize_run_spec(s)  # raised ConfigError('layout.tp') for the GQA presets
        m, tp = n["model"], n["layout"]["tp"]
        assert m["heads"] % tp == 0 and m["kv_heads"] % tp == 0
        if model.kv_heads < model.heads:
            assert m["kv_heads"] < m["heads"]  # still grouped-query attention, as the production model


def test_select_proxies_keeps_production_widths_on_cuda():
    df = pd.DataFrame([{**Layout(dp=32).to_dict(), "family": "FSDP", "feasible": True, "rank": 1}])
    specs = select_proxies(df, MODEL_PRESETS["llama2-13b"], TrainingSpec(seq_len=4096, global_batch=256),
                           {"device": "cuda", "nproc_per_node": 8, "global_batch": 8, "families": ["depth"],
                            "depth_layers": [2]})
    assert specs[0]["model"]["hidden"] == 5120 and specs[0]["model"]["layers"] == 2


def test_run_spec_model_impl_defaults_to_trainplan_and_hf_refuses_what_it_cannot_run():
    assert normalize_run_spec(_spec())["model_impl"] == "trainplan"
    assert normalize_run_spec(_spec(model_impl="hf"))["model_impl"] == "hf"
    for bad, why in [({"model_impl": "jax"}, "one of trainplan, hf"),
                     ({"model_impl": "hf", "layout": {"tp": 2, "sharding": "none"}}, "TP proxies"),
                     ({"model_impl": "hf", "finetune": "lora"}, "LoRA proxies"),
                     ({"model_impl": "hf", "model": {**MODEL_PRESETS["debug"].to_dict(), "mlp": "gelu"}}, "mlp=gelu")]:
        with pytest.raises(ConfigError, match=why) as e:
            normalize_run_spec(_spec(**bad))
        assert e.value.key == "model_impl"


def test_select_proxies_with_model_impl_hf_leaves_out_tp_and_lora_runs():
    df = pd.DataFrame([{**Layout(dp=1, tp=32).to_dict(), "family": "TP", "feasible": True, "rank": 1},
                       {**Layout(dp=32).to_dict(), "family": "FSDP", "feasible": True, "rank": 2}])
    cfg = {"device": "cpu", "nproc_per_node": 2, "seq_len": 64, "global_batch": 4, "model_impl": "hf",
           "depth_layers": [1, 2], "width_hidden": [64, 128], "scaleout_world_sizes": [1, 2]}
    train = TrainingSpec(seq_len=4096, global_batch=256)
    specs = select_proxies(df, MODEL_PRESETS["llama2-13b"], train, cfg)
    assert {s["family"] for s in specs} == {"depth", "width", "scaleout", "layout"}  # depth/width: best is TP → FSDP
    assert all(s["model_impl"] == "hf" and s["layout"]["tp"] == 1 and s["finetune"] == "full" for s in specs)
    assert {"DDP", "FSDP", "HSDP"} <= {Layout.from_dict(s["layout"]).family for s in specs}
    assert all(normalize_run_spec(s)["model_impl"] == "hf" for s in specs)
    default = select_proxies(df, MODEL_PRESETS["llama2-13b"], train, {k: v for k, v in cfg.items() if k != "model_impl"})
    assert all("model_impl" not in s for s in default)  # the default RUN_SPECs (and their hashes) are unchanged
    with pytest.raises(ConfigError, match="proxies.model_impl"):
        select_proxies(df, ModelSpec(layers=2, hidden=64, heads=4, vocab=100, mlp="gelu"), train, cfg)


def test_config_proxies_model_impl_defaults_to_trainplan_and_is_checked():
    from pathlib import Path

    import yaml

    from trainplan.config import load_config

    raw = yaml.safe_load((Path(__file__).resolve().parents[3] / "config" / "config.yaml").read_text())
    assert load_config(raw).proxies["model_impl"] == "trainplan"
    assert load_config({**raw, "proxies": {**raw["proxies"], "model_impl": "hf"}}).proxies["model_impl"] == "hf"
    with pytest.raises(ConfigError) as e:
        load_config({**raw, "proxies": {**raw["proxies"], "model_impl": "jax"}})
    assert e.value.key == "proxies.model_impl"


def test_compile_true_compiles_after_the_instrumented_step(monkeypatch):
    """Step 0 runs under the FLOP counter (a dispatch mode with global module hooks), which makes dynamo skip the
    compiled blocks for good; the harness resets dynamo after it, so `compile: true` compiles (an H200 run before
    the reset trained eagerly: docs/timing-model.md §7.9). The record counts the graphs."""
    import torch
    from torch._dynamo.utils import counters

    from trainplan.proxy.run import train

    monkeypatch.setenv("TRAINPLAN_COMPILE_BACKEND", "eager")  # dynamo traces; no code generation (no compiler)
    counters.clear()
    torch._dynamo.reset()
    spec = normalize_run_spec({"id": "c", "model": "debug", "layout": {"dp": 1, "sharding": "none"}, "seq_len": 16,
                               "global_batch": 2, "steps": 3, "warmup": 2, "nproc_per_node": 1, "compile": True})
    res = train(spec, 0, 1)
    assert res["status"] == "ok" and res["environment"]["compiled_graphs"] >= 1
    torch._dynamo.reset()


def test_bf16_on_one_rank_is_autocast_and_its_record_predicts_the_saves_to_the_byte():
    """One rank in bf16 trains under torch.autocast over fp32 weights (proxy.schema.uses_autocast). What the block and
    the head save for backward (the harness's saved_tensors_hooks) equals the RECORD's own prediction
    (proxy.analytic, memory.py's autocast terms): fp32 residual stream, a bf16 cast per linear, the weight copies."""
    from trainplan.model import memory
    from trainplan.proxy.analytic import analytic_memory
    from trainplan.proxy.run import train

    model = {"name": "ac", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 160, "vocab": 128}
    spec = normalize_run_spec({"id": "ac", "model": model, "layout": {"dp": 1, "sharding": "none"}, "seq_len": 32,
                               "global_batch": 2, "steps": 1, "warmup": 0, "nproc_per_node": 1, "dtype": "bf16"})
    saved = train(spec, 0, 1)["saved"]
    m, lay = ModelSpec(**model), Layout(dp=1, sharding="none")
    pred = analytic_memory(m, lay, 32, 2, "bf16", "full", 8, [], device="cpu")
    assert pred["bf16_via"] == "autocast"
    assert saved["complete"] and saved["mean_layer_bytes"] == pred["activation_bytes_per_layer"]
    assert saved["non_layer_bytes"]["norm"] + saved["non_layer_bytes"]["output"] == pred["head_saved_bytes"]
    bf16_params = memory.saved_activation_bytes_per_layer(m, 32, 1, dtype_bytes=2, norm_impl="composite",
                                                          sac_policy="matmul", sp_impl="pytorch")
    assert pred["activation_bytes_per_layer"] > bf16_params  # the regime is what makes it exact


def test_select_proxies_places_the_proxy_world_on_nnodes_nodes():
    """``proxies.nnodes: 2`` used to be folded into the ranks per node (every spec ``nnodes: 1``, 16 ranks): under
    the Slurm profile that asked one node for ``--gres=gpu:16``, which sbatch refuses on 8-GPU nodes. The world-sized
    runs now span ``nnodes`` nodes of ``nproc_per_node`` ranks, and the scale-out ladder stays on one node."""
    df = pd.DataFrame([{**Layout(dp=32).to_dict(), "family": "FSDP", "feasible": True, "rank": 1}])
    cfg = {"device": "cuda", "nproc_per_node": 8, "nnodes": 2, "global_batch": 16, "depth_layers": [2],
           "width_hidden": [1280], "scaleout_world_sizes": [1, 8]}
    specs = select_proxies(df, MODEL_PRESETS["llama2-13b"], TrainingSpec(seq_len=4096, global_batch=256), cfg)
    by_family = {}
    for s in specs:
        by_family.setdefault(s["family"], set()).add((s["nnodes"], s["nproc_per_node"]))
        normalize_run_spec(s)  # world = nproc_per_node · nnodes = the layout's ranks
        res = proxy_job_resources(s)
        assert res["gres"] == f"gpu:{s['nproc_per_node']}" and res["nodes"] == s["nnodes"]
    assert by_family["depth"] == by_family["width"] == by_family["layout"] == {(2, 8)}
    assert by_family["scaleout"] == {(1, 1), (1, 8)}


def test_multinode_proxy_srun_gives_each_node_task_its_cpus_and_a_port_per_job(monkeypatch):
    """Since Slurm 22.05 a step does not inherit the job's --cpus-per-task (and the jobstep plugin strips the
    variables that would pass it on): the proxy's srun names it, or all ranks of a node share one CPU. The
    rendezvous port follows the job id, so two proxies whose allocations share a first node do not collide."""
    monkeypatch.setattr(tr, "first_slurm_host", lambda: "node1")
    spec = {"id": "x", "nnodes": 2, "nproc_per_node": 4, "device": "cpu"}
    env = {"SLURM_JOB_ID": "123456", "SLURM_JOB_NUM_NODES": "2"}
    argv = tr.torchrun_command(spec, "s.json", "r", env)
    assert argv[:5] == ["srun", "--nodes=2", "--ntasks-per-node=1",
                        f"--cpus-per-task={proxy_job_resources(spec)['cpus_per_task']}", "--kill-on-bad-exit=1"]
    assert "--rdzv-endpoint=node1:23456" in argv
    assert tr.rdzv_port({"SLURM_JOB_ID": "123457"}) != tr.rdzv_port(env) and tr.rdzv_port({}) == tr.RDZV_PORT
    with pytest.raises(ConfigError, match="not a Slurm job.*profile slurm"):
        tr.torchrun_command(spec, "s.json", "r", {})
    local = tr.torchrun_command({**spec, "nnodes": 1}, "s.json", "r", {})
    assert "--standalone" in local and "srun" not in local


@pytest.mark.parametrize(("statuses", "timed_out", "rc", "want"), [
    (["ok", "ok"], False, 0, "ok"),
    (["ok", "oom"], False, 1, "oom"),
    (["ok", "oom"], True, -9, "oom"),  # an OOM is a result even when the launcher was then killed
    (["ok", "ok"], True, -9, "timeout"),
    (["ok", "error"], False, 1, "error"),
    (["ok", "ok"], False, 1, "error"),  # the launcher failed: no result, whatever the ranks wrote
])
def test_run_status_from_the_ranks_and_the_launcher(statuses, timed_out, rc, want):
    """oom (a result: the layout does not fit) outranks a timeout, which outranks an error; a launcher that exited
    non-zero makes the run an error even if every rank reported ok."""
    ranks = [{"rank": i, "status": s, "message": "" if s == "ok" else s} for i, s in enumerate(statuses)]
    assert _status(ranks, timed_out, rc)[0] == want


def _rank(r: int, spec: dict) -> dict:
    exact = exact_state_bytes(ModelSpec.from_dict(spec["model"]), Layout.from_dict(spec["layout"]))
    return {"rank": r, "status": "ok", "state": exact, "exact_state": exact, "footprint_bytes": 0,
            "saved": {"mean_layer_bytes": 1000.0, "complete": False}, "loss": [5.5, 5.4, 5.3],
            "timing": {"step_time_median_s": 0.5}, "flops": {"total": 1000.0, "attention_recompute": 100.0, "by_op": {}},
            "environment": {"world_size": 2, "backend": "gloo", "hostname": "h"}}


def test_record_measured_figures_and_their_comparison_columns():
    """Model FLOPs measured = total − the attention recompute; they are compared with the analytic *hardware* FLOPs
    (recompute included); an incomplete saved-activation count is not compared; rel_err = predicted/measured − 1;
    an OOM run keeps no rank's loss or timing."""
    spec = normalize_run_spec({"id": "depth-L2", "model": {"preset": "debug", "layers": 2},
                               "layout": {"dp": 2, "recompute": "full"}, "seq_len": 64, "global_batch": 4, "steps": 3,
                               "warmup": 1, "nproc_per_node": 2})
    rec = assemble_record(spec, [_rank(0, spec), _rank(1, spec)], timed_out=False, returncode=0, wall_s=1.0)
    assert rec["flops"]["measured_model_per_rank_step"] == 900.0
    row = record_row(rec)
    hw, model = rec["flops"]["analytic_hardware_per_rank_step"], rec["flops"]["analytic_model_per_rank_step"]
    assert row["flops_per_step_pred"] == hw != model
    assert row["flops_per_step_rel_err"] == pytest.approx(hw / 900.0 - 1.0)
    assert row["saved_act_bytes_meas"] is None and row["saved_act_bytes_rel_err"] is None
    assert rel_err(110.0, 100.0) == pytest.approx(0.1) and rel_err(1.0, 0.0) is None
    oom = assemble_record(spec, [_rank(0, spec), {"rank": 1, "status": "oom", "message": "CUDA out of memory"}],
                          timed_out=False, returncode=1, wall_s=1.0)
    assert oom["status"] == "oom" and oom["loss"] == [] and "step_time_median_s" not in oom["timing"]
