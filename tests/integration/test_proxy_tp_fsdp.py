"""TP×FSDP on a 2-D mesh (dp 2 × tp 2 with SP): 4 gloo ranks on the CPU, checked against the analytic model.

Four processes on two cores are oversubscribed, so this runs few steps; it checks what is exact.
"""

import pytest

from trainplan.proxy.aggregate import record_row
from trainplan.proxy.schema import normalize_run_spec
from trainplan.proxy.torchrun import launch

pytestmark = pytest.mark.slow


def _run(tmp, id_, layout, nproc):
    spec = normalize_run_spec({"id": id_, "model": "debug", "layout": layout, "seq_len": 64, "global_batch": 4,
                               "steps": 3, "warmup": 1, "nproc_per_node": nproc, "timeout_s": 240})
    rec, code = launch(spec, tmp / f"{id_}.json")
    assert code == 0 and rec["status"] == "ok", rec.get("message")
    return record_row(rec)


def test_tp_x_fsdp_matches_analytic_and_loss_parity(tmp_path):
    row = _run(tmp_path, "tp-fsdp", {"dp": 2, "tp": 2, "sp": True, "sharding": "zero3"}, 4)
    assert row["world_size"] == 4
    assert row["state_bytes_meas"] == row["state_bytes_pred"]
    assert row["saved_act_bytes_meas"] == pytest.approx(row["saved_act_bytes_pred"], rel=0.02)
    assert row["flops_per_step_meas"] == pytest.approx(row["flops_per_step_pred"], rel=0.01)
    ddp = _run(tmp_path, "ddp", {"dp": 2, "sharding": "none"}, 2)
    assert row["loss0"] == pytest.approx(ddp["loss0"], rel=1e-5)  # same data, same init: same first loss
