"""``training.attn_kernel``: cuDNN attention's rate relative to FlashAttention-2, read from our H200 timings."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from trainplan import pkgdata
from trainplan.config import load_config
from trainplan.model.arch import resolve_model
from trainplan.model.base import ConfigError
from trainplan.model.hardware import ClusterSpec, resolve_gpu
from trainplan.model.layout import Layout, check_precision
from trainplan.model.timing import ATTENTION_BACKENDS_FILE, attention_kernel_rel, step_time
from trainplan.model.training import TrainingSpec
from trainplan.proxy.aggregate import attn_kernel_of

ROOT = Path(__file__).resolve().parents[3]
MEASURED = ROOT / "data" / "calibration" / "h200-2026-12-04" / "microbench" / "attention_backends.json"


def test_package_copy_is_the_committed_measurement():
    assert pkgdata.path(f"{pkgdata.DATA}/{ATTENTION_BACKENDS_FILE}").read_bytes() == MEASURED.read_bytes()


def test_cudnn_ratio_is_the_median_over_measured_lengths():
    doc = json.loads(MEASURED.read_text())
    assert doc["device"] == "NVIDIA H200"
    rate = {(r["backend"], r["seq"]): r["train_tflops"] for r in doc["rows"]}
    ratios = [rate[("cudnn", s)] / rate[("flash (FA2)", s)] for s in (1024, 2048, 4096, 8192, 16384)]
    assert attention_kernel_rel("cudnn") == pytest.approx(statistics.median(ratios))
    assert 1.5 < attention_kernel_rel("cudnn") < 2.0 and attention_kernel_rel("fa2") == 1.0


def test_cudnn_speeds_up_attention_only():
    model, gpu = resolve_model("llama2-13b"), resolve_gpu("h100-sxm-80gb")
    cluster, lay = ClusterSpec(nodes=4, gpus_per_node=8, gpu=gpu), Layout(dp=32, sharding="zero2")
    fa2 = step_time(model, cluster, TrainingSpec(seq_len=4096, global_batch=256), lay)
    cud = step_time(model, cluster, TrainingSpec(seq_len=4096, global_batch=256, attn_kernel="cudnn"), lay)
    long_fa2 = step_time(model, cluster, TrainingSpec(seq_len=16384, global_batch=64), lay)
    long_cud = step_time(model, cluster, TrainingSpec(seq_len=16384, global_batch=64, attn_kernel="cudnn"), lay)
    gain, long_gain = cud["tokens_per_s"] / fa2["tokens_per_s"] - 1, long_cud["tokens_per_s"] / long_fa2["tokens_per_s"] - 1
    assert 0.02 < gain < 0.10 and long_gain > gain  # attention's share grows with the sequence
    assert cud["optimizer_s"] == fa2["optimizer_s"] and cud["dp_comm_s"] == fa2["dp_comm_s"]


def test_cudnn_is_refused_off_hopper_and_without_flash():
    a100 = ClusterSpec(nodes=1, gpus_per_node=8, gpu=resolve_gpu("a100-80gb"))
    with pytest.raises(ConfigError, match="training.attn_kernel=.*Hopper"):
        check_precision(a100, TrainingSpec(seq_len=4096, global_batch=8, attn_kernel="cudnn"))
    h100 = ClusterSpec(nodes=1, gpus_per_node=8, gpu=resolve_gpu("h100-sxm-80gb"))
    with pytest.raises(ConfigError, match="attn_impl math"):
        check_precision(h100, TrainingSpec(seq_len=4096, global_batch=8, attn_kernel="cudnn", attn_impl="math"))
    with pytest.raises(ConfigError, match="attn_kernel"):
        TrainingSpec(seq_len=4096, global_batch=8, attn_kernel="fa3")
    raw = {"model": "llama2-13b", "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "a100-80gb"},
           "training": {"seq_len": 4096, "global_batch": 8, "attn_kernel": "cudnn"},
           "cost": {"price_per_gpu_hour_usd": 3}}
    with pytest.raises(ConfigError, match="training.attn_kernel"):
        load_config(raw, warn=False)


def test_records_say_which_kernel_ran():
    assert attn_kernel_of({"flops": {"by_op": {"aten._scaled_dot_product_cudnn_attention": 1, "aten.mm": 2}}}) == "cudnn"
    assert attn_kernel_of({"flops": {"by_op": {"aten._scaled_dot_product_flash_attention": 1}}}) == "fa2"
    assert attn_kernel_of({"flops": {"by_op": {"aten.mm": 2}}}) == "" and attn_kernel_of({}) == ""


def test_the_ratio_quoted_in_help_config_and_readme_is_the_measured_one():
    quoted = f"{attention_kernel_rel('cudnn'):.2f}"
    from trainplan.cli import _parser

    help_text = _parser()._subparsers._group_actions[0].choices["estimate"].format_help()
    assert f"{quoted}x" in " ".join(help_text.split())
    for f in ("README.md", "config/config.yaml", "src/trainplan/config.schema.yaml"):
        assert f"{quoted}" in (ROOT / f).read_text(), f
