"""H100 layout vocabulary: TP communication overlap (async TP / --tp-comm-overlap), uneven pipeline stages,
sequences beyond a preset's context window, per-generation Efficiency in the planner."""

import numpy as np
import pytest

from trainplan.model.arch import resolve_model
from trainplan.model.base import ConfigError
from trainplan.model.efficiency import Efficiency, generation_fits
from trainplan.model.hardware import ClusterSpec, resolve_gpu
from trainplan.model.layout import Layout, layout_problems
from trainplan.model.timing import step_time
from trainplan.model.training import TrainingSpec

H100 = resolve_gpu("h100-sxm-80gb")


def _cluster(n: int) -> ClusterSpec:
    return ClusterSpec(nodes=n // 8, gpus_per_node=8, gpu=H100)


def test_planner_uses_the_fit_of_the_gpu_generation():
    h = Efficiency.for_gpu(H100)
    a = Efficiency.for_gpu(resolve_gpu("a100-80gb"))
    fits = generation_fits()
    assert h.gemm_eff_max == fits["h100"]["values"]["gemm_eff_max"] != a.gemm_eff_max
    assert Efficiency.for_gpu(resolve_gpu("h200-141gb")) == h  # H200: H100 compute
    assert Efficiency.for_gpu(H100, comm_bw_eff=0.5).comm_bw_eff == 0.5  # config overrides sit on top


def test_tp_overlap_needs_tp_and_non_eager_kernels():
    with pytest.raises(ConfigError, match="tp_overlap"):
        Layout(dp=8, tp_overlap=True)
    m = resolve_model("llama3-70b")
    lay = Layout(dp=4, tp=8, sp=True, tp_overlap=True, sharding="zero3")
    eager = TrainingSpec(seq_len=8192, global_batch=16, kernels="eager")
    assert any("TP comm overlap" in w for w in layout_problems(m, _cluster(32), eager, lay))
    compiled = TrainingSpec(seq_len=8192, global_batch=16, kernels="compiled")
    assert not layout_problems(m, _cluster(32), compiled, lay)


def test_tp_overlap_hides_tp_comm_never_more_than_it_costs():
    m = resolve_model("llama3-70b")
    t = TrainingSpec(seq_len=8192, global_batch=64, kernels="compiled")
    eff = Efficiency.for_gpu(H100)
    van = step_time(m, _cluster(64), t, Layout(dp=8, tp=8, sp=True, sharding="zero3", micro_batch=2), eff)
    asy = step_time(m, _cluster(64), t, Layout(dp=8, tp=8, sp=True, tp_overlap=True, sharding="zero3",
                                                micro_batch=2), eff)
    assert 0 < asy["tp_comm_s"] < van["tp_comm_s"]
    assert van["step_time_s"] - asy["step_time_s"] == pytest.approx(van["tp_comm_s"] - asy["tp_comm_s"], rel=1e-9)
    full = step_time(m, _cluster(64), t, Layout(dp=8, tp=8, sp=True, tp_overlap=True, sharding="zero3",
                                                 micro_batch=2), eff.replace(tp_async_overlap=1.0))
    assert full["tp_comm_s"] >= 0
    # links so slow that the TP collectives outlast the GEMMs they overlap: even full overlap hides no more than
    # the GEMM time, so some of the communication stays exposed
    slow = ClusterSpec(nodes=8, gpus_per_node=8, gpu=H100, intra_busbw_Bps=5e9)
    lay = Layout(dp=8, tp=8, sp=True, sharding="zero3", micro_batch=2)
    van = step_time(m, slow, t, lay, eff)
    full = step_time(m, slow, t, Layout(**{**lay.to_dict(), "tp_overlap": True}), eff.replace(tp_async_overlap=1.0))
    hidden = van["tp_comm_s"] - full["tp_comm_s"]
    assert full["tp_comm_s"] > 0.5 * van["tp_comm_s"] and 0 < hidden < full["compute_s"]


def test_search_offers_tp_overlap_and_the_technique_table_reports_it():
    from trainplan.search.layouts import search, technique_verdicts

    m = resolve_model("llama2-13b")
    t = TrainingSpec(seq_len=4096, global_batch=64, kernels="compiled")
    df = search(m, _cluster(16), t, options={"tp": [1, 2, 4], "pp": [1], "cp": [1], "micro_batches": [1]})
    assert df["tp_overlap"].any() and (df.loc[df["tp_overlap"], "tp"] > 1).all()
    tech = technique_verdicts(df)
    assert "TP comm overlap (async TP)" in set(tech["technique"])
    eager = search(m, _cluster(16), TrainingSpec(seq_len=4096, global_batch=64, kernels="eager"),
                   options={"tp": [1, 2], "pp": [1], "cp": [1], "micro_batches": [1]})
    assert not eager.loc[eager["tp_overlap"], "feasible"].any()


def test_uneven_pipeline_stages_are_valid_and_sized_by_the_busiest_stage():
    """Llama 3 405B: 126 layers on PP16 (Dubey 2024 §3.3.2): the busiest rank holds ceil(126/16) = 8 layers."""
    from trainplan.model import memory

    m = resolve_model("llama3.1-405b")
    c = ClusterSpec(nodes=128, gpus_per_node=8, gpu=H100)
    t = TrainingSpec(seq_len=8192, global_batch=512, kernels="fused")
    lay = Layout(dp=8, tp=8, pp=16, sp=True, pp_schedule="interleaved", vpp=4, sharding="zero1")
    assert m.layers % (lay.pp * lay.vpp) != 0 and not layout_problems(m, c, t, lay)
    even = resolve_model("llama3.1-405b").__class__(**{**m.__dict__, "layers": 128})
    st_uneven, st_even = step_time(m, c, t, lay), step_time(even, c, t, lay)
    # busiest stage: 8 layers either way (the average, 126/16, would be 1.6% faster); only the data-parallel
    # gradients and the optimizer step see the 2 layers fewer
    assert st_uneven["step_time_s"] == pytest.approx(st_even["step_time_s"], rel=0.003)
    mem, mem_even = memory.memory_breakdown(m, c, t, lay), memory.memory_breakdown(even, c, t, lay)
    assert mem["activations"] == pytest.approx(mem_even["activations"], rel=1e-9)
    assert np.isfinite(mem["total"]) and 0 < mem["total"] <= mem_even["total"]
    too_many = Layout(dp=1, tp=8, pp=16, sp=True, pp_schedule="interleaved", vpp=8, sharding="zero1")
    assert any("exceeds layers" in w for w in layout_problems(m, ClusterSpec(nodes=16, gpus_per_node=8, gpu=H100),
                                                              t, too_many))


def test_sequence_beyond_the_preset_context_is_a_layout_not_an_infeasibility():
    m = resolve_model("llama2-13b")  # context 4096
    t = TrainingSpec(seq_len=16384, global_batch=32, kernels="eager")
    lay = Layout(dp=8, cp=4, sharding="zero3", recompute="full")
    assert layout_problems(m, _cluster(32), t, lay) == []  # the context window is a warning (of the CLI), no problem
    assert step_time(m, _cluster(32), t, lay)["tokens_per_s_per_gpu"] > 0
