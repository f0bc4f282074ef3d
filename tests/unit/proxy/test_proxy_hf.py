"""The same model for proxies and production: transformers' LlamaForCausalLM in the harness.

The exact checks hold for it: parameter count, model FLOPs per step, saved activation bytes per decoder layer
(none / full / selective recompute), per-rank state bytes. Where it differs, precisely: (1) the RoPE tables —
transformers keeps cos and sin at (s, head_dim) each (the angle table concatenated with itself, for
``rotate_half``), twice the harness's interleaved (s, head_dim/2) tables, so ``shared`` is 2×; (2) SiLU is its
own sub-module (``mlp.act_fn``), so its saved output is reported under ``feed_forward.act_fn`` rather than
``feed_forward`` (the sum is equal); (3) the first-step loss is not bit-identical to the harness's model: the
same seeded init rule draws in a different parameter order. TP of the HF model is not wired (refused).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trainplan.model.arch import MODEL_PRESETS, hf_config_dict, hf_unsupported_reason, resolve_model
from trainplan.model.base import ConfigError
from trainplan.model.layout import Layout
from trainplan.proxy import analytic, measure
from trainplan.proxy.model import build_hf_llama, build_model, n_params
from trainplan.proxy.parallelize import parallelize

SPEC = MODEL_PRESETS["debug"]
S, MB = 64, 2


def _step(impl: str, recompute: str) -> dict:
    model = build_model(SPEC, seed=0, impl=impl)
    layout = Layout(dp=1, sharding="none", recompute=recompute, micro_batch=MB)
    model = parallelize(model, layout, None, device=torch.device("cpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, SPEC.vocab, (MB, S + 1), generator=torch.Generator().manual_seed(0))
    with measure.count_flops() as fl:
        tracker = measure.SavedTensorTracker(model)
        with tracker:
            logits = model(x[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten())
        loss.backward()
    opt.step()
    return {"flops": fl, "saved": tracker.summary(), "state": measure.state_bytes(model, opt), "loss": loss.item(),
            "params": n_params(model), "layout": layout}


@pytest.fixture(scope="module")
def runs():
    return {(impl, rec): _step(impl, rec) for impl in ("trainplan", "hf") for rec in ("none", "full", "selective")}


@pytest.mark.parametrize("name", ["debug", "llama2-7b", "llama2-13b", "llama3-8b", "llama3-70b"])
def test_hf_llama_has_the_spec_parameter_count(name):
    spec = MODEL_PRESETS[name]
    assert n_params(build_hf_llama(spec, device="meta")) == spec.n_params


@pytest.mark.parametrize("rec", ["none", "full", "selective"])
def test_hf_flops_and_saved_activations_equal_the_analytic_model(runs, rec):
    r = runs[("hf", rec)]
    af = analytic.analytic_flops(SPEC, S, MB, 1, 1, rec)
    am = analytic.analytic_memory(SPEC, r["layout"], S, MB, "fp32", "full", 8, [], "cpu")
    fl = r["flops"]
    assert fl["total"] - fl["attention_recompute"] == af["model_flops_per_rank_step"] or rec == "full"
    assert fl["total"] == pytest.approx(af["hardware_flops_per_rank_step"] + fl["attention_recompute"], rel=0) \
        or rec != "full"
    assert r["saved"]["mean_layer_bytes"] == am["activation_bytes_per_layer"]
    assert r["params"] == SPEC.n_params


@pytest.mark.parametrize("rec", ["none", "full", "selective"])
def test_hf_and_harness_models_measure_the_same_bytes_and_flops(runs, rec):
    hf, own = runs[("hf", rec)], runs[("trainplan", rec)]
    assert hf["flops"]["total"] == own["flops"]["total"]
    assert hf["saved"]["per_layer_bytes"] == own["saved"]["per_layer_bytes"]
    assert hf["state"] == own["state"]
    a, b = dict(hf["saved"]["per_term_bytes_per_layer"]), dict(own["saved"]["per_term_bytes_per_layer"])
    a["feed_forward"] = a.get("feed_forward", 0) + a.pop("feed_forward.act_fn", 0)  # SiLU is HF's act_fn module
    assert {k: v for k, v in a.items() if v} == {k: v for k, v in b.items() if v}
    hn, on = hf["saved"]["non_layer_bytes"], own["saved"]["non_layer_bytes"]
    assert {k: hn[k] for k in ("tok_embeddings", "norm", "output", "loss")} == \
        {k: on[k] for k in ("tok_embeddings", "norm", "output", "loss")}
    if rec == "none":  # transformers' cos/sin are (s, head_dim) each: twice the interleaved half tables
        assert hn["shared"] == 2 * on["shared"] == 2 * 2 * S * (SPEC.head_dim // 2) * 4


def test_hf_first_loss_is_close_not_identical(runs):
    a, b = runs[("hf", "none")]["loss"], runs[("trainplan", "none")]["loss"]
    assert a != b and abs(a - b) < 0.05  # both ≈ ln(vocab) = 5.55 at N(0, 0.02) init


def test_hf_config_round_trips_and_unsupported_models_say_why(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps(hf_config_dict(resolve_model("llama3-8b"))))
    back = resolve_model(str(tmp_path / "config.json"))
    assert back.n_params == MODEL_PRESETS["llama3-8b"].n_params
    from dataclasses import replace

    assert "mlp=gelu" in hf_unsupported_reason(replace(SPEC, mlp="gelu", norm="layernorm"))
    with pytest.raises(ValueError, match="not expressible"):
        hf_config_dict(replace(SPEC, qk_norm=True))


def test_tp_of_the_hf_model_is_refused_not_silently_wrong():
    from trainplan.proxy.parallelize import apply_tp

    with pytest.raises(ConfigError, match="tp_plan"):
        apply_tp(build_model(SPEC, impl="hf"), None, sp=False)


@pytest.mark.slow
def test_real_2rank_fsdp_proxy_on_the_hf_model_matches_the_analytic_model_exactly(tmp_path):
    """RUN_SPEC model_impl 'hf': a real torchrun/gloo FSDP2 proxy of transformers' LlamaForCausalLM (~40 s on
    2 cores); the record's byte and FLOP comparison columns (proxy.aggregate.record_row) are exact."""
    from trainplan.proxy.aggregate import METRICS, record_row
    from trainplan.proxy.schema import normalize_run_spec
    from trainplan.proxy.torchrun import launch

    gb = 4
    spec = normalize_run_spec({"id": "fsdp-hf", "model": "debug", "layout": {"dp": 2, "sharding": "zero3"},
                               "seq_len": S, "global_batch": gb, "steps": 4, "warmup": 1, "nproc_per_node": 2,
                               "timeout_s": 300, "model_impl": "hf"})
    rec, code = launch(spec, tmp_path / "fsdp-hf.json")
    assert (rec["status"], code) == ("ok", 0), rec["message"]
    assert rec["spec"]["model_impl"] == "hf" and rec["environment"]["world_size"] == 2
    row = record_row(rec)
    assert row["model_impl"] == "hf"
    assert row["params_meas"] == row["params_pred"] == SPEC.n_params
    assert row["state_bytes_meas"] == row["state_bytes_exact_meas"] == row["state_bytes_exact_pred"] \
        == row["state_bytes_pred"]
    assert row["saved_act_bytes_meas"] == row["saved_act_bytes_pred"]
    assert row["flops_per_step_meas"] == row["flops_per_step_pred"]
    assert [row[f"{m}_rel_err"] for m in METRICS] == [0.0] * 5
    full, accum = SPEC.n_params * 4, gb // 2  # FSDP: forward + backward all-gather and a scatter per micro-batch
    assert row["comm_all_gather_into_tensor_bytes"] == 2 * accum * full
    assert row["comm_reduce_scatter_tensor_bytes"] == accum * full  # gradient shards only, as the plan sizes them
    assert rec["loss"][-1] < rec["loss"][0]
