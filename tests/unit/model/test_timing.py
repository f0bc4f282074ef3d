"""Step-time model: comm conventions, vectorisation (Layout vs LayoutTable), monotonic behaviour."""

import numpy as np
import pytest

from trainplan.model import comm, timing
from trainplan.model.arch import resolve_model
from trainplan.model.base import ConfigError
from trainplan.model.efficiency import Efficiency
from trainplan.model.hardware import ClusterSpec, resolve_gpu
from trainplan.model.layout import Layout, LayoutTable
from trainplan.model.timing import TIMING_KEYS, step_time
from trainplan.model.training import TrainingSpec

MODEL = resolve_model("llama2-13b")
CLUSTER = ClusterSpec(nodes=4, gpus_per_node=8, gpu=resolve_gpu("h100-sxm-80gb"))
TRAIN = TrainingSpec(seq_len=4096, global_batch=256)
LAYOUTS = [Layout(dp=32), Layout(dp=16, tp=2, sp=True, micro_batch=2), Layout(dp=4, tp=8, sharding="zero1"),
           Layout(dp=8, tp=2, pp=2, pp_schedule="interleaved", vpp=2, recompute="full"),
           Layout(dp=16, cp=2, cp_kind="ulysses", sharding="hsdp", shard_group=8, offload="cpu")]


def test_nccl_busbw_conventions():
    eff = Efficiency(comm_bw_eff=1.0)
    n, nbytes, bw = 8, 1e9, 100e9
    assert comm.all_reduce_s(nbytes, n, bw, 0.0, eff) == pytest.approx(nbytes / (bw * n / (2 * (n - 1))))
    assert comm.all_gather_s(nbytes, n, bw, 0.0, eff) == pytest.approx(nbytes / (bw * n / (n - 1)))
    assert comm.all_gather_s(nbytes, 1, bw, 0.0, eff) == 0.0


def test_group_link_intra_vs_inter():
    bw_in, _ = comm.group_link(CLUSTER, 8, 1)
    bw_x1, _ = comm.group_link(CLUSTER, 4, 8)  # one rank per node: one rail
    bw_x8, _ = comm.group_link(CLUSTER, 32, 1)  # all 8 rails of each node
    assert bw_in == CLUSTER.intra_busbw_Bps
    assert bw_x1 == CLUSTER.inter_busbw_Bps
    assert bw_x1 < bw_x8 <= bw_in


def test_table_matches_scalar_rows():
    table = step_time(MODEL, CLUSTER, TRAIN, LayoutTable.from_layouts(LAYOUTS))
    for i, lay in enumerate(LAYOUTS):
        one = step_time(MODEL, CLUSTER, TRAIN, lay)
        for k in TIMING_KEYS:
            assert table[k][i] == pytest.approx(one[k], rel=1e-12), (k, lay.describe())


def test_step_is_sum_of_parts_and_tokens_consistent():
    r = step_time(MODEL, CLUSTER, TRAIN, LAYOUTS[3])
    parts = r["compute_s"] + r["comm_exposed_s"] + r["bubble_s"] + r["optimizer_s"] + r["offload_s"]
    assert r["step_time_s"] == pytest.approx(parts)
    assert r["tokens_per_s"] == pytest.approx(TRAIN.tokens_per_step / r["step_time_s"])
    assert r["bubble_s"] > 0 and 0 < r["mfu"] < r["hfu"] < 1


def test_recompute_costs_time_and_tp_exposes_comm():
    base = step_time(MODEL, CLUSTER, TRAIN, Layout(dp=32))
    full = step_time(MODEL, CLUSTER, TRAIN, Layout(dp=32, recompute="full"))
    assert full["step_time_s"] > base["step_time_s"] and full["mfu"] < base["mfu"]
    tp8 = step_time(MODEL, CLUSTER, TRAIN, Layout(dp=4, tp=8, sp=True))
    assert tp8["tp_comm_s"] > 0 and base["tp_comm_s"] == 0


def test_slower_network_never_speeds_up():
    slow = ClusterSpec(nodes=4, gpus_per_node=8, gpu=CLUSTER.gpu, inter_busbw_Bps=5e9)
    for lay in LAYOUTS:
        assert step_time(MODEL, slow, TRAIN, lay)["step_time_s"] >= step_time(MODEL, CLUSTER, TRAIN, lay)["step_time_s"]


def test_efficiency_round_trip_and_errors():
    e = Efficiency().replace(attn_eff=0.6, source="calibrated:test")
    assert Efficiency.from_dict(e.to_dict()) == e
    assert set(Efficiency.FITTABLE) <= set(e.to_dict())
    with pytest.raises(ConfigError, match="efficiency.bogus"):
        Efficiency.from_dict({"bogus": 1})
    with pytest.raises(ConfigError, match="gemm_eff_max"):
        Efficiency(gemm_eff_max=1.5)
    assert np.isfinite(step_time(MODEL, CLUSTER, TRAIN, Layout(dp=32), e)["step_time_s"])


# --- kernel physics (docs/timing-model.md) ---------------------------------------------------------------
A100 = ClusterSpec(nodes=4, gpus_per_node=8, gpu=resolve_gpu("a100-80gb"))


def test_eager_llama_block_bytes_match_the_derivation():
    """docs/timing-model.md §2, bf16: 72h (2 fp32-upcast RMSNorms) + 12h (2 residual adds)
    + 20(h+kv) (complex RoPE on q, k) + 4(kv+h) (GQA repeat_kv of k, v) + 10f (SiLU·up)."""
    m = resolve_model("llama3.1-8b")
    h, kv, f = m.hidden, m.kv_dim, m.ffn_hidden
    want = 72 * h + 12 * h + 20 * (h + kv) + 4 * (kv + h) + 10 * f
    assert timing.membound_bytes_fwd(m, "eager", 1, False, 2.0) == pytest.approx(want)
    fused = timing.membound_bytes_fwd(m, "fused", 1, False, 2.0)
    assert fused == pytest.approx(8 * h + 12 * h + 4 * (h + kv) + 6 * f)  # 2 fused norms, adds, RoPE, SwiGLU
    compiled = timing.membound_bytes_fwd(m, "compiled", 1, False, 2.0)
    # compiled still copies GQA k/v (SDPA is an extern kernel) and runs complex RoPE eagerly (no Inductor codegen)
    assert compiled - fused == pytest.approx(4 * (kv + h) + (20 - 4) * (h + kv))


def test_eager_costs_more_on_h100_than_on_a100():
    """Same bytes, 2× the FLOP/B ridge: the eager-vs-fused slowdown is larger on H100 (docs §2)."""
    lay = Layout(dp=32)
    slow = {}
    for name, c in (("h100", CLUSTER), ("a100", A100)):
        t = {k: step_time(MODEL, c, TrainingSpec(seq_len=4096, global_batch=256, kernels=k), lay)["step_time_s"]
             for k in ("eager", "fused")}
        slow[name] = t["eager"] / t["fused"]
    assert slow["h100"] > slow["a100"] > 1.0


def test_materialised_attention_is_slower_than_flash():
    flash = step_time(MODEL, CLUSTER, TRAIN, Layout(dp=32))["step_time_s"]
    math = step_time(MODEL, CLUSTER, TrainingSpec(seq_len=4096, global_batch=256, attn_impl="math"),
                     Layout(dp=32))["step_time_s"]
    assert math > flash


def test_fsdp2_copies_only_for_fsdp():
    assert timing.fsdp_copy_mb_s(MODEL, TRAIN, Layout(dp=32, sharding="zero3"), 3.35e12, Efficiency()) > 0
    assert timing.fsdp_copy_mb_s(MODEL, TRAIN, Layout(dp=32, sharding="zero2"), 3.35e12, Efficiency()) == 0


def test_selective_recompute_semantics_per_framework():
    g, a, e = 3.0, 1.0, 2.0
    assert timing.selective_redo_s(g, a, e, "fused") == a  # Megatron: attention core only
    assert timing.selective_redo_s(g, a, e, "eager") == 0.5 * g + e  # torchtitan op-level SAC


def test_busiest_stage_takes_the_ceiling():
    assert timing.busiest_stage_layers(126, 8, 1) == 16
    assert timing.busiest_stage_layers(126, 8, 2) == 16  # ceil(126/16)=8 per virtual stage × 2
    assert timing.busiest_stage_layers(40, 4, 1) == 10


def test_kernel_switches_reject_bad_values():
    with pytest.raises(ConfigError, match="kernels"):
        TrainingSpec(seq_len=8, global_batch=1, kernels="jit")
    with pytest.raises(ConfigError, match="attn_impl"):
        TrainingSpec(seq_len=8, global_batch=1, attn_impl="xformers")


@pytest.mark.parametrize("kernels", ["eager", "compiled", "fused"])
def test_table_matches_scalar_rows_for_every_kernel_kind(kernels):
    train = TrainingSpec(seq_len=4096, global_batch=256, kernels=kernels)
    table = step_time(MODEL, CLUSTER, train, LayoutTable.from_layouts(LAYOUTS))
    for i, lay in enumerate(LAYOUTS):
        assert table["step_time_s"][i] == pytest.approx(step_time(MODEL, CLUSTER, train, lay)["step_time_s"], rel=1e-12)


@pytest.mark.parametrize("recompute,passes", [("none", 2.0), ("selective", 2.5), ("full", 3.0)])
def test_qlora_pays_the_nf4_dequantisation_and_lora_does_not(recompute, passes):
    from dataclasses import replace

    from trainplan.model.memory import NF4_BYTES_PER_PARAM, layer_matmul_params_per_rank

    lay = Layout(dp=16, tp=2, sp=True, sharding="zero1", recompute=recompute, micro_batch=2)
    lora = TrainingSpec(seq_len=4096, global_batch=256, finetune="lora", lora_rank=64)
    qlora = replace(lora, finetune="qlora")
    eff = Efficiency()
    # the whole difference is the dequantisation term: same FLOPs, same (adapter-only) gradients
    d = step_time(MODEL, CLUSTER, qlora, lay, eff)["compute_s"] - step_time(MODEL, CLUSTER, lora, lay, eff)["compute_s"]
    m = 256 // (16 * 2)
    by_hand = (m * passes * MODEL.layers * layer_matmul_params_per_rank(MODEL, 2) * (NF4_BYTES_PER_PARAM + 2.0)
               / (CLUSTER.gpu.hbm_bw_Bps * eff.membound_eff))
    assert d == pytest.approx(float(by_hand), rel=1e-9)
    assert timing.qlora_dequant_mb_s(MODEL, lora, lay, MODEL.layers, 3.35e12, eff, 2.0) == 0.0


# --- PyTorch ring attention (docs/timing-model.md §7.4) ---------------------------------------------------------
def test_ring_overhead_bytes_zero_at_cp1_monotone_and_hand_counted():
    """Merge / fp32-accumulate traffic of torch's ring attention: none without CP, growing with the ring steps, and
    equal to the kernel-by-kernel count for cp = 4, q = kv = 1 (K and V: 2 elements per token), bf16."""
    f1, b1 = timing.ring_overhead_bytes(1, 1.0, 1.0, 2.0)
    assert f1 == 0.0 and b1 == 0.0
    cps = np.array([2, 4, 8, 16])
    f, b = timing.ring_overhead_bytes(cps, 1.0, 1.0, 2.0)
    assert np.all(np.diff(f) > 0) and np.all(np.diff(b) > 0)
    # forward: K,V contiguous + 3 concatenations (2e each, 4 times, for K and V); upcast of step 0 and final cast
    # (6 + 6); 3 merges of 38 B (upcast 6, difference 12, product 8, subtraction 12)
    want_f = 2 * (2 * 2.0 * 4) + 2 * 6.0 + 3 * 38.0
    # backward per K/V element: zeros 4, contiguous + 3 cats 16, first add 10, 3 half-adds with cat 39, 4 send cats 32,
    # the first send's copy out of the strided fp32 buffer 8, final cast 6; per q element: zeros 4, 4 adds of 10,
    # final cast 6
    want_b = 2 * (4 + 16 + 10 + 39 + 32 + 8 + 6) + (4 + 40 + 6)
    fb = timing.ring_overhead_bytes(4, 1.0, 1.0, 2.0)
    assert fb[0] == pytest.approx(want_f) and fb[1] == pytest.approx(want_b)


def test_ring_overhead_only_for_pytorch_cp_and_grows_with_cp():
    """eager/compiled ring CP pays the merge traffic (more at cp 8 than cp 2 per token and block, with the same
    per-rank tokens); fused (TE / Meta) and Ulysses pay none; full recompute reruns the forward ring."""
    m = resolve_model("llama3.1-8b")
    eff = Efficiency()
    hbm = 3.35e12
    t = TrainingSpec(seq_len=65536, global_batch=8, kernels="compiled")
    tokens = 8192.0
    lays = [Layout(dp=8 // c, cp=c, sharding="zero3", recompute="full") for c in (1, 2, 8)]
    got = [float(timing.ring_overhead_mb_s(m, t, tokens, lay, 32, hbm, eff, 2.0)) for lay in lays]
    assert got[0] == 0.0 and 0.0 < got[1] < got[2]
    fused = TrainingSpec(seq_len=65536, global_batch=8, kernels="fused")
    assert timing.ring_overhead_mb_s(m, fused, tokens, lays[2], 32, hbm, eff, 2.0) == 0.0
    uly = Layout(dp=1, cp=8, cp_kind="ulysses", sharding="zero3", recompute="full")
    assert float(timing.ring_overhead_mb_s(m, t, tokens, uly, 32, hbm, eff, 2.0)) == 0.0
    none = Layout(dp=1, cp=8, sharding="zero3", recompute="none")
    f, b = timing.ring_overhead_bytes(8, m.heads * m.head_dim, m.heads * m.head_dim, 2.0)
    assert got[2] - float(timing.ring_overhead_mb_s(m, t, tokens, none, 32, hbm, eff, 2.0)) == pytest.approx(
        32 * tokens * f / (hbm * eff.membound_eff))
    # vectorised over a LayoutTable like every other term
    table = LayoutTable.from_layouts(lays)
    assert np.allclose(timing.ring_overhead_mb_s(m, t, tokens, table, 32, hbm, eff, 2.0), got)


def test_pytorch_ring_passes_gqa_repeated_kv():
    """torchtitan/HF call SDPA after repeat_kv, so PyTorch CP rotates q-wide K, V; Megatron/TE the GQA kv_dim."""
    m = resolve_model("llama3.1-8b")
    assert timing.ring_kv_width(m, "compiled") == m.heads * m.head_dim == 4 * timing.ring_kv_width(m, "fused")


def test_attention_efficiency_saturates_in_keys_times_head_dim():
    """attn_eff · w/(w + half), w = keys·head_dim: the ceiling at long calls, half of it at w = half, 1 at half = 0."""
    e = Efficiency(attn_eff=0.3, attn_eff_half_work=54_000.0)
    assert timing.attn_eff_at(54_000 / 128, 128, e) == pytest.approx(0.15)
    got = timing.attn_eff_at(np.array([512, 1024, 4096, 32768, 2**22]), 128, e)
    assert np.all(np.diff(got) > 0) and got[-1] == pytest.approx(0.3, rel=1e-3)
    assert timing.attn_eff_at(2048, 64, e) < timing.attn_eff_at(2048, 128, e)  # same keys, narrower heads: slower
    assert timing.attn_eff_at(512, 64, Efficiency(attn_eff=0.3)) == 0.3  # half = 0 (the A100 default): constant
    with pytest.raises(ConfigError, match="attn_eff_half_work"):
        Efficiency(attn_eff_half_work=-1.0)


def test_short_sequences_and_cp_chunks_pay_the_attention_shape_term():
    """Attention time per FLOP is higher at seq 512 than at 8k; under CP each ring call sees s/cp keys."""
    e = Efficiency(attn_eff=0.3, attn_eff_half_work=54_000.0)
    m, peak = resolve_model("llama3-8b"), 989e12
    per_flop = [timing.attn_fwd_s(m, 8192.0, s, 1, peak, e) / (8192.0 * s) for s in (512, 8192)]
    assert per_flop[0] / per_flop[1] == pytest.approx((512 * 128 + 54_000) / (512 * 128) * 8192 * 128
                                                      / (8192 * 128 + 54_000))
    assert timing.attn_fwd_s(m, 4096.0, 32768, 1, peak, e, cp=8) == pytest.approx(
        timing.attn_fwd_s(m, 4096.0, 32768, 1, peak, e) * timing.attn_eff_at(32768, 128, e)
        / timing.attn_eff_at(4096, 128, e))
    off = Efficiency(attn_eff=0.3)
    t = TrainingSpec(seq_len=1024, global_batch=64)
    slow, fast = step_time(m, CLUSTER, t, Layout(dp=32), e), step_time(m, CLUSTER, t, Layout(dp=32), off)
    assert slow["step_time_s"] > fast["step_time_s"]


def test_block_gemm_widths_per_rank_shapes():
    """Separate q/k/v and gate/up for PyTorch kernels: under GQA + TP the K/V GEMMs are the narrowest (Llama-3 8B at
    tp8: 1024/8 = 128 columns); Megatron/TE fuses QKV and gate·up; K/V never split below one head."""
    m = resolve_model("llama3.1-8b")  # h 4096, 32 q heads, 8 kv heads × 128, ffn 14336
    eager = timing.block_gemm_widths(m, "eager", 8)
    assert [float(n) for n, _ in eager] == [512.0, 128.0, 128.0, 4096.0, 1792.0, 1792.0, 4096.0]
    assert [float(k) for _, k in eager] == [4096.0, 4096.0, 4096.0, 512.0, 4096.0, 4096.0, 1792.0]
    assert timing.block_gemm_widths(m, "compiled", 8) == eager
    fused = timing.block_gemm_widths(m, "fused", 8)
    assert [float(n) for n, _ in fused] == [512.0 + 256.0, 4096.0, 2 * 1792.0, 4096.0]
    assert float(timing.block_gemm_widths(m, "eager", 16)[1][0]) == 128.0  # 8 kv heads over 16 ranks: one head each
    # the same FLOPs either way: only the shapes (so the efficiencies) differ
    nk = lambda ws: sum(float(n) * float(k) for n, k in ws)  # noqa: E731
    assert nk(eager) == pytest.approx(nk(fused))


def test_per_gemm_efficiency_slows_narrow_kv_gemms_only_when_shape_matters():
    m, peak = resolve_model("llama3.1-8b"), 989e12
    eff = Efficiency(gemm_eff_max=0.7, gemm_eff_half_dim=256.0)
    tok = np.array([8192.0, 8192.0])
    tp = np.array([1, 8])
    sep, fus = (timing.layer_gemm_fwd_s(m, tok, tp, peak, eff, k) for k in ("eager", "fused"))
    assert np.all(sep > fus)  # separate K/V (and gate/up) GEMMs are narrower than the fused ones
    assert sep[1] / fus[1] > sep[0] / fus[0]  # and more so under TP8 (128-wide K/V)
    # all widths equal (no shape term): the per-GEMM sum is the old fused-block time, for a Layout or a table
    flat = Efficiency(gemm_eff_max=0.7, gemm_eff_half_dim=1e-12)
    old = lambda t: (2 * 8192 * (4096 + 2048) / t * 4096 + 2 * 8192 * 4096 * 4096 / t  # noqa: E731
                     + 2 * 8192 * 2 * 14336 / t * 4096 + 2 * 8192 * 4096 * 14336 / t) / (peak * 0.7)
    np.testing.assert_allclose(timing.layer_gemm_fwd_s(m, tok, tp, peak, flat, "eager"), [old(1), old(8)], rtol=1e-9)
    assert timing.layer_gemm_fwd_s(m, 8192.0, 8, peak, flat, "fused") == pytest.approx(old(8))
    # fused kernels keep the previous fused-QKV formula at any half_dim
    h, kv = 4096, 1024
    fused_old = sum(2 * 8192 * n * k / (peak * float(timing.gemm_eff(8192, n, k, eff)))
                    for n, k in [((h + 2 * kv) / 8, h), (h, h / 8), (2 * 14336 / 8, h), (h, 14336 / 8)])
    assert float(fus[1]) == pytest.approx(fused_old)


def test_gemm_efficiency_uses_the_smallest_dimension():
    eff = Efficiency(gemm_eff_max=0.8, gemm_eff_half_dim=256.0)
    assert float(timing.gemm_eff(65536, 128, 4096, eff)) == pytest.approx(0.8 * 128 / 384)
    assert float(timing.gemm_eff(65536, 4096, 128, eff)) == pytest.approx(0.8 * 128 / 384)
    assert float(timing.gemm_eff(256, 4096, 4096, eff)) == pytest.approx(0.4)


def test_flash_calls_see_one_ring_chunk_but_the_whole_sequence_under_ulysses():
    """Ring CP: each step's call sees s/cp keys; Ulysses: one call over all s keys (heads/cp): so with the call-size
    term on, Ulysses attention runs at the no-CP efficiency and ring's at the shorter chunk's."""
    ring, uly = Layout(dp=4, cp=4, sharding="zero3"), Layout(dp=4, cp=4, cp_kind="ulysses", sharding="zero3")
    assert timing.attn_keys_per_call(8192, ring) == 2048 and timing.attn_keys_per_call(8192, uly) == 8192
    assert timing.attn_keys_per_call(8192, Layout(dp=16)) == 8192
    table = LayoutTable.from_layouts([ring, uly])
    assert list(timing.attn_keys_per_call(8192, table)) == [2048, 8192]


@pytest.mark.parametrize("kernels", ["eager", "compiled", "fused"])
def test_norm_traffic_follows_the_norms_a_block_has(kernels):
    """Non-GEMM bytes count every norm of the block (Gemma 2/3: 4, Falcon/Cohere: 1) and the per-head q/k norms
    over the q and k widths (Qwen3, Gemma 3); RoPE and the GQA copy run over q's width (heads·head_dim, which is
    not hidden for Gemma)."""
    from dataclasses import replace

    m = resolve_model("llama3-8b")
    e, tp = 2.0, 2
    per_norm = timing.norm_bytes_per_elem(m, kernels, e)
    b = {n: float(timing.membound_bytes_fwd(replace(m, norms_per_layer=n), kernels, tp, False, e)) for n in (1, 2, 4)}
    assert b[4] - b[2] == pytest.approx(2 * per_norm * m.hidden) and b[2] - b[1] == pytest.approx(per_norm * m.hidden)
    qk = float(timing.membound_bytes_fwd(replace(m, qk_norm=True), kernels, tp, False, e)) - b[2]
    assert qk == pytest.approx(per_norm * (m.q_dim + m.kv_dim) / tp)
    wide = replace(m, head_dim_override=256)  # q_dim 8192 ≠ hidden 4096, as Gemma
    extra = float(timing.membound_bytes_fwd(wide, kernels, tp, False, e)) - b[2]
    rope = (16.0 + 2 * e if kernels != "fused" else 2 * e) * (wide.q_dim + wide.kv_dim - m.q_dim - m.kv_dim)
    gqa = 2 * e * (wide.q_dim + wide.kv_dim - m.q_dim - m.kv_dim) if kernels != "fused" else 0.0
    assert extra == pytest.approx((rope + gqa) / tp)


def test_the_harness_block_code_moves_what_its_kernels_move():
    """docs/timing-model.md §7.13, Llama-2-13B (MHA), bf16: the harness's block (trainplan.proxy.model) runs one
    F.rms_norm kernel per norm (2e), its real interleaved RoPE (4 muls over the halves, sub, add, stack: 2e + 7e per
    q/k element) and no repeat_kv. Under autocast its residual stream is fp32: norms 2·4, adds 4 + 2 + 4, five casts
    of the fp32 norm output (q, k, v; gate, up: 6 each), RoPE into fp32 (2·2 + 7·4) then SDPA's cast back (6);
    compiled, Inductor fuses the casts into the norm (4 r, 2 w) and RoPE (2 r, 2 w)."""
    m = resolve_model("llama2-13b")
    h, kv, f = m.hidden, m.kv_dim, m.ffn_hidden
    eager = timing.membound_bytes_fwd(m, "eager", 1, False, 2.0, "harness")
    assert eager == pytest.approx(2 * 4 * h + 2 * 6 * h + 18 * (h + kv) + 10 * f)
    auto = timing.membound_bytes_fwd(m, "eager", 1, False, 2.0)  # torchtitan / HF: 36 B norms, complex RoPE
    assert auto - eager == pytest.approx(2 * 32 * h + 2 * (h + kv))
    ac = timing.membound_bytes_fwd(m, "eager", 1, False, 2.0, "harness", True)
    assert ac == pytest.approx(2 * 8 * h + 2 * 10 * h + 30 * h + 38 * (h + kv) + 10 * f)
    comp = timing.membound_bytes_fwd(m, "compiled", 1, False, 2.0, "harness", True)
    assert comp == pytest.approx(2 * 6 * h + 2 * 10 * h + 4 * (h + kv) + 6 * f)
    g = resolve_model("llama3.1-8b")  # GQA: SDPA's enable_gqa, no copy of k, v
    no_copy = timing.membound_bytes_fwd(g, "eager", 1, False, 2.0, "harness")
    assert no_copy == pytest.approx(2 * 4 * g.hidden + 12 * g.hidden + 18 * (g.hidden + g.kv_dim) + 10 * g.ffn_hidden)
    with pytest.raises(ConfigError, match="block_impl"):
        TrainingSpec(seq_len=4096, global_batch=8, block_impl="megatron")


def test_autocast_weight_casts_cost_what_they_stream():
    """bf16_via='autocast' (the harness on one rank): per micro-batch every block linear and the head cast fp32 → bf16
    (6 B) and back in backward (6 B), redone under recompute; from the 2nd micro-batch on the fp32 gradient is
    accumulated (12 B). Each at the rate measured for that kernel on Hopper (timing.stream_frac), at HBM speed ×
    membound_eff elsewhere; nothing for bf16 parameters (production)."""
    m = resolve_model("llama2-13b")
    small = type(m).from_dict({**m.to_dict(), "layers": 2})
    w = 2 * float(timing.layer_matmul_params_per_rank(small)) + small.vocab * small.hidden
    for gpu in ("h100-sxm-80gb", "a100-80gb"):
        one = ClusterSpec(nodes=1, gpus_per_node=1, gpu=resolve_gpu(gpu))
        eff = Efficiency.for_gpu(one.gpu)
        hbm = one.gpu.hbm_bw_Bps
        if one.gpu.generation == "h100":
            down, up, add = (hbm * timing.stream_frac(k)
                             for k in ("cast_fp32_to_bf16", "cast_bf16_to_fp32", "add_fp32_inplace"))
        else:
            down = up = add = hbm * eff.membound_eff
        for gb, rc in ((8, "none"), (32, "none"), (8, "full")):
            lay = Layout(dp=1, sharding="none", recompute=rc)
            base = TrainingSpec(seq_len=4096, global_batch=gb)
            ac = TrainingSpec(seq_len=4096, global_batch=gb, bf16_via="autocast")
            extra = (step_time(small, one, ac, lay, eff)["step_time_s"]
                     - step_time(small, one, base, lay, eff)["step_time_s"])
            redo = 2 * float(timing.layer_matmul_params_per_rank(small)) * 6 if rc == "full" else 0.0
            want = gb * (6 * w / down + 6 * w / up + redo / down) + (gb - 1) * 12 * w / add
            # plus the fp32 residual stream's elementwise bytes (§7.13), forward, backward (2x) and the recompute
            d_e = 4096 * float(timing.membound_bytes_fwd(small, "eager", 1, False, 2.0, "auto", True)
                               - timing.membound_bytes_fwd(small, "eager", 1, False, 2.0)) / (hbm * eff.membound_eff)
            want += gb * 2 * d_e * (1 + timing.MEMBOUND_BWD_FACTOR + (1 if rc == "full" else 0))
            assert extra == pytest.approx(want, rel=1e-9), (gpu, gb, rc)
    assert timing.autocast_cast_s(small, TrainingSpec(seq_len=4096, global_batch=8), Layout(dp=1), 2, 1.0, eff) == (0.0, 0.0)
    with pytest.raises(ConfigError, match="bf16_via"):
        TrainingSpec(seq_len=4096, global_batch=8, bf16_via="fp16")
    for kw in ({"precision": "fp8-tensorwise"}, {"finetune": "qlora"}):  # the harness runs neither under autocast
        with pytest.raises(ConfigError, match="bf16_via='autocast'"):
            TrainingSpec(seq_len=4096, global_batch=8, bf16_via="autocast", **kw)


def test_the_optimizer_step_streams_at_its_kernels_measured_rate():
    """training.optimizer_impl: on Hopper the AdamW update (p, g, m, v read, p, m, v written: 28 B per parameter)
    streams at the rate measured for the kernels that run it (stream_frac of adamw_fused / adamw_foreach, one H200
    session), the bf16 weight copy (the rest of optimizer_bytes_per_param_traffic) at membound_eff; elsewhere, and for
    SGD, everything at membound_eff. Nothing else in the step moves."""
    m = resolve_model("llama2-13b")
    lay = Layout(dp=32, sharding="zero2")
    local = m.n_params / 32
    for gpu in ("h100-sxm-80gb", "a100-80gb"):
        c = ClusterSpec(nodes=4, gpus_per_node=8, gpu=resolve_gpu(gpu))
        eff = Efficiency.for_gpu(c.gpu)
        hbm = c.gpu.hbm_bw_Bps
        t = {impl: step_time(m, c, TrainingSpec(seq_len=4096, global_batch=256, optimizer_impl=impl), lay, eff)
             for impl in ("fused", "foreach")}
        copy = (eff.optimizer_bytes_per_param_traffic - timing.ADAMW_STEP_BYTES) / (hbm * eff.membound_eff)
        for impl, kernel in (("fused", "adamw_fused"), ("foreach", "adamw_foreach")):
            plain = local * eff.optimizer_bytes_per_param_traffic / (hbm * eff.membound_eff)
            want = (local * (timing.ADAMW_STEP_BYTES / (hbm * timing.stream_frac(kernel)) + copy)
                    if c.gpu.generation == "h100" else plain)
            assert t[impl]["optimizer_s"] == pytest.approx(want, rel=1e-12), (gpu, impl)
            assert t[impl]["compute_s"] == t["fused"]["compute_s"]
        if c.gpu.generation == "h100":  # the measured rates differ: foreach makes more passes over the state
            assert t["foreach"]["optimizer_s"] > 2 * t["fused"]["optimizer_s"]
        else:
            assert t["foreach"]["optimizer_s"] == t["fused"]["optimizer_s"]
        sgd = {impl: step_time(m, c, TrainingSpec(seq_len=4096, global_batch=256, optimizer="sgd", optimizer_impl=impl),
                               lay, eff)["optimizer_s"] for impl in ("fused", "foreach")}
        assert sgd["fused"] == sgd["foreach"] == pytest.approx(
            local * eff.optimizer_bytes_per_param_traffic / (hbm * eff.membound_eff), rel=1e-12)
    with pytest.raises(ConfigError, match="optimizer_impl"):
        TrainingSpec(seq_len=4096, global_batch=8, optimizer_impl="for-loop")


def test_compute_parts_are_inside_compute_and_only_where_their_technique_is():
    """timing.COMPUTE_PARTS: each is ≥ 0, together ≤ compute_s, and non-zero exactly where the layout pays it."""
    from trainplan.model.timing import COMPUTE_PARTS

    cases = {Layout(dp=32, sharding="zero2"): (), Layout(dp=32, sharding="zero2", recompute="full"): ("recompute_s",),
             Layout(dp=32, sharding="zero3"): ("fsdp_copy_s",),
             Layout(dp=16, cp=2, sharding="zero2"): ("ring_merge_s",)}
    for lay, paid in cases.items():
        r = step_time(MODEL, CLUSTER, TRAIN, lay)
        assert sum(r[k] for k in COMPUTE_PARTS) < r["compute_s"], lay.describe()
        for k in COMPUTE_PARTS:
            assert (r[k] > 0) == (k in paid), (k, lay.describe())
    from dataclasses import replace

    qlora = replace(TRAIN, finetune="qlora")
    assert step_time(MODEL, CLUSTER, qlora, Layout(dp=32, sharding="zero2"))["dequant_s"] > 0
    # each part is the compute it adds: FSDP's copies are all of ZeRO-3's extra compute over ZeRO-2 here
    z2, z3 = (step_time(MODEL, CLUSTER, TRAIN, Layout(dp=32, sharding=s)) for s in ("zero2", "zero3"))
    assert z3["compute_s"] - z2["compute_s"] == pytest.approx(z3["fsdp_copy_s"], rel=1e-9)


ALL_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


@pytest.mark.parametrize("rank", [16, 1024, 5120])
def test_lora_adapters_take_time_so_mfu_stays_under_the_gemm_ceiling(rank: int):
    """MFU counts the adapters' 6·N_adapters FLOPs; the step must spend time on them too. Without an adapter term
    rank 5120 on every projection read MFU 105% (throughput flat in the rank)."""
    eff = Efficiency.for_gpu(CLUSTER.gpu)
    t = TrainingSpec(seq_len=4096, global_batch=256, finetune="lora", lora_rank=rank, lora_targets=ALL_TARGETS)
    r = step_time(MODEL, CLUSTER, t, Layout(dp=32, micro_batch=1), eff)
    assert r["mfu"] < eff.gemm_eff_max
    small = step_time(MODEL, CLUSTER, TrainingSpec(seq_len=4096, global_batch=256, finetune="lora", lora_rank=1,
                                                   lora_targets=ALL_TARGETS), Layout(dp=32, micro_batch=1), eff)
    assert r["step_time_s"] > small["step_time_s"] * {16: 1.0, 1024: 1.05, 5120: 1.5}[rank]


def test_peft_lora_rereads_the_input_and_passes_over_the_output():
    """Eager PEFT at r = 16: each target re-reads its input (x·A) and writes its output (·B), then scales and adds
    (5 passes over the output); the backward 4 passes over the output and 5 over the input: bytes, not FLOPs."""
    eff = Efficiency.for_gpu(CLUSTER.gpu)
    g = CLUSTER.gpu
    tok, h, act = 4096, MODEL.hidden, 2.0
    t = TrainingSpec(seq_len=4096, global_batch=256, finetune="lora", lora_rank=16, lora_targets=("q",))
    fwd, bwd = timing.lora_adapter_s(MODEL, t, tok, 1, g.peak_bf16_flops, g.hbm_bw_Bps, eff, act)
    bw = g.hbm_bw_Bps * eff.membound_eff
    assert fwd == pytest.approx(tok * ((h + 16) + (16 + h) + 5 * h) * act / bw, rel=1e-9)
    assert bwd == pytest.approx(tok * (4 * h + 5 * h) * act / bw, rel=1e-9)
    full = TrainingSpec(seq_len=4096, global_batch=256)
    assert timing.lora_adapter_s(MODEL, full, tok, 1, g.peak_bf16_flops, g.hbm_bw_Bps, eff, act) == (0.0, 0.0)


def test_fsdp2_cpu_offload_moves_the_shard_over_pcie_every_micro_batch():
    """FSDP2's CPUOffloadPolicy copies each rank's fp32 parameter shard H2D before both all-gathers of a micro-batch
    and its fp32 gradient shard D2H after each reduce-scatter, and adds the later micro-batches' shards into the host
    gradient on the CPU; ZeRO-Offload (ZeRO-1/2) moves them once per step."""
    bw = CLUSTER.host_to_device_Bps
    shard = MODEL.n_params / 32
    z3 = Layout(dp=32, sharding="zero3", offload="cpu")
    h2d, d2h = timing.fsdp_offload_pcie_mb_s(MODEL, TRAIN, z3, CLUSTER)
    assert h2d == pytest.approx(2 * shard * 4 / bw, rel=0.01) and d2h == pytest.approx(shard * 4 / bw, rel=0.01)
    # a LoRA run's frozen base moves too (bf16, no gradients) though only its adapters train
    lora = TrainingSpec(seq_len=4096, global_batch=256, finetune="lora")
    h2d_l, d2h_l = timing.fsdp_offload_pcie_mb_s(MODEL, lora, z3, CLUSTER)
    assert h2d_l == pytest.approx(2 * shard * 2 / bw, rel=0.02) and d2h_l < d2h / 100
    for lay in (Layout(dp=32, sharding="zero3"), Layout(dp=32, sharding="zero2", offload="cpu")):
        assert timing.fsdp_offload_pcie_mb_s(MODEL, TRAIN, lay, CLUSTER) == (0.0, 0.0)
    # micro-batches after the first add into a host gradient: their D2H copies block (pipelining reduces once)
    step = {mb: step_time(MODEL, CLUSTER, TRAIN, Layout(dp=32, sharding="zero3", offload="cpu", micro_batch=mb))
            for mb in (1, 8)}  # 8 and 1 micro-batches per step
    cpu_adam = shard / Efficiency().cpu_optimizer_params_per_s
    assert step[8]["offload_s"] == pytest.approx(cpu_adam, rel=1e-6)
    # each of those 7 also adds into the host gradient on the CPU thread: 3 × its fp32 bytes at CPU Adam's byte rate
    add = 3 * (d2h * bw) / (Efficiency().cpu_optimizer_params_per_s * timing.ADAMW_STEP_BYTES)  # d2h · bw: its bytes
    assert add == pytest.approx(3 * shard * 4 / 28e9, rel=0.01)  # 0.17 s: 1.6 GB of fp32 shard, 28 GB/s by default
    assert step[1]["offload_s"] == pytest.approx(cpu_adam + 7 * (d2h + add), rel=1e-6)
    pp = step_time(MODEL, CLUSTER, TRAIN, Layout(dp=16, pp=2, sharding="zero3", offload="cpu"))
    assert pp["offload_s"] == pytest.approx(cpu_adam, rel=1e-6)  # dp16·pp2: the same 13B/32 shard per rank
    zero2 = step_time(MODEL, CLUSTER, TRAIN, Layout(dp=32, sharding="zero2", offload="cpu"))
    assert zero2["offload_s"] == pytest.approx(shard * 6 / bw + cpu_adam, rel=1e-6)


def test_ring_cp_comm_without_attention_to_hide_behind_is_three_kv_all_gathers_per_layer():
    """Megatron/TE ring (fused): K,V forward, K,V + dK,dV backward = 3 all-gather volumes per layer, all exposed
    when there is no attention to overlap."""
    eff = Efficiency.for_gpu(CLUSTER.gpu)
    lay = Layout(dp=4, cp=8, sharding="zero3")
    tokens = 4096 / 8
    bw, lat = comm.group_link(CLUSTER, 8, 1)
    kv_chunk = tokens * 2 * MODEL.kv_dim * 2.0
    ag = comm.all_gather_s(8 * kv_chunk, 8, bw, lat, eff)
    got = timing.cp_comm_mb_s(MODEL, CLUSTER, tokens, lay, 40, 0.0, eff, 2.0, "fused")
    assert got == pytest.approx(40 * 3 * ag)


def test_pytorch_ring_cp_always_exposes_the_last_dkdv_hop():
    """PyTorch CP (eager/compiled): however long the attention, the last fp32 dK,dV send of the backward is exposed."""
    eff = Efficiency.for_gpu(CLUSTER.gpu)
    lay = Layout(dp=4, cp=8, sharding="zero3")
    assert timing.cp_comm_mb_s(MODEL, CLUSTER, 512.0, lay, 40, 1e6, eff, 2.0, "eager") > 0.0
    assert timing.cp_comm_mb_s(MODEL, CLUSTER, 512.0, lay, 40, 1e6, eff, 2.0, "fused") == 0.0


def test_zero2_reduces_after_every_micro_batch_zero1_once_per_step():
    eff = Efficiency.for_gpu(CLUSTER.gpu)
    z1, z2 = Layout(dp=32, sharding="zero1"), Layout(dp=32, sharding="zero2")
    d = {(lay.sharding, m): timing.dp_comm_step_s(MODEL, CLUSTER, TRAIN, lay, 0.0, eff, m, 0.0)
         for lay in (z1, z2) for m in (1, 4)}
    assert d[("zero1", 4)] == pytest.approx(d[("zero1", 1)])
    assert d[("zero2", 4)] > d[("zero2", 1)] * 1.5


def test_fsdp2_under_pytorch_pipelining_gathers_and_reduces_once_per_step():
    """torchtitan's PP stage under FSDP2 stays gathered across micro-batches and reduces after its last backward
    (timing.fsdp_pipelined), so neither its FSDP comm nor its copy-out grows with the micro-batch count, and the
    reduce-scatter is exposed in full; without PP, or under Megatron (fused), FSDP runs per micro-batch."""
    def run(lay, m, kernels="eager"):
        t = TrainingSpec(seq_len=4096, global_batch=m * lay.dp * lay.micro_batch, kernels=kernels)
        return step_time(MODEL, CLUSTER, t, lay)

    for sharding in ("zero3", "hsdp"):
        piped = Layout(dp=8, pp=4, sharding=sharding, recompute="full")
        a, b = run(piped, 4), run(piped, 16)
        assert a["fsdp_comm_s"] > 0 and b["fsdp_comm_s"] == pytest.approx(a["fsdp_comm_s"])
        assert a["fsdp_copy_s"] > 0 and b["fsdp_copy_s"] == pytest.approx(a["fsdp_copy_s"])
        eff = Efficiency.for_gpu(CLUSTER.gpu)
        units, _, rs, ar = timing._fsdp_unit_comm_s(MODEL, CLUSTER, TRAIN, piped, 8, eff)
        assert a["fsdp_comm_s"] > units * (rs + ar)
    flat = Layout(dp=32, sharding="zero3", recompute="full")
    assert run(flat, 4)["fsdp_comm_s"] > 3.0 * run(flat, 1)["fsdp_comm_s"]
    megatron = Layout(dp=8, pp=4, sharding="zero3", recompute="full")
    assert run(megatron, 16, "fused")["fsdp_comm_s"] > 3.0 * run(megatron, 4, "fused")["fsdp_comm_s"]


def _torch_stage_gathers(p: int, v: int, m: int) -> int:
    """All-gathers of virtual stages per step on the busiest rank, as torch's own ScheduleInterleaved1F1B lowers its
    compute schedule for FSDP (``_add_unshard_reshard``). Built without process groups: only the plan is needed."""
    from torch.distributed.pipelining import schedules

    sched = object.__new__(schedules.ScheduleInterleaved1F1B)
    sched.pp_group_size, sched.n_local_stages, sched._n_microbatches = p, v, m
    sched.number_of_rounds = max(1, m // p)
    sched.microbatches_per_round = m // sched.number_of_rounds
    return max(sum(a.computation_type == schedules.UNSHARD
                   for a in schedules._add_unshard_reshard(sched._calculate_single_rank_operations(r)))
               for r in range(p))


def test_pipelined_stage_passes_is_torchs_own_count():
    """timing.pipelined_stage_passes is a closed form of torch's lowering (max_active_stages=3): each virtual stage
    gathered once while v ≤ 3, re-gathered as the schedule cycles beyond. If torch changes it, this fails."""
    for p in (2, 4, 8):
        for v in range(2, 9):
            for rounds in (1, 2, 3, 5, 16):
                m = rounds * p
                want = _torch_stage_gathers(p, v, m) / v
                assert timing.pipelined_stage_passes(p, v, m) == pytest.approx(want), (p, v, m)
    assert timing.pipelined_stage_passes(4, 1, 32) == 1.0  # 1F1B: one stage, gathered once


def test_an_interleaved_fsdp2_stage_beyond_three_virtual_stages_is_gathered_again():
    def copy_out(v, m=64):
        t = TrainingSpec(seq_len=4096, global_batch=m * 8, kernels="eager")
        return step_time(MODEL, CLUSTER, t, Layout(dp=8, pp=4, pp_schedule="interleaved", vpp=v, sharding="zero3",
                                                   recompute="full"))["fsdp_copy_s"]
    assert copy_out(3) == pytest.approx(copy_out(2))
    assert copy_out(4) == pytest.approx(copy_out(2) * timing.pipelined_stage_passes(4, 4, 64))
    assert timing.pipelined_stage_passes(4, 4, 64) > 5.0


def test_zero2_under_pytorch_pipelining_reduces_once_after_the_last_backward():
    eff = Efficiency.for_gpu(CLUSTER.gpu)
    lay = Layout(dp=8, pp=4, sharding="zero2")
    d = {m: timing.dp_comm_step_s(MODEL, CLUSTER, TRAIN, lay, 1e6, eff, m, 1e6) for m in (1, 4)}
    assert d[4] == pytest.approx(d[1]) and d[1] > 0.0  # once per step, and not hidden by any backward
    fused = TrainingSpec(seq_len=4096, global_batch=256, kernels="fused")
    assert timing.dp_comm_step_s(MODEL, CLUSTER, fused, lay, 0.0, eff, 4, 0.0) > 2.0 * timing.dp_comm_step_s(
        MODEL, CLUSTER, fused, lay, 0.0, eff, 1, 0.0)


def test_fsdp_exposes_the_first_units_all_gather_even_with_ample_compute():
    eff = Efficiency.for_gpu(CLUSTER.gpu)
    lay = Layout(dp=32, sharding="zero3")
    assert timing.fsdp_comm_mb_s(MODEL, CLUSTER, TRAIN, lay, 8, 1e6, eff) > 0.0


def test_a_stage_boundary_between_two_full_nodes_goes_over_the_inter_node_network():
    eff = Efficiency.for_gpu(CLUSTER.gpu)
    lay = Layout(dp=1, tp=8, pp=4, sharding="zero1")
    slow = ClusterSpec(nodes=4, gpus_per_node=8, gpu=CLUSTER.gpu, inter_busbw_Bps=CLUSTER.inter_busbw_Bps / 10)
    fast = timing.pp_p2p_mb_s(MODEL, CLUSTER, 4096.0, lay, eff, 2.0)
    assert timing.pp_p2p_mb_s(MODEL, slow, 4096.0, lay, eff, 2.0) > fast


def test_configured_tp_overlap_hides_that_share_of_tp_comm():
    lay = Layout(dp=4, tp=8, sharding="zero1")
    base = Efficiency.for_gpu(CLUSTER.gpu)
    t0 = step_time(MODEL, CLUSTER, TRAIN, lay, base.replace(tp_overlap=0.0))["tp_comm_s"]
    t5 = step_time(MODEL, CLUSTER, TRAIN, lay, base.replace(tp_overlap=0.5))["tp_comm_s"]
    assert t0 > 0 and t5 == pytest.approx(0.5 * t0)


def test_group_link_with_half_a_nic_per_gpu_and_a_fabric_slower_than_nvlink():
    """A group that fills one node stays on NVLink (its busbw and latency) even where the fabric is slower; across
    nodes each node's ranks share its NICs (4 for 8 GPUs here: half a rail per GPU) at the inter-node latency."""
    c = ClusterSpec(nodes=4, gpus_per_node=8, gpu=resolve_gpu("h100-sxm-80gb"), nics_per_node=4, inter_busbw_Bps=25e9)
    assert comm.group_link(c, 8, 1) == (c.intra_busbw_Bps, c.intra_latency_s)
    assert comm.group_link(c, 32, 1) == (4 * 25e9, c.inter_latency_s)
    assert comm.group_link(c, 4, 8)[0] == 0.5 * 25e9  # one rank per node


def test_collectives_and_p2p_reach_comm_bw_eff_of_the_bus_bandwidth():
    """comm_bw_eff (fitted on A100's TP rows and on a GPU scale-out ladder) scales every transfer: at half of it an
    all-reduce, an all-gather and a pipeline send take twice as long, latency aside."""
    n, nbytes, bw = 8, 1e9, 100e9
    full, half = Efficiency(comm_bw_eff=1.0), Efficiency(comm_bw_eff=0.5)
    for f in (comm.all_reduce_s, comm.all_gather_s):
        assert f(nbytes, n, bw, 0.0, half) == pytest.approx(2 * f(nbytes, n, bw, 0.0, full))
    for crosses, lat in ((False, CLUSTER.intra_latency_s), (True, CLUSTER.inter_latency_s)):
        assert comm.p2p_s(nbytes, crosses, CLUSTER, half) - lat == pytest.approx(
            2 * (comm.p2p_s(nbytes, crosses, CLUSTER, full) - lat))
