"""Specs: invariants at construction, presets, Hugging Face config.json parsing, layout problems."""

import json

import pytest

from trainplan.model.arch import MODEL_PRESETS, ModelSpec, model_from_hf_config, resolve_model
from trainplan.model.base import ConfigError
from trainplan.model.hardware import ClusterSpec, resolve_gpu
from trainplan.model.layout import (
    Layout,
    LayoutTable,
    check_layout,
    grad_accum,
    layout_problems,
    shard_degree,
)
from trainplan.model.training import TrainingSpec

# Published parameter counts (the models' own model cards / config-derived counts).
LLAMA2_13B_PARAMS = 13_015_864_320
LLAMA2_7B_PARAMS = 6_738_415_616
LLAMA3_8B_PARAMS = 8_030_261_248


def cluster32() -> ClusterSpec:
    return ClusterSpec(nodes=4, gpus_per_node=8, gpu=resolve_gpu("h100-sxm-80gb"))


def test_llama_param_counts_exact():
    assert MODEL_PRESETS["llama2-13b"].n_params == LLAMA2_13B_PARAMS
    assert MODEL_PRESETS["llama2-7b"].n_params == LLAMA2_7B_PARAMS
    assert MODEL_PRESETS["llama3-8b"].n_params == LLAMA3_8B_PARAMS


def test_hf_config_llama_matches_preset(tmp_path):
    cfg = {"model_type": "llama", "num_hidden_layers": 40, "hidden_size": 5120, "num_attention_heads": 40,
           "num_key_value_heads": 40, "intermediate_size": 13824, "vocab_size": 32000,
           "tie_word_embeddings": False, "max_position_embeddings": 4096}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    assert model_from_hf_config(p).n_params == LLAMA2_13B_PARAMS
    assert resolve_model(str(tmp_path)).n_params == LLAMA2_13B_PARAMS
    # named after the folder of a config.json (a downloaded repo), after the file otherwise (the memo's title)
    assert model_from_hf_config(p).name == tmp_path.name
    (tmp_path / "Mistral-7B.json").write_text(json.dumps(cfg))
    assert resolve_model(str(tmp_path / "Mistral-7B.json")).name == "Mistral-7B"
    (tmp_path / "named.json").write_text(json.dumps(cfg | {"_name_or_path": "org/Named-13B"}))
    assert resolve_model(str(tmp_path / "named.json")).name == "org/Named-13B"


@pytest.mark.parametrize("text", ["{not json", "[1, 2]"])
def test_unreadable_hf_config_is_a_config_error(tmp_path, text):
    p = tmp_path / "config.json"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        model_from_hf_config(p)
    assert e.value.key == "model"


def test_hf_config_missing_key_named(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        model_from_hf_config(p)


@pytest.mark.parametrize(
    "kwargs, key",
    [
        (dict(layers=0, hidden=64, heads=4, vocab=10), "layers"),
        (dict(layers=2, hidden=-64, heads=4, vocab=10), "hidden"),
        (dict(layers=2, hidden=64, heads=3, vocab=10), "hidden"),
        (dict(layers=2, hidden=64, heads=4, kv_heads=3, vocab=10), "kv_heads"),
        (dict(layers=2, hidden=64, heads=4, vocab=10, mlp="relu"), "mlp"),
    ],
)
def test_model_invariants_name_the_key(kwargs, key):
    with pytest.raises(ConfigError) as e:
        ModelSpec(**kwargs)
    assert e.value.key == key


def test_unknown_gpu_lists_valid():
    with pytest.raises(ConfigError, match="h100-sxm-80gb"):
        resolve_gpu("b200")


def test_layout_problems_names_every_factor():
    m, c = MODEL_PRESETS["llama2-13b"], cluster32()
    t = TrainingSpec(seq_len=4096, global_batch=256)
    why = layout_problems(m, c, t, Layout(dp=2, tp=4))
    assert any("2·4·1·1 = 8, but the cluster has 32 GPUs" in w for w in why)
    why = layout_problems(m, c, t, Layout(dp=32 // 3 * 1, tp=3))
    assert any("tp=3 does not divide heads=40" in w for w in why)
    assert layout_problems(m, c, t, Layout(dp=32)) == []
    with pytest.raises(ConfigError):
        check_layout(m, c, t, Layout(dp=4, tp=16, sharding="zero3"))


def test_pipeline_needs_enough_microbatches():
    m, c = MODEL_PRESETS["llama2-13b"], cluster32()
    t = TrainingSpec(seq_len=4096, global_batch=8)
    why = layout_problems(m, c, t, Layout(dp=4, pp=8, sharding="none"))
    assert any("micro-batches per step < pp=8" in w for w in why)


def test_shard_degree_and_accum_vectorised_equal_scalar():
    c, t = cluster32(), TrainingSpec(seq_len=4096, global_batch=256)
    layouts = [Layout(dp=32), Layout(dp=32, sharding="hsdp"), Layout(dp=32, sharding="hsdp", shard_group=16),
               Layout(dp=4, tp=8, sharding="none", micro_batch=2), Layout(dp=8, tp=2, cp=2, sharding="zero2")]
    table = LayoutTable.from_layouts(layouts)
    assert list(shard_degree(table, c)) == [shard_degree(x, c) for x in layouts] == [32, 8, 16, 1, 16]
    assert list(grad_accum(t, table)) == [grad_accum(t, x) for x in layouts] == [8, 8, 8, 32, 32]
    assert table.row(2) == layouts[2]


def test_layout_family_names():
    assert Layout(dp=32).family == "FSDP"
    assert Layout(dp=4, tp=8, sp=True, sharding="none").family == "DDP×TP"
    assert Layout(dp=2, tp=4, pp=4, sharding="hsdp", shard_group=1).family == "HSDP×TP×PP"
    assert Layout(dp=32, sharding="hsdp").family == "HSDP"


def test_layout_from_row_is_the_one_row_mapping():
    """A candidates.csv row, a dict with numpy scalars and CSV strings: the same Layout; empty shard_group → None."""
    import numpy as np
    import pandas as pd

    from trainplan.model.layout import Layout

    want = Layout(dp=4, tp=2, sp=True, sharding="hsdp", shard_group=2, micro_batch=2)
    row = pd.Series({**want.to_dict(), "family": "HSDP×TP", "tokens_per_s": 1.0})
    assert Layout.from_row(row) == want
    assert Layout.from_row({**want.to_dict(), "sp": "True", "dp": np.int64(4), "micro_batch": 2.0}) == want
    assert Layout.from_row({"dp": 8, "shard_group": float("nan")}).shard_group is None
    assert Layout.from_row({"dp": 8, "shard_group": 0}) == Layout(dp=8)


def test_an_hsdp_layout_without_its_group_is_described_without_none():
    """A config's ``layout: {sharding: hsdp}`` leaves shard_group to its default: an error about the layout printed
    "hsdp/None" (the group is named once resolved, e.g. hsdp/8)."""
    lay = Layout(dp=1, tp=1, pp=1, cp=1, sharding="hsdp", micro_batch=2)
    assert lay.describe() == "dp1·tp1·pp1·cp1 hsdp rc=none mb=2"
    assert Layout(dp=16, sharding="hsdp", shard_group=8).describe().split()[1] == "hsdp/8"


def test_dgx_h100_link_figures_on_another_nvlink_fabric_are_a_warning():
    """The busbw defaults (and the default study's values) are DGX H100's nccl-tests figures: on an A100 (NVLink3,
    600 GB/s per GPU) or a PCIe H100 they overstate the links, and the planner says so; H200 (NVLink4) and a
    cluster's own figures pass silently."""
    from trainplan.model.hardware import link_default_notes

    def notes(gpu, keys=("cluster.intra_busbw_GBps", "cluster.inter_busbw_GBps", "cluster.host_to_device_GBps"),
              **links):
        return link_default_notes(ClusterSpec(nodes=2, gpus_per_node=8, gpu=resolve_gpu(gpu), **links), *keys)

    a100, a100_host = notes("a100-80gb")
    assert a100.startswith("cluster.intra_busbw_GBps=360 and cluster.inter_busbw_GBps=46 GB/s: ")
    assert "a100-80gb has 600 GB/s of NVLink per GPU" in a100
    # the host link too: the PCIe Gen5 default on A100's Gen4 (64 GB/s both directions), with the figure to set
    assert a100_host.startswith("cluster.host_to_device_GBps=50 GB/s: the default for PCIe Gen5 x16 (128 GB/s")
    assert "a100-80gb's PCIe is 64 GB/s" in a100_host and a100_host.endswith("line rate: 25)")
    assert notes("a100-80gb", host_to_device_Bps=25e9) == [a100]
    flags = ("--intra-busbw", "--inter-busbw", "--host-bw")
    assert notes("h100-pcie-80gb", flags, inter_busbw_Bps=25e9)  # PCIe H100: Gen5, its NVLink bridges only
    assert not notes("a100-80gb", flags, intra_busbw_Bps=230e9, inter_busbw_Bps=23e9, host_to_device_Bps=25e9)
    assert not notes("h200-141gb") and not notes("h100-sxm-80gb")
