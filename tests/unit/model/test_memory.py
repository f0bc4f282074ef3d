"""Memory terms: ZeRO worked example, Korthikanti Table 2, saved activations of real PyTorch modules."""

import contextlib
import shutil
from dataclasses import replace
from importlib import resources

import numpy as np
import pandas as pd
import pytest

from trainplan.model import memory as M
from trainplan.model.arch import MODEL_PRESETS, ModelSpec
from trainplan.model.base import GB, ConfigError
from trainplan.model.hardware import ClusterSpec, resolve_gpu
from trainplan.model.layout import Layout, LayoutTable
from trainplan.model.training import TrainingSpec

LLAMA13 = MODEL_PRESETS["llama2-13b"]
TRAIN = TrainingSpec(seq_len=4096, global_batch=256)


def cluster(nodes: int = 4, gpu: str = "h100-sxm-80gb") -> ClusterSpec:
    return ClusterSpec(nodes=nodes, gpus_per_node=8, gpu=gpu)


# ----------------------------------------------------------------------------- model states
@pytest.mark.parametrize(("stage", "published_gb"), [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.88)])
def test_zero_paper_worked_example(stage: int, published_gb: float) -> None:
    """Rajbhandari 2019 (ZeRO) Fig. 1: Ψ = 7.5B, N_d = 64; baseline, P_os, P_os+g, P_os+g+p."""
    st = M.model_state_bytes(7.5e9, 64, stage, "bf16", "adamw", "zero")
    assert sum(st.values()) / GB == pytest.approx(published_gb, abs=0.05)  # the figure rounds


def test_fsdp2_split_has_the_same_total_as_zero3() -> None:
    """FSDP2 (fp32 params + fp32 grads + fp32 m, v) = 16Ψ/d, as ZeRO-3's 2+2+12 (SOURCES.md)."""
    z = M.model_state_bytes(1e9, 8, 3, convention="zero")
    f = M.model_state_bytes(1e9, 8, 3, convention="fsdp2")
    assert sum(z.values()) == sum(f.values()) == 16e9 / 8
    assert f["weights"] == 4e9 / 8 and z["weights"] == 2e9 / 8


def test_sgd_and_fp32_state_bytes() -> None:
    assert M.state_bytes_per_param("bf16", "sgd") == (2, 2, 4)  # master copy only
    assert M.state_bytes_per_param("fp32", "adamw") == (4, 4, 8)
    assert M.state_bytes_per_param("fp32", "sgd") == (4, 4, 0)


@pytest.mark.parametrize("m", [LLAMA13, replace(LLAMA13, bias="mlp", head_bias=True, mlp="gelu", norms_per_layer=1),
                               replace(LLAMA13, bias="o_mlp", mlp="gelu", norm="layernorm"),
                               replace(LLAMA13, bias="all", mlp="gelu", norm="layernorm", embed_norm=True)])
def test_stage_params_partition_the_model(m) -> None:
    """Stages hold every parameter once (untied): first + middle stages + last = N (tp = 1); GPT-J's shape too
    (MLP biases, a biased LM head, one norm per block), GPT-Neo's (o and MLP biases, biased LayerNorms) and BLOOM's
    (a LayerNorm after the embedding, on the first stage)."""
    pp = 4
    first, last = M.stage_params(m, 1, pp, "first"), M.stage_params(m, 1, pp, "last")
    middle = m.layers / pp * m.n_params_per_layer
    total = sum(first.values()) + sum(last.values()) + (pp - 2) * middle
    assert total == m.n_params
    assert sum(M.stage_params(m, 1, 1, "first").values()) == m.n_params


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_tp_shards_block_matmuls_exactly(tp: int) -> None:
    m = MODEL_PRESETS["llama2-13b"]  # kv_heads = 40 ≥ tp: no K/V replication
    assert tp * M.layer_matmul_params_per_rank(m, tp) == m.n_params_per_layer - 2 * m.hidden


def test_tp_beyond_kv_heads_replicates_kv() -> None:
    m = MODEL_PRESETS["llama3-8b"]  # 8 KV heads
    h, kv, f = m.hidden, m.kv_dim, m.ffn_hidden
    per_rank_16 = M.layer_matmul_params_per_rank(replace(m, heads=32), 16)
    assert per_rank_16 == 2 * h * h / 16 + 2 * h * kv / 8 + 3 * h * f / 16


def test_lora_adapter_count_llama2_7b_r8_qv() -> None:
    """Hu 2021 §4.1: r·(d_in + d_out) per adapted matrix. Llama-2-7B, r=8 on q,v: 4,194,304 trainable
    parameters (what PEFT's print_trainable_parameters reports for this setup)."""
    m = MODEL_PRESETS["llama2-7b"]
    assert m.layers * M.lora_params_per_layer(m, 8, ("q", "v")) == 4_194_304


def test_qlora_nf4_costs_4_127_bits_per_param() -> None:
    """Dettmers 2023 §2: double quantisation brings the constants to 0.127 bit/param (from 0.5)."""
    assert pytest.approx(0.127, abs=5e-4) == (M.NF4_BYTES_PER_PARAM * 8 - 4)


@pytest.mark.parametrize("sharding", ["none", "zero1", "zero2", "zero3", "hsdp"])
def test_lora_only_adapters_carry_gradients_and_optimizer(sharding: str) -> None:
    c = cluster()
    lay = Layout(dp=32, sharding=sharding, shard_group=8 if sharding == "hsdp" else None)
    full = M.model_states(LLAMA13, TRAIN, lay, c)
    lora = M.model_states(LLAMA13, replace(TRAIN, finetune="lora"), lay, c)
    qlora = M.model_states(LLAMA13, replace(TRAIN, finetune="qlora"), lay, c)
    adapters = LLAMA13.layers * M.lora_params_per_layer(LLAMA13, TRAIN.lora_rank, TRAIN.lora_targets)
    assert lora["gradients"] <= 4 * adapters and lora["optimizer"] <= 12 * adapters
    assert qlora["weights"] < lora["weights"] < full["weights"] * (2 if sharding != "none" else 1.01)
    assert lora["gradients"] < full["gradients"] / 100


def test_offload_removes_optimizer_from_hbm() -> None:
    base = Layout(dp=32, sharding="zero2")
    st = M.model_states(LLAMA13, TRAIN, replace(base, offload="cpu"), cluster())
    assert st["optimizer"] == 0 and st["weights"] == M.model_states(LLAMA13, TRAIN, base, cluster())["weights"]


def test_host_ram_holds_what_offload_takes_off_hbm() -> None:
    """CPU offload moves the optimizer (ZeRO-2: 12 B/param with the fp32 master, sharded) or, under FSDP2's
    CPUOffloadPolicy, all 16 B/param of the sharded states to host RAM; a node holds its ranks' share and a plan
    whose share exceeds host RAM is infeasible (it was feasible at any size: 405B with optimizer offload on one
    node needs ~6.5 TB against DGX H100's 2 TB)."""
    from trainplan.model.arch import resolve_model
    from trainplan.model.estimate import estimate

    c = cluster()
    n = LLAMA13.n_params
    z2 = M.host_offload_bytes(LLAMA13, TRAIN, Layout(dp=32, sharding="zero2", offload="cpu"), c)
    z3 = M.host_offload_bytes(LLAMA13, TRAIN, Layout(dp=32, sharding="zero3", offload="cpu"), c)
    assert z2 == pytest.approx(12 * n / 32, rel=1e-9) and z3 == pytest.approx(16 * n / 32, rel=1e-9)
    assert M.host_offload_bytes(LLAMA13, TRAIN, Layout(dp=32, sharding="zero3"), c) == 0
    tab = LayoutTable.from_layouts([Layout(dp=32, sharding="zero2", offload="cpu"), Layout(dp=32, sharding="zero3")])
    np.testing.assert_allclose(M.host_offload_bytes(LLAMA13, TRAIN, tab, c), [z2, 0.0])
    big, one_node = resolve_model("llama3.1-405b"), ClusterSpec(nodes=1, gpus_per_node=8, gpu="h100-sxm-80gb")
    lay = Layout(dp=1, tp=8, sharding="zero3", offload="cpu")
    est = estimate(big, one_node, TrainingSpec(seq_len=1024, global_batch=8), lay)
    assert not est.feasible and "host RAM: CPU offload holds 6,494 GB per node (8 ranks) > 90% of 2,000 GB" in est.reason
    small = replace(c, host_mem_bytes=int(8 * z3 / 0.9) - 1)  # 90% of it one byte short of the 13B ZeRO-3 node share
    assert "host RAM" in estimate(LLAMA13, small, TRAIN, Layout(dp=32, sharding="zero3", offload="cpu")).reason
    assert estimate(LLAMA13, replace(small, host_mem_bytes=small.host_mem_bytes + 2),
                    TRAIN, Layout(dp=32, sharding="zero3", offload="cpu")).reason == ""


# ------------------------------------------------------------------------------- activations
def _korthikanti_table2(s: float, b: float, h: float, a: float, t: float, row: str) -> float:
    """Korthikanti 2022 Table 2, per-layer activation bytes (closed forms, as printed)."""
    return {
        "none": s * b * h * (34 + 5 * a * s / h),
        "tp": s * b * h * (10 + 24 / t + 5 * a * s / (h * t)),
        "tp_sp": s * b * h * (34 / t + 5 * a * s / (h * t)),
        "tp_selective": s * b * h * (10 + 24 / t),
        "tp_sp_selective": s * b * h * 34 / t,
        "full": 2 * s * b * h,
    }[row]


@pytest.mark.parametrize(("s", "b", "h", "a", "t"), [(2048, 1, 12288, 96, 8), (2048, 4, 6144, 64, 8),
                                                     (4096, 2, 5120, 40, 4), (1024, 3, 2048, 16, 2)])
def test_korthikanti_table2_reproduced_from_itemised_tensors(s: int, b: int, h: int, a: int, t: int) -> None:
    """The item-by-item account of a GPT block (§4.1) sums to each closed form of Table 2."""
    k = M.korthikanti_activation_bytes
    assert k(s, b, h, a) == pytest.approx(_korthikanti_table2(s, b, h, a, 1, "none"), rel=1e-12)
    assert k(s, b, h, a, t) == pytest.approx(_korthikanti_table2(s, b, h, a, t, "tp"), rel=1e-12)
    assert k(s, b, h, a, t, True) == pytest.approx(_korthikanti_table2(s, b, h, a, t, "tp_sp"), rel=1e-12)
    assert k(s, b, h, a, t, False, "selective") == pytest.approx(
        _korthikanti_table2(s, b, h, a, t, "tp_selective"), rel=1e-12)
    assert k(s, b, h, a, t, True, "selective") == pytest.approx(
        _korthikanti_table2(s, b, h, a, t, "tp_sp_selective"), rel=1e-12)
    assert k(s, b, h, a, t, True, "full") == _korthikanti_table2(s, b, h, a, t, "full")


def test_llama_block_bf16_flash_per_token_coefficients() -> None:
    """docs/analytic-model.md §3: 2·(6h + 2kv + 4f) + 4·heads + 8 bytes/token (fused norm, flash)."""
    m = LLAMA13
    got = M.saved_activation_bytes_per_layer(m, 4096, 1)
    assert got == 4096 * (2 * (6 * m.hidden + 2 * m.kv_dim + 4 * m.ffn_hidden) + 4 * m.heads + 8)


def test_activation_divisions_tp_sp_cp_and_recompute() -> None:
    f = M.saved_activation_bytes_per_layer
    base = f(LLAMA13, 4096, 1)
    assert f(LLAMA13, 4096, 1, tp=8, sp=True) == pytest.approx(base / 8)
    assert base / 8 < f(LLAMA13, 4096, 1, tp=8) < base
    assert f(LLAMA13, 4096, 1, cp=4) == pytest.approx(base / 4)
    assert f(LLAMA13, 4096, 1, recompute="full") == 4096 * LLAMA13.hidden * 2
    assert f(LLAMA13, 4096, 1, recompute="full") < f(LLAMA13, 4096, 1, recompute="selective") < base


def test_pipeline_first_stage_holds_L_layers_worth() -> None:
    """Narayanan 2021 §2.2 / Megatron theoretical_memory_usage: with m ≥ p the first stage stores
    p micro-batches of L/p layers; interleaving multiplies by 1 + (p−1)/(p·v)."""
    per = M.saved_activation_bytes_per_layer(LLAMA13, 4096, 1)
    lay = Layout(dp=8, pp=4, sharding="zero1")
    extra = 8 * 4096 + M.rope_table_bytes(LLAMA13, 4096)
    assert M.activation_bytes(LLAMA13, TRAIN, lay) == pytest.approx(LLAMA13.layers * per + 4 * extra)
    inter = replace(lay, pp_schedule="interleaved", vpp=2)
    assert M.activation_bytes(LLAMA13, TRAIN, inter) == pytest.approx(LLAMA13.layers * per * (1 + 3 / 8) + 4 * extra)


def _saved_storage_bytes(module, *args, ctx=None) -> int:  # type: ignore[no-untyped-def]
    """Bytes PyTorch saves for backward while ``module(*args)`` runs: unique storages, parameters excluded."""
    torch = pytest.importorskip("torch")
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t):  # type: ignore[no-untyped-def]
        k = t.untyped_storage().data_ptr()
        if k not in params:
            seen[k] = t.untyped_storage().nbytes()
        return t

    with ctx or contextlib.nullcontext(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(*args)
    return sum(seen.values())


def _saved_bytes(model, tokens, math: bool) -> int:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return _saved_storage_bytes(model, tokens, ctx=sdpa_kernel(SDPBackend.MATH) if math else None)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("preset", ["debug", "debug-wide"])
@pytest.mark.parametrize("gqa", [True, False])
@pytest.mark.parametrize("attn_impl", ["flash", "math", "flash-autocast"])
def test_saved_activations_match_the_proxy_model_exactly(preset: str, gqa: bool, attn_impl: str) -> None:
    """Bytes PyTorch saves for backward (saved_tensors_hooks, unique storages, parameters excluded) on the
    proxy Llama (fp32, CPU: F.rms_norm decomposes → norm_impl='composite') equal the formula. ``flash-autocast``:
    the same fp32 model under ``torch.autocast(bfloat16)``, as the harness runs bf16 on one rank (fp32 residual
    stream and norms, one bf16 input cast per linear, the bf16 weight copies: memory.py ``autocast``)."""
    torch = pytest.importorskip("torch")
    proxy = pytest.importorskip("trainplan.proxy.model")
    spec: ModelSpec = MODEL_PRESETS[preset]
    if not gqa:
        spec = replace(spec, kv_heads=spec.heads)
    s, b = 32, 2
    model = proxy.build_model(spec)
    tokens = torch.randint(0, spec.vocab, (b, s))
    if attn_impl == "flash-autocast":
        got = _saved_storage_bytes(model, tokens, ctx=torch.autocast("cpu", dtype=torch.bfloat16))
        want = M.model_saved_activation_bytes(spec, s, b, dtype_bytes=2, norm_impl="composite", autocast=True)
        assert got == want != M.model_saved_activation_bytes(spec, s, b, dtype_bytes=2, norm_impl="composite")
        return
    got = _saved_bytes(model, tokens, math=attn_impl == "math")
    assert got == M.model_saved_activation_bytes(spec, s, b, dtype_bytes=4, attn_impl=attn_impl,
                                                 norm_impl="composite")


def test_autocast_weight_copies_and_fp32_residual_terms() -> None:
    """Under autocast each block keeps 2 B per matmul parameter (not per token) unless recompute drops it; the
    norms keep fp32 inputs; recompute='full' keeps the fp32 layer input; q, k, v and gate, up each keep a cast."""
    kw = dict(dtype_bytes=2, norm_impl="fused", sac_policy="matmul", sp_impl="pytorch")
    h = LLAMA13.hidden
    w = M.layer_matmul_params_per_rank(LLAMA13)
    assert M.autocast_weight_copy_bytes(LLAMA13) == 2 * w
    for s in (1024, 4096):
        ac = M.saved_activation_bytes_per_layer(LLAMA13, s, 1, autocast=True, **kw)
        bp = M.saved_activation_bytes_per_layer(LLAMA13, s, 1, **kw)
        # norms: 2 × (4 − 2)·h more; q/k/v and gate/up: 2 and 1 extra bf16 casts of h each
        assert ac - bp == pytest.approx(2 * w + s * (2 * 2 * h + 3 * 2 * h))
    full = M.saved_activation_bytes_per_layer(LLAMA13, 4096, 1, recompute="full", autocast=True, **kw)
    assert full == 4096 * h * 4  # the fp32 residual, no weight copies
    sel = M.saved_activation_bytes_per_layer(LLAMA13, 4096, 1, recompute="selective", autocast=True, **kw)
    # op-level SAC keeps the fp32 block input and the mm/SDPA outputs; the weight casts are recomputed
    assert sel - M.saved_activation_bytes_per_layer(LLAMA13, 4096, 1, recompute="selective", **kw) == 4096 * 2 * h
    head = M.head_saved_bytes(LLAMA13, 4096, 1, autocast=True) - M.head_saved_bytes(LLAMA13, 4096, 1)
    assert head == pytest.approx(2 * LLAMA13.vocab * h + 4096 * 2 * h)  # the head's weight copy, an fp32 norm input


# ------------------------------------------------------------------------------ breakdown
def test_breakdown_keys_and_total() -> None:
    b = M.memory_breakdown(LLAMA13, cluster(), TRAIN, Layout(dp=32, sharding="zero3"))
    assert tuple(b) == M.TERMS
    assert b["total"] == pytest.approx(sum(b[k] for k in M.TERMS[:-1]))


def test_breakdown_uses_efficiency_overheads() -> None:
    class Eff:
        runtime_overhead_bytes = 1e9
        alloc_frag_frac = 0.0

    b = M.memory_breakdown(LLAMA13, cluster(), TRAIN, Layout(dp=32, sharding="zero3"), Eff())
    assert b["overhead"] == 1e9


def test_torchtitan_llama2_13b_mb2_fits_a100_80gb() -> None:
    """torchtitan docs/performance.md ran Llama-2-13B, FSDP over 64 A100-80GB, local batch 2, seq 4096,
    no activation checkpointing: our peak for that run must be under the usable HBM."""
    df = pd.read_csv(resources.files("trainplan") / "data" / "torchtitan_a100_and_405b_docs_performance.csv")
    r = df[df.model == "Llama2-13B"].iloc[0]
    c = cluster(nodes=int(r.gpus) // 8, gpu="a100-80gb")
    t = TrainingSpec(seq_len=int(r.seq_len_default_cfg), global_batch=int(r.gpus) * int(r.local_batch),
                     norm_impl="fused")  # (torchtitan's own nn.RMSNorm, not Hugging Face's)
    b = M.memory_breakdown(LLAMA13, c, t, Layout(dp=int(r.gpus), sharding="zero3", micro_batch=int(r.local_batch)))
    assert M.fits(b["total"], c.gpu, threshold=1.0)


def test_headroom_and_fits_vectorised() -> None:
    gpu = resolve_gpu("h100-sxm-80gb")
    tot = np.array([0.5, 0.9, 0.95]) * gpu.hbm_bytes
    assert M.headroom_frac(tot, gpu) == pytest.approx([0.5, 0.1, 0.05])
    assert list(M.fits(tot, gpu)) == [True, True, False]
    assert M.fits(0.95 * gpu.hbm_bytes, gpu, threshold=0.96) is True
    with pytest.raises(ConfigError, match="threshold"):
        M.fits(1.0, gpu, threshold=1.5)


def test_bad_impl_names_the_key() -> None:
    with pytest.raises(ConfigError, match="attn_impl"):
        M.saved_activation_bytes_per_layer(LLAMA13, 4096, 1, attn_impl="sdpa")
    with pytest.raises(ConfigError, match="norm_impl"):
        M.saved_activation_bytes_per_layer(LLAMA13, 4096, 1, norm_impl="apex")


def test_table_input_returns_arrays() -> None:
    t = LayoutTable.from_layouts([Layout(dp=32, sharding="zero3"), Layout(dp=8, tp=4, sp=True, sharding="zero1")])
    b = M.memory_breakdown(LLAMA13, cluster(), TRAIN, t)
    assert all(np.shape(v) == (2,) for v in b.values())


# --- torchtitan H100 (benchmarks/llama3_h100_202412_torchtitan.md): peak reserved GiB ----------------------
# The acceptance: every memory row the model speaks to within 10% of torchtitan's reserved figure.
TORCHTITAN_MEM_ROW_TOL_PCT = 10.0


def test_torchtitan_h100_memory_rows_within_tolerance() -> None:
    from trainplan.published.tables import validate_all

    df = validate_all()
    d = df[(df["table"] == "torchtitan_h100") & (df["metric"] == "memory_gib") & df["in_mape"]]
    assert len(d) >= 2
    assert (d["err_pct"].abs() <= TORCHTITAN_MEM_ROW_TOL_PCT).all(), d[["row", "published", "predicted"]]


def test_torchtitan_op_sac_keeps_every_other_matmul_and_sdpa() -> None:
    m, s, b = MODEL_PRESETS["llama3.1-8b"], 8192, 2
    kept = M.saved_activation_bytes_per_layer(m, s, b, recompute="selective", sac_policy="torchtitan_op")
    # block input, wq out, wv out, SDPA out (+ fp32 logsumexp), w1 out, w2 out
    want = s * b * (2 * (4 * m.hidden + m.kv_dim + m.ffn_hidden) + 4 * m.heads)
    assert kept == want
    none = M.saved_activation_bytes_per_layer(m, s, b)
    full = M.saved_activation_bytes_per_layer(m, s, b, recompute="full")
    every_mm = M.saved_activation_bytes_per_layer(m, s, b, recompute="selective", sac_policy="matmul")
    assert full < kept < every_mm < none


def test_auto_policies_follow_the_kernels() -> None:
    assert M.resolve_sac_policy(TrainingSpec(seq_len=8, global_batch=1, kernels="fused")) == "attention"
    assert M.resolve_sac_policy(TrainingSpec(seq_len=8, global_batch=1)) == "torchtitan_op"
    assert M.resolve_sp_impl(TrainingSpec(seq_len=8, global_batch=1, kernels="fused")) == "megatron"
    assert M.resolve_sp_impl(TrainingSpec(seq_len=8, global_batch=1, sac_policy="matmul")) == "pytorch"


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_pytorch_sp_keeps_the_gathered_qkv_and_mlp_inputs(tp: int) -> None:
    m, s, b, d = LLAMA13, 4096, 1, 2
    kw = dict(tp=tp, sp=True, dtype_bytes=d)
    meg = M.saved_activation_bytes_per_layer(m, s, b, sp_impl="megatron", **kw)
    pt = M.saved_activation_bytes_per_layer(m, s, b, sp_impl="pytorch", **kw)
    assert pt - meg == pytest.approx(2 * s * b * m.hidden * d * (1 - 1 / tp))


def test_pp_under_fsdp_keeps_the_stage_unsharded_with_fp32_grads() -> None:
    m = MODEL_PRESETS["llama3.1-405b"]
    t = TrainingSpec(seq_len=8192, global_batch=256)
    lay = Layout(dp=8, tp=8, pp=8, sp=True, sharding="zero3", recompute="full", micro_batch=4)
    buf = M.buffer_bytes(m, t, lay)
    stage = np.ceil(m.layers / 8) * M.layer_params_per_rank(m, 8)
    assert buf >= stage * (2 + 4)  # bf16 gathered params + fp32 accumulated grads
    megatron = M.buffer_bytes(m, replace(t, kernels="fused"), lay)
    assert megatron < stage * 2


def test_lora_frozen_linears_keep_no_inputs() -> None:
    m, s, b = MODEL_PRESETS["debug"], 64, 1
    full = M.saved_activation_bytes_per_layer(m, s, b, dtype_bytes=4, norm_impl="composite")
    lora = M.saved_activation_bytes_per_layer(m, s, b, dtype_bytes=4, norm_impl="composite", lora_rank=4,
                                              lora_targets=("q", "v"))
    # full − LoRA: x·rstd of both norms, the MLP input and the down input (frozen), minus two rank-4 intermediates
    assert full - lora == s * b * 4 * (2 * m.hidden + m.hidden + m.ffn_hidden - 2 * 4)


def _saved_norm_bytes(dim: int, shape: tuple[int, ...]) -> int:
    """What one proxy RMSNorm over ``dim`` features saves for backward on a trainable fp32 input of ``shape``."""
    torch = pytest.importorskip("torch")
    proxy = pytest.importorskip("trainplan.proxy.model")
    return _saved_storage_bytes(proxy.RMSNorm(dim), torch.randn(*shape, requires_grad=True))


def test_norms_per_layer_and_qk_norms_add_what_pytorch_saves() -> None:
    """Gemma 2/3's sandwich norms (4 per block), Falcon's and Cohere's single norm, and Qwen3's per-head q/k
    norms: the formula's difference from the 2-norm block equals what real RMSNorms save for backward (fp32,
    CPU: F.rms_norm decomposes, norm_impl='composite'), per token, no TP."""
    base = ModelSpec(layers=1, hidden=64, heads=4, kv_heads=2, vocab=100)
    s, b = 16, 2
    kw = dict(dtype_bytes=4, norm_impl="composite")
    per = {n: M.saved_activation_bytes_per_layer(replace(base, norms_per_layer=n), s, b, **kw) for n in (1, 2, 4)}
    one = _saved_norm_bytes(base.hidden, (b, s, base.hidden))
    assert one > 0 and per[4] - per[2] == 2 * one and per[2] - per[1] == one
    qk = M.saved_activation_bytes_per_layer(replace(base, qk_norm=True), s, b, **kw) - per[2]
    d = base.head_dim
    assert qk == (_saved_norm_bytes(d, (b, s, base.heads, d)) + _saved_norm_bytes(d, (b, s, base.kv_heads, d)))
    # OLMo 2's q and k norms over the whole projections: the same inputs, one statistic each per token
    full = M.saved_activation_bytes_per_layer(replace(base, qk_norm=True, qk_norm_scope="full"), s, b, **kw) - per[2]
    assert full == (_saved_norm_bytes(base.q_dim, (b, s, base.q_dim)) + _saved_norm_bytes(base.kv_dim, (b, s, base.kv_dim)))
    # the selective policies that keep every norm keep these too; full recompute keeps the block input only
    assert M.saved_activation_bytes_per_layer(replace(base, norms_per_layer=4), s, b, recompute="full", **kw) == \
        M.saved_activation_bytes_per_layer(base, s, b, recompute="full", **kw)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("embed_norm", [False, True])
def test_saved_activations_of_a_layernorm_model_with_an_embedding_norm(embed_norm: bool) -> None:
    """GPT/BLOOM-shaped proxy (LayerNorm, GELU MLP, biases, learned positions; BLOOM's LayerNorm after the
    embedding): what PyTorch saves for backward equals the formula, and the embedding norm adds exactly one
    LayerNorm's saves (input + mean, rstd per token)."""
    torch = pytest.importorskip("torch")
    proxy = pytest.importorskip("trainplan.proxy.model")
    spec = replace(MODEL_PRESETS["debug"], mlp="gelu", norm="layernorm", bias="all", pos_embedding="learned",
                   embed_norm=embed_norm)
    s, b = 32, 2
    got = _saved_bytes(proxy.build_model(spec), torch.randint(0, spec.vocab, (b, s)), math=False)
    assert got == M.model_saved_activation_bytes(spec, s, b, dtype_bytes=4, norm_impl="composite")
    if embed_norm:
        without = M.model_saved_activation_bytes(replace(spec, embed_norm=False), s, b, dtype_bytes=4,
                                                 norm_impl="composite")
        assert got - without == s * b * (spec.hidden * 4 + 2 * 4)


def test_zero2_gradient_shards_are_fp32_as_fsdp2_keeps_them() -> None:
    """ZeRO-2 runs as FSDP2 without reshard after forward (every launch path): the sharded gradients are in the
    fp32 reduce dtype, 4·N/d bytes (FSDPMemTracker on the 13B widths: 1.515 GiB at d = 32), not bf16's 2·N/d."""
    c = cluster()
    z2 = M.model_states(LLAMA13, TRAIN, Layout(dp=32, sharding="zero2"), c)
    z3 = M.model_states(LLAMA13, TRAIN, Layout(dp=32, sharding="zero3"), c)
    assert z2["gradients"] == z3["gradients"] == 4 * LLAMA13.n_params / 32
    assert z2["weights"] == 2 * LLAMA13.n_params and z2["optimizer"] == 12 * LLAMA13.n_params / 32


def test_fsdp2_keeps_the_root_unit_gathered_beside_two_block_units() -> None:
    """FSDP2 does not reshard the root unit (embedding, final norm, untied LM head) after forward: its bf16 copy stays
    gathered through backward beside the current and the prefetched block and one block's fp32 reduce-scatter
    (FSDPMemTracker at the 13B widths on a fake 32-rank group: 2.974 GiB of buffers; the terms said 2.363)."""
    lay = Layout(dp=32, sharding="zero3", micro_batch=1)
    block = M.layer_matmul_params_per_rank(LLAMA13, 1) + M.layer_other_params_per_rank(LLAMA13, 1)
    vh = LLAMA13.vocab * LLAMA13.hidden
    want = 2 * vh * 2 + 2 * block * 2 + max(block, vh) * 4
    assert float(M.buffer_bytes(LLAMA13, TRAIN, lay)) == pytest.approx(want, rel=1e-12)
    assert float(M.buffer_bytes(LLAMA13, TRAIN, lay)) / 2**30 == pytest.approx(2.974, abs=0.01)


@pytest.mark.parametrize(("sharding", "per_param"), [("zero1", 6 + 12 / 32), ("none", 18.0)])
def test_fused_kernels_keep_megatrons_whole_fp32_main_grads(sharding: str, per_param: float) -> None:
    """Megatron's distributed optimizer with fp32 gradient accumulation: 6 + 12/d B/param, 18 unsharded
    (SOURCES.md); the eager/compiled classes (PyTorch DDP, ZeRO paper split) keep bf16 grads, 16 − 12 + 12/d."""
    c = cluster()
    fused = replace(TRAIN, kernels="fused")
    st = M.model_states(LLAMA13, fused, Layout(dp=32, sharding=sharding), c)
    assert sum(st.values()) == pytest.approx(per_param * LLAMA13.n_params, rel=1e-12)
    eager = M.model_states(LLAMA13, TRAIN, Layout(dp=32, sharding=sharding), c)
    assert st["gradients"] - eager["gradients"] == pytest.approx(2 * LLAMA13.n_params, rel=1e-12)
    z3 = [M.model_states(LLAMA13, t, Layout(dp=32, sharding="zero3"), c) for t in (fused, TRAIN)]
    assert z3[0] == z3[1]  # ZeRO-3 is FSDP2's split in every class


@pytest.mark.parametrize("sharding", ["zero1", "zero2"])
def test_zero12_under_pipelining_hold_the_stages_unsharded_fp32_grads(sharding: str) -> None:
    """PyTorch pipelining syncs FSDP2 gradients once per step (perform_reduce_grad after the last backward), so
    ZeRO-1/2 (FSDP2 without reshard after forward) accumulate the whole stage's grads in fp32: 4 B per stage
    parameter in the buffers; without PP, none of it."""
    pp = Layout(dp=16, pp=2, sharding=sharding, micro_batch=1)
    flat = Layout(dp=32, sharding=sharding, micro_batch=1)
    stage = M.stage_params(LLAMA13, 1, 2, "first")
    blocks = M._layers_per_stage(LLAMA13, 2) * M.layer_params_per_rank(LLAMA13, 1)
    ddp_buckets, p2p = 2 * M.DDP_BUCKET_BYTES, 2 * TRAIN.seq_len * LLAMA13.hidden * 2
    assert M.buffer_bytes(LLAMA13, TRAIN, pp) == pytest.approx(4 * blocks + ddp_buckets + p2p)
    assert M.buffer_bytes(LLAMA13, TRAIN, flat) < 0.1 * GB
    assert stage["matmul"] + stage["other"] > blocks  # the stage's weights term holds the gathered bf16 copy


def test_uneven_interleaved_stages_size_the_busiest_rank_as_timing_does() -> None:
    """40 layers on pp 4 × v 3: 12 chunks of 3–4 layers; the busiest rank runs ceil(40/12)·3 = 12 layers
    (timing.busiest_stage_layers), so its weights and activations are 12 layers', not 40/4 = 10."""
    from trainplan.model.timing import busiest_stage_layers
    c = cluster()
    v2, v3 = (Layout(dp=8, pp=4, pp_schedule="interleaved", vpp=v, sharding="zero1", micro_batch=1) for v in (2, 3))
    assert busiest_stage_layers(LLAMA13.layers, 4, 3) == M._layers_per_stage(LLAMA13, 4, 3) == 12
    w2, w3 = (M.model_states(LLAMA13, TRAIN, lay, c)["weights"] for lay in (v2, v3))
    per_layer = 2 * M.layer_params_per_rank(LLAMA13, 1)
    assert w3 - w2 == pytest.approx(2 * per_layer)
    a2, a3 = (M.activation_bytes(LLAMA13, TRAIN, lay) / M.interleave_factor(4, v, "interleaved")
              for lay, v in ((v2, 2), (v3, 3)))
    assert a3 / a2 == pytest.approx(12 / 10, rel=1e-4)  # + a per-stage term that does not scale with layers


@pytest.mark.parametrize("finetune", ["lora", "qlora"])
def test_fsdp2_offload_moves_the_frozen_base_too(finetune: str) -> None:
    """CPUOffloadPolicy offloads every sharded parameter: a LoRA/QLoRA run's frozen base leaves HBM under
    ZeRO-3/HSDP offload (it counted on the GPU, so LoRA + offload needed more memory than a full fine-tune)."""
    c = cluster()
    t = replace(TRAIN, finetune=finetune)
    on, off = (M.model_states(LLAMA13, t, Layout(dp=32, sharding="zero3", offload=o), c) for o in ("none", "cpu"))
    assert off["weights"] == 0.0 and on["weights"] > 0
    assert M.host_offload_bytes(LLAMA13, t, Layout(dp=32, sharding="zero3", offload="cpu"), c) == pytest.approx(
        sum(on.values()))


def test_lora_adapter_count_agrees_with_flops_when_q_is_not_h_wide() -> None:
    """Gemma-style heads·head_dim ≠ hidden: q's adapter is r·(h + q_dim) and o's r·(q_dim + h), as
    flops.adapter_params counts them (memory counted h for q_dim)."""
    from trainplan.model.flops import adapter_params

    m = replace(LLAMA13, head_dim_override=256)  # 40 heads × 256 = 10240 ≠ 5120
    assert m.q_dim != m.hidden
    targets = ("q", "k", "v", "o", "gate", "up", "down")
    assert M.lora_params_per_layer(m, 16, targets) * m.layers == adapter_params(m, 16, targets)


def test_the_peak_rank_is_the_heavier_pipeline_stage() -> None:
    """memory_breakdown reports the larger of the first and last stage, row by row (the fit check uses it)."""
    for lay in (Layout(dp=8, pp=4, sharding="zero1"), Layout(dp=8, pp=4, sharding="zero1", micro_batch=8)):
        first = M.stage_breakdown(LLAMA13, cluster(), TRAIN, lay, stage="first")
        last = M.stage_breakdown(LLAMA13, cluster(), TRAIN, lay, stage="last")
        assert first["total"] != last["total"]
        assert M.memory_breakdown(LLAMA13, cluster(), TRAIN, lay)["total"] == max(first["total"], last["total"])


def test_only_the_last_pipeline_stage_holds_the_logits() -> None:
    lay = Layout(dp=8, pp=4, sharding="zero1")
    assert M.stage_breakdown(LLAMA13, cluster(), TRAIN, lay, stage="first")["logits"] == 0.0
    assert M.stage_breakdown(LLAMA13, cluster(), TRAIN, lay, stage="last")["logits"] > 0.0
    assert M.stage_breakdown(LLAMA13, cluster(), TRAIN, Layout(dp=32), stage="first")["logits"] > 0.0


def _tracked_bytes(fn) -> tuple[int, int, object]:
    """(peak, still alive at the end, the result of ``fn()``): bytes of the storages that ``fn`` allocates. Every aten
    op's outputs are seen by a TorchDispatchMode (autograd's backward ops included), each new storage counted until
    it is freed."""
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    live, peak, seen = [0], [0], set()

    def freed(ptr: int, nbytes: int) -> None:
        seen.discard(ptr)
        live[0] -= nbytes

    class Track(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (list, tuple)) else [out]:
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen and t.numel():
                    st = t.untyped_storage()
                    if any(isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == st.data_ptr()
                           for a in args):
                        continue  # in place, or a view of an input
                    seen.add(st.data_ptr())
                    live[0] += st.nbytes()
                    peak[0] = max(peak[0], live[0])
                    weakref.finalize(st, freed, st.data_ptr(), st.nbytes())
            return out

    with Track():
        out = fn()
    return peak[0], live[0], out


def _peak_bytes(fn) -> int:
    """Peak bytes of the storages that ``fn`` allocates and holds at once (:func:`_tracked_bytes`)."""
    return _tracked_bytes(fn)[0]


def _saved_by_autograd(fn, skip) -> int:  # noqa: ANN001
    """Bytes of the unique storages autograd saves for backward while ``fn()`` runs (saved-tensor hooks; they also
    see what torch.compile's autograd functions save), less the tensors in ``skip`` (inputs, parameters)."""
    import torch

    skipped = {t.untyped_storage().data_ptr() for t in skip}
    kept: dict[int, int] = {}

    def pack(t):  # noqa: ANN001, ANN202
        if t.untyped_storage().data_ptr() not in skipped:
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(kept.values())


def _hf_block_saves_per_layer(b: int, s: int, compiled: bool) -> tuple[ModelSpec, int]:
    """(the spec, what autograd saves per layer) of transformers' Llama stack in bf16, eager or compiled (warmed up
    first): two layers less one, so the embedding, final norm and head drop out."""
    import torch

    pytest.importorskip("transformers")
    from trainplan.proxy.model import build_hf_llama

    saved = {}
    for layers in (1, 2):
        spec = ModelSpec(name="hf", layers=layers, hidden=256, heads=2, vocab=512, ffn_hidden=688)
        hf = build_hf_llama(spec).to(torch.bfloat16)
        tokens = torch.randint(0, spec.vocab, (b, s))

        def forward(t, hf=hf):  # noqa: ANN001, ANN202
            return hf(input_ids=t, use_cache=False).logits

        run = torch.compile(forward) if compiled else forward
        if compiled:
            for _ in range(2):  # compile (and recompile for the grad mode) before measuring
                run(tokens).float().sum().backward()
        saved[layers] = _saved_by_autograd(lambda run=run, tokens=tokens: run(tokens), hf.parameters())
    return spec, saved[2] - saved[1]


@pytest.mark.parametrize("held", [True, False])
def test_the_losss_backward_peak_is_what_logits_bytes_counts_measured(held: bool) -> None:
    """PyTorch's F.cross_entropy over logits.float(): the fp32 log-probs it saves and, in its backward, nll_loss's fp32
    gradient and log_softmax's fp32 result, all alive at once (12 B per logit), + the bf16 logits while the caller
    holds them (Hugging Face, the harness; torchtitan deletes them first). The former 2 + 8 B missed 4 B per logit
    (our H200 records: 4.1–4.6 B)."""
    import torch
    import torch.nn.functional as F

    n, v, h = 512, 4000, 64
    spec = ModelSpec(name="lm", layers=1, hidden=h, heads=1, vocab=v)
    x = torch.randn(n, h, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(v, h, dtype=torch.bfloat16, requires_grad=True)
    t = torch.randint(0, v, (n,))

    def step() -> None:
        logits = x @ w.t()
        loss = F.cross_entropy(logits.float(), t)
        if not held:
            del logits
        loss.backward()

    measured = _peak_bytes(step)
    model = M.logits_bytes(spec, n, 1, dtype_bytes=2, kernels="eager", at_backward="held" if held else "freed")
    assert model == n * v * (14 if held else 12)
    assert measured == pytest.approx(model, rel=0.03)
    assert M.logits_bytes(spec, n, 1, dtype_bytes=2, kernels="fused") == n * v * 10  # Megatron's in-place loss


@pytest.mark.slow
@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")), reason="Inductor's CPU backend needs a C++ "
                    "compiler (scripts/setup.sh's machines have g++)")
def test_compile_under_torchtitans_op_sac_drops_the_down_projections_output_measured() -> None:
    """torchtitan's op-level SAC (9dec370's ``_save_list``: every odd mm and the SDPA output MUST_SAVE) keeps, in
    eager, the 7th mm's output, w2's, though the backward never reads it (it only feeds the residual add); under
    torch.compile the partitioner keeps only what the backward reads, so h·δ per token less. Measured on the proxy
    harness's block on CPU: eager by what stays alive after the forward (dispatch level), compiled by what its
    compiled autograd function saves (saved-tensor hooks); the two methods agree on the eager block without AC. The
    published compiled rows ran 5.4 GiB under the eager ones (torchtitan 8B, 8 GPUs); this term is 4 GiB of it."""
    import functools
    from collections import defaultdict

    import torch
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    from trainplan.proxy.model import TransformerBlock, rope_cos_sin

    torch.manual_seed(0)
    spec = ModelSpec(name="blk", layers=1, hidden=256, heads=2, vocab=1000, ffn_hidden=688)
    b, s = 2, 512
    block = TransformerBlock(spec).to(torch.bfloat16)
    cos, sin = rope_cos_sin(s, spec.head_dim, torch.device("cpu"), torch.bfloat16)
    save = {torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}

    def policy(meta, ctx, func, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        mode = "recompute" if ctx.is_recompute else "forward"
        meta[mode] += func == torch.ops.aten.mm.default
        keep = func in save and not (func == torch.ops.aten.mm.default and meta[mode] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    def context():  # a fresh mm count per forward, as torchtitan's selective_checkpointing_context_fn
        return create_selective_checkpoint_contexts(functools.partial(policy, defaultdict(int)))

    def sac(x):  # noqa: ANN001, ANN202
        return checkpoint(block, x, cos, sin, use_reentrant=False, context_fn=context)

    def plain(x):  # noqa: ANN001, ANN202
        return block(x, cos, sin)

    def new_input():  # noqa: ANN202
        return torch.randn(b, s, spec.hidden, dtype=torch.bfloat16, requires_grad=True)

    def alive_after_forward(fn) -> int:  # noqa: ANN001
        x = new_input()
        _, live, y = _tracked_bytes(lambda: fn(x))
        return live - y.untyped_storage().nbytes()

    def saved_by_autograd(fn) -> int:  # noqa: ANN001
        x = new_input()
        for _ in range(2):  # compile (and recompile for the grad mode) before measuring
            fn(x).sum().backward()
        return _saved_by_autograd(lambda: fn(x), (x, cos, sin, *block.parameters()))

    assert alive_after_forward(plain) == saved_by_autograd(plain)  # the two methods agree (eager, no AC)
    eager, compiled = alive_after_forward(sac), saved_by_autograd(torch.compile(sac))
    tokens, block_input = b * s, b * s * spec.hidden * 2  # the block input: saved, and excluded by both methods
    kw = dict(recompute="selective", dtype_bytes=2, sac_policy="torchtitan_op")
    model_eager = M.saved_activation_bytes_per_layer(spec, s, b, **kw)
    model_compiled = M.saved_activation_bytes_per_layer(spec, s, b, compiled=True, **kw)
    assert eager - compiled == tokens * spec.hidden * 2  # w2's output, bf16
    assert eager + block_input == pytest.approx(model_eager, rel=0.01)
    assert compiled + block_input == pytest.approx(model_compiled, rel=0.01)


@pytest.mark.slow
@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")), reason="Inductor's CPU backend needs a C++ "
                    "compiler (scripts/setup.sh's machines have g++)")
def test_compile_without_ac_recomputes_swiglus_silu_measured() -> None:
    """Without activation checkpointing, torch.compile of Hugging Face's Llama block keeps a fused norm's saves (input
    + rstd: Inductor recomputes the normalization) and recomputes SwiGLU's SiLU output from the gate output instead
    of keeping it: f·δ per token less than the fused-norm eager count. Measured by what the compiled autograd
    functions save (saved-tensor hooks), per layer (two layers less one), against the model's compiled figure."""
    b, s = 2, 256
    spec, per_layer = _hf_block_saves_per_layer(b, s, compiled=True)
    kw = dict(dtype_bytes=2, norm_impl="fused")
    assert per_layer == M.saved_activation_bytes_per_layer(spec, s, b, compiled=True, **kw)
    assert M.saved_activation_bytes_per_layer(spec, s, b, **kw) - per_layer == spec.ffn_hidden * 2 * b * s


def test_hugging_faces_rmsnorm_on_a_bf16_stream_keeps_an_fp32_copy_measured() -> None:
    """transformers' LlamaRMSNorm upcasts (``x.to(float32)``, statistics, ``weight * normed.to(bf16)``): on the bf16
    stream of the Accelerate launch (FSDP2 bf16 parameters) it keeps an fp32 copy of its input, the normalized bf16
    value and rstd, 4h B per token more than a fused kernel's input + rstd, twice per layer. Measured on a real
    LlamaDecoderLayer stack in bf16 (what autograd saves, per layer: two layers less one): the model's ``upcast``
    to the byte; ``fused`` (what ``auto`` still sizes for eager kernels: the open next step) 8h B per token under."""
    b, s = 2, 256
    spec, per_layer = _hf_block_saves_per_layer(b, s, compiled=False)
    model = {impl: M.saved_activation_bytes_per_layer(spec, s, b, dtype_bytes=2, norm_impl=impl)
             for impl in ("upcast", "fused")}
    assert per_layer == model["upcast"]
    assert per_layer - model["fused"] == 2 * 4 * spec.hidden * b * s
    upcast = TrainingSpec(seq_len=s, global_batch=8, norm_impl="upcast")
    assert M.resolve_norm_impl(upcast) == "upcast"
    lay = Layout(dp=1, sharding="none")
    one = M.stage_breakdown(spec, cluster(1), upcast, lay)["activations"] - M.stage_breakdown(
        spec, cluster(1), replace(upcast, norm_impl="fused"), lay)["activations"]
    assert one == 2 * 4 * spec.hidden * b * s  # the planner's activations carry it, one layer here


@pytest.mark.parametrize("b", [1, 2])
def test_torchtitans_chunked_loss_holds_what_logits_bytes_counts_measured(b: int) -> None:
    """torchtitan 0.3's ChunkedLossWrapper (the launch's torchtitan job), run here with its CrossEntropyLoss over a
    bf16 head: one chunk's logits and loss at a time (14 B per logit of the chunk), the chunk's hidden-state
    gradient, the fp32 GradAccumulator buffer (4h per token) and, for b > 1, the chunks' contiguous copies. The head's
    weight gradient, which the plan counts with the gradients, is taken out. A whole-sequence loss would hold
    14 B per logit: 7.7× as much at these shapes."""
    import torch

    titan_loss = pytest.importorskip("torchtitan.components.loss")
    n, v, h = 512, 4000, 64
    spec = ModelSpec(name="lm", layers=1, hidden=h, heads=1, vocab=v)
    head = torch.nn.Linear(h, v, bias=False, dtype=torch.bfloat16)
    wrapper = titan_loss.ChunkedLossWrapper.Config(
        loss_fn=titan_loss.CrossEntropyLoss.Config(global_vocab_size=v)).build()
    wrapper.set_lm_head(head)
    assert wrapper.num_chunks == M.LOSS_CHUNKS
    x = torch.randn(b, n, h, dtype=torch.bfloat16, requires_grad=True)
    hidden, t = x * 1.0, torch.randint(0, v, (b, n))

    def step() -> None:
        loss, _ = wrapper(hidden, t)
        loss.backward()

    measured = _peak_bytes(step) - head.weight.numel() * 2
    model = M.logits_bytes(spec, n, b, dtype_bytes=2, kernels="eager", at_backward="chunked")
    assert measured == pytest.approx(model, rel=0.02)
    assert M.logits_bytes(spec, n, b, dtype_bytes=2, kernels="eager") > 3 * model


def test_foreach_adamws_step_holds_one_fp32_tensor_per_parameter_measured() -> None:
    """torch.optim.AdamW(foreach=True) (the default on CUDA: the proxy harness) builds _foreach_sqrt(exp_avg_sq)
    for every parameter at once: 4 B per parameter above the states; fused=True builds none. A harness run whose
    activations are small peaks there (our H200 sequence ladder at 1k and 2k tokens)."""
    import torch

    p = [torch.nn.Parameter(torch.randn(256, 256)) for _ in range(4)]
    n = sum(q.numel() for q in p)
    for q in p:
        q.grad = torch.randn_like(q)
    opt = torch.optim.AdamW(p, lr=1e-3, foreach=True)
    opt.step()  # creates the states; the measured step allocates only its temporaries
    assert _peak_bytes(opt.step) == pytest.approx(4 * n, rel=0.05)
    one = Layout(dp=1, sharding="none")
    harness = replace(TRAIN, optimizer_impl="foreach")
    st = M.model_states(LLAMA13, harness, one, cluster(1))
    trainable = st["optimizer"] / 12  # fp32 master + m + v per parameter
    assert M.optimizer_step_temp_bytes(LLAMA13, harness, one, cluster(1)) == pytest.approx(4 * trainable)
    assert M.optimizer_step_temp_bytes(LLAMA13, TRAIN, one, cluster(1)) == 0.0  # fused: production
    z2 = Layout(dp=32, sharding="zero2")
    assert M.optimizer_step_temp_bytes(LLAMA13, harness, z2, cluster()) == pytest.approx(4 * trainable / 32)


def test_the_optimizer_step_is_the_peak_when_the_states_outweigh_the_activations() -> None:
    """Few activations (short sequence, 2 layers), foreach AdamW: the breakdown is the step's (states + temporaries
    as buffers), larger than the backward's; with fused AdamW or long sequences, the backward's."""
    small = LLAMA13.with_layers(2)
    one = Layout(dp=1, sharding="none")
    harness = TrainingSpec(seq_len=1024, global_batch=8, optimizer_impl="foreach")
    bd = M.stage_breakdown(small, cluster(1), harness, one)
    fused = M.stage_breakdown(small, cluster(1), replace(harness, optimizer_impl="fused"), one)
    temp = M.optimizer_step_temp_bytes(small, harness, one, cluster(1))
    assert bd["activations"] == bd["logits"] == 0.0 and bd["buffers"] == temp
    assert bd["total"] > fused["total"] and fused["activations"] > 0
    assert bd["total"] == pytest.approx(sum(bd[k] for k in M.TERMS[:-1]))
    long = M.stage_breakdown(small, cluster(1), replace(harness, seq_len=16384), one)
    assert long["activations"] > 0 and long["buffers"] != temp


def test_first_stage_holds_at_most_as_many_micro_batches_as_there_are() -> None:
    """1F1B: min(pp, m) in flight on the first stage (a step with fewer micro-batches than stages holds m)."""
    assert M.pipeline_in_flight(8, 2) == 2 and M.pipeline_in_flight(4, 16) == 4
    assert M.pipeline_in_flight(8, 2, "last") == 1


def test_recompute_adds_one_layers_rebuilt_activations_on_top_of_what_it_stores() -> None:
    lay = Layout(dp=32, sharding="zero3", recompute="full")
    assert M.hf_norms(LLAMA13, TRAIN, lay)  # (pure DP, eager: the Accelerate launch, Hugging Face's norms)
    kw = M.activation_kwargs(TRAIN, lay, norm_impl="upcast")
    full = M.saved_activation_bytes_per_layer(LLAMA13, 4096, 1, recompute="full", **kw)
    none = M.saved_activation_bytes_per_layer(LLAMA13, 4096, 1, **kw)
    extra = M.embedding_saved_bytes(LLAMA13, 4096, 1) + M.rope_table_bytes(LLAMA13, 4096)
    assert M.activation_bytes(LLAMA13, TRAIN, lay) == pytest.approx(LLAMA13.layers * full + none + extra)


def test_a_tied_lm_head_is_held_again_by_the_last_stage_under_pp() -> None:
    """Megatron: a tied embedding/LM-head matrix is held once at pp=1, by both end stages at pp>1."""
    tied = replace(LLAMA13, tied_embeddings=True)
    vh = LLAMA13.vocab * LLAMA13.hidden
    for pp in (2, 4):
        last = M.stage_params(tied, pp=pp, stage="last")["other"]
        assert last == pytest.approx(M.stage_params(LLAMA13, pp=pp, stage="last")["other"])
        assert last > vh
    assert M.stage_params(LLAMA13, pp=1)["other"] - M.stage_params(tied, pp=1)["other"] == pytest.approx(vh)


def test_host_offload_is_sized_on_the_heavier_pipeline_stage() -> None:
    lay = Layout(dp=16, pp=2, sharding="zero1", offload="cpu")
    per_stage = []
    for stage in ("first", "last"):
        raw = M.model_states(LLAMA13, TRAIN, lay, cluster(), stage, on_device=False)
        dev = M.model_states(LLAMA13, TRAIN, lay, cluster(), stage)
        per_stage.append(sum(raw[k] - dev[k] for k in raw))
    assert per_stage[0] != per_stage[1]
    assert M.host_offload_bytes(LLAMA13, TRAIN, lay, cluster()) == pytest.approx(max(per_stage), rel=1e-12)
