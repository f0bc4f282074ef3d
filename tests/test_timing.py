"""Step-time model: comm conventions, vectorisation (Layout vs LayoutTable), monotonic behaviour."""

import numpy as np
import pytest

from trainplan import comm
from trainplan.efficiency import Efficiency
from trainplan.specs import (
    ClusterSpec,
    ConfigError,
    Layout,
    LayoutTable,
    TrainingSpec,
    resolve_gpu,
    resolve_model,
)
from trainplan.timing import TIMING_KEYS, step_time

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
