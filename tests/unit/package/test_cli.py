"""The trainplan CLI: estimate/validate/plan via main(argv) and via a subprocess; one-line errors, exit 2."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trainplan.cli import main

ROOT = Path(__file__).resolve().parents[3]


def test_estimate_json_schema(capsys):
    assert main(["estimate", "--model", "llama2-13b", "--gpus", "32", "--micro-batch", "1", "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    for k in ("feasible", "reason", "params", "flops_per_token", "memory_gib", "step_time_s", "tokens_per_s",
              "tokens_per_s_per_gpu", "mfu", "hfu", "breakdown", "headroom", "layout"):
        assert k in js
    assert set(js["memory_gib"]) >= {"weights", "gradients", "optimizer", "activations", "buffers", "overhead", "total"}
    assert js["params"] == 13_015_864_320 and js["layout"]["dp"] == 32


def test_estimate_hsdp_names_its_default_group(capsys):
    """--sharding hsdp without --shard-group shards inside a node: the layout says hsdp/8 and predicts the same as an
    explicit --shard-group 8 (the estimate once printed hsdp/None)."""
    base = ["estimate", "--model", "llama2-13b", "--gpus", "32", "--sharding", "hsdp", "--json"]
    assert main(base) == 0
    default = json.loads(capsys.readouterr().out)
    assert main([*base, "--shard-group", "8"]) == 0
    explicit = json.loads(capsys.readouterr().out)
    assert default["layout_text"].split()[1] == "hsdp/8" and default["layout"]["shard_group"] == 8
    assert default["tokens_per_s_per_gpu"] == explicit["tokens_per_s_per_gpu"]
    assert main([*base, "--shard-group", "16"]) == 0
    assert json.loads(capsys.readouterr().out)["layout_text"].split()[1] == "hsdp/16"


def test_estimate_micro_batch_auto_is_the_fastest_that_fits(capsys):
    """Without --micro-batch the estimate tries the powers of two dividing the local batch and keeps the fastest
    feasible one; each is the same as pinning it. A 13B at 4096 tokens: memory decides (mb 2 is faster but OOM);
    GPT-2 small at 512 tokens: per-call overheads decide, mb 32 (= 256 sequences / 8 ranks) beats mb 1 several-fold."""
    def est(*argv):
        assert main(["estimate", "--json", *argv]) == 0
        return json.loads(capsys.readouterr().out)

    big = est("--model", "llama2-13b", "--gpus", "32")
    assert big["micro_batch_choice"] == {"auto": True, "chosen": 1, "tried": [1, 2, 4, 8]}
    mb2 = est("--model", "llama2-13b", "--gpus", "32", "--micro-batch", "2")
    assert not mb2["feasible"] and mb2["tokens_per_s_per_gpu"] > big["tokens_per_s_per_gpu"]
    assert mb2["micro_batch_choice"] == {"auto": False, "chosen": 2, "tried": [2]}
    small = est("--arch", GPT2, "--seq-len", "512", "--gpus", "8")
    assert small["feasible"] and small["layout"]["micro_batch"] == 32 == max(small["micro_batch_choice"]["tried"])
    pinned = est("--arch", GPT2, "--seq-len", "512", "--gpus", "8", "--micro-batch", "32")
    one = est("--arch", GPT2, "--seq-len", "512", "--gpus", "8", "--micro-batch", "1")
    assert small["tokens_per_s_per_gpu"] == pinned["tokens_per_s_per_gpu"] > 2 * one["tokens_per_s_per_gpu"]
    # a global batch of 24 on 8 ranks: local batch 3, so 1 and 3 (no gradient accumulation) are tried
    assert est("--arch", GPT2, "--seq-len", "512", "--gpus", "8", "--global-batch", "24")[
        "micro_batch_choice"]["tried"] == [1, 3]
    # nothing fits: the smallest micro-batch, reported infeasible
    none = est("--model", "llama2-70b", "--gpus", "8", "--seq-len", "65536")
    assert not none["feasible"] and none["layout"]["micro_batch"] == 1 and none["reason"].startswith("OOM")


def test_estimate_prints_the_heldout_interval_of_its_family(capsys):
    """The estimate's p10–p90 is the predictive interval over the shipped leave-one-table-out errors of the same
    GPU generation and family class (the interval whose coverage validate --heldout measures): the pool is the
    family's own rows in efficiency_fits.json, and a TP layout draws on other rows than a data-parallel one."""
    from trainplan.model.efficiency import generation_fits
    from trainplan.published.intervals import interval_bounds

    def est(*argv):
        assert main(["estimate", "--json", "--model", "llama2-13b", *argv]) == 0
        return json.loads(capsys.readouterr().out)

    def shipped(gen, family):
        rows = [r for r in generation_fits()[gen]["heldout"] if r["family"] == family]
        return [(r["published"] / r["predicted"] if r["metric"].endswith("_s") else r["predicted"] / r["published"]) - 1
                for r in rows]  # a time metric's ratio inverted: errors of throughput

    for argv, gen, family in [(("--sharding", "zero2"), "h100", "FSDP/ZeRO"), (("--tp", "8", "--sp"), "h100", "TP"),
                              (("--gpu", "a100-80gb", "--sharding", "zero2"), "a100", "FSDP/ZeRO")]:
        js = est(*argv)
        iv, pool = js["interval"], shipped(gen, family)
        assert (iv["generation"], iv["family"], iv["errors_n"]) == (gen, family, len(pool)) and len(pool) >= 3
        lo, hi = interval_bounds(js["tokens_per_s_per_gpu"], pool)
        assert (iv["tokens_per_s_per_gpu_p10"], iv["tokens_per_s_per_gpu_p90"]) == pytest.approx((lo, hi), rel=1e-12)
        assert iv["tokens_per_s_per_gpu_p10"] < iv["tokens_per_s_per_gpu_p90"]
        assert iv["mfu_p10"] == pytest.approx(js["mfu"] * lo / js["tokens_per_s_per_gpu"])
        assert iv["errors_mean"] == pytest.approx(sum(pool) / len(pool))
        assert f"mean {iv['errors_mean']:+.1%}" in iv["source"]
    a, b = est("--sharding", "zero2")["interval"], est("--tp", "8", "--sp")["interval"]
    assert a["tokens_per_s_per_gpu_p90"] / a["tokens_per_s_per_gpu_p10"] != pytest.approx(
        b["tokens_per_s_per_gpu_p90"] / b["tokens_per_s_per_gpu_p10"])  # different pools, different widths
    assert main(["estimate", "--model", "llama2-13b", "--sharding", "zero2"]) == 0
    assert "p10–p90" in capsys.readouterr().out


def test_estimate_interval_is_absent_without_shipped_errors():
    from trainplan.published.intervals import throughput_interval

    iv = throughput_interval({"tokens_per_s_per_gpu": 1000.0, "mfu": 0.4}, "b200", "TP")
    assert iv["errors_n"] == 0 and iv["tokens_per_s_per_gpu_p10"] is None and iv["mfu_p90"] is None


def test_estimate_arch_overrides(capsys):
    assert main(["estimate", "--arch", "layers=2,hidden=256,heads=4,vocab=1000", "--gpus", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "custom"


@pytest.mark.parametrize("argv, key", [
    (["--tp", "3"], "layout"),
    (["--tp", "16", "--gpus", "32"], "layout.tp"),
    (["--gpu", "b300"], "gpu"),
    (["--global-batch", "-1"], "global-batch"),
    (["--micro-batch", "two"], "micro-batch"),
    (["--micro-batch", "0"], "micro-batch"),
    (["--model", "/nonexistent/config.json"], "model"),
    (["--arch", "layers=x"], "arch.layers"),
    (["--arch", "depth=3"], "arch.depth"),
    (["--model", ""], "model=(empty)"),  # an unset shell variable: not the default model
    (["--arch", " "], "arch=(empty)"),
    # a layout problem names its own key and value (it parsed the key from the message: layout.1, layout.TP, ...)
    (["--gpus", "8", "--pp", "4", "--global-batch", "8", "--micro-batch", "4"], "layout.micro_batch=4"),
    (["--tp", "2", "--tp-overlap"], "layout.tp_overlap=True"),
    (["--offload", "cpu", "--sharding", "none"], "layout.offload=cpu"),
    (["--gpus", "8", "--cp", "4", "--cp-kind", "ulysses", "--seq-len", "4094"], "layout.cp=4: seq_len=4094 not "
                                                                                 "divisible by cp=4 (each rank"),
    (["--gpus", "8", "--pp", "8", "--vpp", "8", "--pp-schedule", "interleaved"], "layout.vpp=8"),
    (["--gpus", "32", "--sharding", "hsdp", "--shard-group", "6"], "layout.shard_group=6"),
    # fp32 would be timed at the BF16 peak; an FP8 refusal is the only line (no eager-FP8 warning before it)
    (["--precision", "fp32"], "training.precision=fp32: bf16, fp8-tensorwise or fp8-rowwise"),
    (["--inter-busbw", "-3"], "inter-busbw=-3.0: must be a bandwidth"),
    (["--intra-busbw", "nan"], "intra-busbw=nan"),
    (["--host-bw", "0"], "host-bw=0.0: must be a bandwidth"),
    (["--gpu", "a100-80gb", "--precision", "fp8-tensorwise"], "training.precision=fp8-tensorwise: a100-80gb has no"),
])
def test_bad_input_one_line_exit_2(capsys, argv, key):
    assert main(["estimate", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"trainplan: error: {key}" + ("" if "=" in key else "=")), err


def test_hsdp_default_group_is_the_one_the_model_shards_over(capsys):
    """--sharding hsdp without --shard-group takes shard_degree's default (GPUs per node, at most dp·cp): with TP2
    on 8 GPUs that is 4 (dp·cp), which it refused as 'shard_group=8 must divide dp·cp=4'."""
    assert main(["estimate", "--model", "llama2-13b", "--gpus", "8", "--tp", "2", "--sharding", "hsdp"]) == 0
    assert "dp4·tp2·pp1·cp1 hsdp/4 " in capsys.readouterr().out


def test_unreadable_config_json(tmp_path, capsys):
    p = tmp_path / "config.json"
    p.write_text("{broken")
    assert main(["estimate", "--model", str(p)]) == 2
    assert capsys.readouterr().err.startswith("trainplan: error: model=")


def test_subprocess_error_and_help():
    exe = [sys.executable, "-m", "trainplan.cli"]
    r = subprocess.run([*exe, "estimate", "--tp", "7"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    for sub in ("plan", "estimate", "validate"):
        h = subprocess.run([*exe, sub, "--help"], capture_output=True, text=True, timeout=60)
        assert h.returncode == 0 and "example:" in h.stdout


def test_estimate_imports_no_torch_or_snakemake():
    code = ("import sys; from trainplan.cli import main; main(['estimate','--json']); "
            "assert 'torch' not in sys.modules and 'snakemake' not in sys.modules and 'pandas' not in sys.modules")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_validate_prints_mape(capsys):
    assert main(["validate"]) == 0
    out = capsys.readouterr().out
    assert "MAPE" in out and "korthikanti2022_t3_5" in out
    # each table's role: NeMo's TE FP8 tables are scored, never fitted; the rest are their generation's fit
    rows = {ln.split("│")[1].strip(): ln.split("│")[-2].strip() for ln in out.splitlines() if ln.count("│") >= 7}
    assert rows["nemo_longseq_h100"] == rows["nemo2407_h100"] == "never fitted"
    assert rows["torchtitan_h100"] == rows["korthikanti2022_t3_5"] == "fitted"


@pytest.mark.skipif(not (ROOT / "config" / "config.yaml").exists(), reason="config/config.yaml not written yet")
def test_plan_default_config(tmp_path, capsys):
    out_csv = tmp_path / "c.csv"
    assert main(["plan", str(ROOT / "config" / "config.yaml"), "--top", "3", "--csv", str(out_csv)]) == 0
    text = capsys.readouterr().out
    assert "tok/s/GPU" in text and "chosen" in text
    import pandas as pd

    c = pd.read_csv(out_csv, low_memory=False)  # every candidate, with its family class's p10–p90
    assert {"interval_family", "tokens_per_s_per_gpu_p10", "tokens_per_s_per_gpu_p90"} <= set(c.columns)
    assert set(c["interval_family"]) <= {"FSDP/ZeRO", "TP", "PP", "CP"} and len(set(c["interval_family"])) == 4
    f = c[c["feasible"].astype(bool)]
    assert len(f) and (f["tokens_per_s_per_gpu_p10"] < f["tokens_per_s_per_gpu_p90"]).all()


def test_plan_prints_each_rows_heldout_interval(tmp_path, capsys):
    """The ranked table's p10–p90 is estimate's interval for the same layout (same pools); with the config's
    efficiency overridden no measured interval applies and the column says so."""
    cfg = ROOT / "config" / "config.yaml"
    assert main(["plan", str(cfg), "--top", "1"]) == 0
    text = capsys.readouterr().out
    assert main(["estimate", "--json", "--model", "llama2-13b", "--gpus", "32", "--sharding", "zero3",
                 "--micro-batch", "1"]) == 0
    iv = json.loads(capsys.readouterr().out)["interval"]
    row = next(ln for ln in text.splitlines() if "dp32·tp1·pp1·cp1 zero3 rc=none mb=1" in ln)
    assert f"{iv['tokens_per_s_per_gpu_p10']:.0f}–{iv['tokens_per_s_per_gpu_p90']:.0f}" in row
    over = tmp_path / "over.yaml"
    over.write_text(cfg.read_text().replace("\nefficiency: {}", "\nefficiency: {gemm_eff_max: 0.5}", 1))
    assert main(["plan", str(over), "--top", "1"]) == 0
    text = capsys.readouterr().out
    row = next(ln for ln in text.splitlines() if ln.startswith("│ 1 "))
    assert "overrides the shipped efficiency fit" in text and re.search(r"│\s+—\s+│", row)


# ------------------------------------------------------------------- issue 12 item 4, issue 13 items 1 and 5
GPT2 = "layers=12,hidden=768,heads=12,vocab=50257,mlp=gelu,norm=layernorm,pos=learned,bias=all,tied=true,max_seq=1024"


def test_arch_expresses_gpt_style_models(capsys):
    """GPT-2 small through --arch: LayerNorm, 4h GELU MLP, biases, tied head, learned positions; 124,439,808
    parameters (openai-community/gpt2, transformers num_parameters())."""
    assert main(["estimate", "--arch", GPT2, "--gpus", "8", "--seq-len", "1024", "--global-batch", "64",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["params"] == 124_439_808
    for pos in ("alibi", "rope"):  # no position parameters
        assert main(["estimate", "--arch", GPT2.replace("pos=learned", f"pos={pos}"), "--gpus", "8",
                     "--seq-len", "1024", "--global-batch", "64", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["params"] == 124_439_808 - 1024 * 768


def test_arch_expresses_mpt_layernorms_without_bias(capsys):
    """MPT-7B's shape through --arch: its no_bias LayerNorms (norm_bias=false) give the count transformers' MptModel
    has (tests/unit/model/test_model_families.py builds it): 65 norms × 4096 fewer than biased LayerNorms."""
    mpt = "layers=32,hidden=4096,heads=32,vocab=50432,mlp=gelu,norm=layernorm,pos=alibi,tied=true,max_seq=2048"
    counts = {}
    for nb in ("true", "false"):
        assert main(["estimate", "--arch", f"{mpt},norm_bias={nb}", "--gpus", "8", "--seq-len", "2048",
                     "--global-batch", "64", "--json"]) == 0
        counts[nb] = json.loads(capsys.readouterr().out)["params"]
    assert counts["true"] - counts["false"] == 65 * 4096
    assert main(["estimate", "--arch", f"{mpt},norm_bias=maybe"]) == 2
    assert "arch.norm_bias" in capsys.readouterr().err


def test_arch_without_max_seq_has_no_cap(capsys):
    arch = "layers=2,hidden=256,heads=4,vocab=1000"
    assert main(["estimate", "--arch", arch, "--gpus", "8", "--seq-len", "131072", "--global-batch", "8",
                 "--json"]) == 0
    captured = capsys.readouterr()
    assert "warning" not in captured.err
    # learned positions without max_seq: exactly the rows the sequence needs (memory stays right)
    assert main(["estimate", "--arch", arch + ",pos=learned", "--gpus", "8", "--seq-len", "2048",
                 "--global-batch", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["params"] == 2 * 1000 * 256 + 2048 * 256 + 2 * (
        4 * 256 * 256 + 3 * 256 * 768 + 2 * 256) + 256  # embed + head + positions + 2 blocks + final norm


def test_sequence_above_a_presets_window_is_a_warning(capsys):
    assert main(["estimate", "--model", "llama2-13b", "--seq-len", "8192", "--json"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trainplan: warning: seq-len=8192") and "max_seq_len=4096" in err[0]
    # learned positions have no row beyond max_seq: an error
    assert main(["estimate", "--arch", GPT2, "--gpus", "8", "--seq-len", "2048", "--global-batch", "64"]) == 2
    assert capsys.readouterr().err.startswith("trainplan: error: seq-len=2048")


def test_kernels_and_attn_impl_flags_change_the_estimate(capsys):
    base = ["estimate", "--model", "llama2-7b", "--gpus", "8", "--json"]
    out = {}
    for extra in ([], ["--kernels", "compiled"], ["--kernels", "fused"], ["--attn-impl", "math"]):
        assert main(base + extra) == 0
        out[tuple(extra)] = json.loads(capsys.readouterr().out)["step_time_s"]
    assert out[("--kernels", "fused")] < out[()] and out[("--attn-impl", "math")] != out[()]
    assert main(base + ["--kernels", "triton"]) == 2
    assert "--kernels" in capsys.readouterr().err
    h = subprocess.run([sys.executable, "-m", "trainplan.cli", "estimate", "--help"], capture_output=True, text=True,
                       timeout=60).stdout
    for word in ("--kernels", "--attn-impl", "max_seq", "head_dim", "pos (rope|learned|alibi)", "qk_norm", "norm_bias"):
        assert word in h


@pytest.mark.parametrize("argv, key", [
    (["--gpus-per-node", "1e20"], "argument --gpus-per-node"),
    (["--gpus-per-node", "100000000000000000000"], "gpus-per-node"),
    (["--global-batch", str(2**80)], "global-batch"),
    (["--seq-len", str(2**63)], "seq-len"),
    (["--shard-group", "4"], "shard-group"),  # only with hsdp
    (["--sharding", "hsdp", "--shard-group", "0"], "shard-group"),
    (["--cp-kind", "ulysses"], "cp-kind"),  # only with cp > 1
    (["--arch", "layers=2,layers=3"], "arch.layers"),  # repeated key
    (["--arch", "layers=2"], "arch"),  # without --model: a whole architecture
    (["--arch", "layers=2,hidden=64,heads=3,vocab=10"], "arch.hidden"),
    (["--arch", "layers=2,hidden=64,heads=4,vocab=10,pos=sinusoid"], "arch.pos"),
    (["--model", "debug", "--arch", "layers=99999999"], "arch.layers"),
    (["--model", "llama2-7b", "--arch", "hidden=4001"], "arch.hidden"),
    (["--gpu", "h100\nsxm"], "gpu"),
])
def test_bounded_and_cross_checked_flags(capsys, argv, key):
    assert main(["estimate", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"trainplan: error: {key}"), err


def test_arch_with_model_overrides_only_the_given_fields(capsys):
    assert main(["estimate", "--model", "llama2-13b", "--arch", "layers=20", "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["model"] == "llama2-13b" and js["params"] < 13_015_864_320 / 1.8


def test_h100_peak_must_be_finite(capsys):
    for v in ("inf", "nan", "-1"):
        assert main(["validate", "--h100-peak-tflops", v]) == 2
        assert capsys.readouterr().err.startswith("trainplan: error: h100-peak-tflops=")


def test_plan_ranks_only_a_pinned_layout_as_the_study_does(tmp_path, capsys):
    """A config's ``layout:`` pins the search (search.pinned_options), in `plan` as in the study's analytic_model
    and sensitivity stages: `plan` ranked the whole space and put dp32 zero2 first against the pinned TP layout."""
    import yaml

    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    cfg["layout"] = {"dp": 16, "tp": 2, "sp": True, "sharding": "zero1", "recompute": "none", "micro_batch": 2}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["plan", str(tmp_path / "c.yaml"), "--csv", str(tmp_path / "c.csv")]) == 0
    import pandas as pd

    c = pd.read_csv(tmp_path / "c.csv")
    assert list(c["layout_text"]) == ["dp16·tp2(sp)·pp1·cp1 zero1 rc=none mb=2"], list(c["layout_text"])
    assert "1 feasible of 1 layouts" in capsys.readouterr().out


def test_search_can_be_narrowed_to_the_cp_kinds_and_pp_schedules_a_trainer_runs(tmp_path, capsys):
    """search.cp_kinds / search.pp_schedules (absent: both) leave out what the launch cannot run as planned
    (torchtitan's CP is ring only); a value outside them is a one-line error naming the key."""
    import pandas as pd

    base = ("model: llama2-13b\ncluster: {nodes: 2, gpus_per_node: 8, gpu: h100-sxm-80gb}\ntraining: {seq_len: 16384, global_batch: 32}\n"
            "cost: {price_per_gpu_hour_usd: 3}\nproxies: {nproc_per_node: 1, scaleout_world_sizes: [1]}\n"
            "search: {offloads: [none], recomputes: [full], micro_batches: [1], shardings: [zero3]")
    rows = {}
    for name, extra in (("all", ""), ("ring", ", cp_kinds: [ring], pp_schedules: [1f1b]")):
        (tmp_path / f"{name}.yaml").write_text(base + extra + "}\n")
        assert main(["plan", str(tmp_path / f"{name}.yaml"), "--csv", str(tmp_path / f"{name}.csv")]) == 0
        rows[name] = pd.read_csv(tmp_path / f"{name}.csv")
    capsys.readouterr()
    cp = rows["all"]["cp"] > 1
    assert set(rows["all"].loc[cp, "cp_kind"]) == {"ring", "ulysses"}
    assert set(rows["all"].loc[rows["all"]["pp"] > 1, "pp_schedule"]) == {"1f1b", "interleaved"}
    assert set(rows["ring"].loc[rows["ring"]["cp"] > 1, "cp_kind"]) == {"ring"}
    assert set(rows["ring"].loc[rows["ring"]["pp"] > 1, "pp_schedule"]) == {"1f1b"}
    assert len(rows["ring"]) < len(rows["all"])
    (tmp_path / "bad.yaml").write_text(base + ", cp_kinds: [ring, zigzag]}\n")
    assert main(["plan", str(tmp_path / "bad.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "search.cp_kinds" in err[0] and "zigzag" in err[0] and "ulysses" in err[0]


def test_plan_without_a_feasible_layout_says_why(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: llama2-70b\ncluster: {nodes: 1, gpus_per_node: 1, gpu: a100-80gb, host_to_device_GBps: 25}\n"
                   "training: {seq_len: 4096, global_batch: 7}\ncost: {price_per_gpu_hour_usd: 3}\n"
                   "proxies: {nproc_per_node: 1, scaleout_world_sizes: [1]}\nsearch: {offloads: [none]}\n")
    assert main(["plan", str(cfg)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trainplan: warning: no feasible layout of")
    assert "global_batch=7 is not a multiple" in err[0] and "OOM" in err[0]


def test_an_unknown_gpu_name_suggests_the_known_ones_it_resembles(capsys):
    """--gpu h100 is ambiguous (SXM or PCIe): the one-line error lists both; a name nothing resembles gets none."""
    assert main(["estimate", "--gpu", "H100"]) == 2
    assert capsys.readouterr().err.strip().endswith("(did you mean h100-sxm-80gb or h100-pcie-80gb?)")
    assert main(["estimate", "--gpu", "a100"]) == 2
    assert "(did you mean a100-80gb?)" in capsys.readouterr().err
    assert main(["estimate", "--gpu", "b200"]) == 2
    assert "did you mean" not in capsys.readouterr().err


def test_estimate_says_what_its_compute_holds(capsys):
    """The step line splits compute into the parts that grow with a technique (timing.COMPUTE_PARTS), as --json's
    compute_parts does; a layout that pays none (ZeRO-2, no recompute) lists none."""
    base = ["estimate", "--model", "llama2-13b", "--gpus", "32", "--micro-batch", "1"]
    assert main(base + ["--sharding", "zero3", "--recompute", "full"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"step s: compute [\d.]+ \(of which recompute [\d.]+, FSDP all-gather copies on the compute "
                     r"stream [\d.]+\), exposed comm", out), out
    assert main(base + ["--sharding", "zero2"]) == 0
    assert "of which" not in capsys.readouterr().out
    assert main(base + ["--sharding", "zero3", "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert set(js["compute_parts"]) == {"recompute_s", "fsdp_copy_s", "ring_merge_s", "dequant_s"}
    assert 0 < js["compute_parts"]["fsdp_copy_s"] < js["breakdown"]["compute_s"]


def test_estimate_step_line_adds_up_to_the_step(capsys):
    """The step line's terms (timing.STEP_PARTS) add up to the step it prints, CPU offload included."""
    assert main(["estimate", "--model", "llama2-13b", "--gpus", "32", "--micro-batch", "1", "--sharding", "zero3",
                 "--offload", "cpu"]) == 0
    out = capsys.readouterr().out
    line = re.search(r"^step s: (.*)$", out, re.M).group(1)
    line = re.sub(r" \(of which [^)]*\)", "", line)
    terms = dict((name, float(v)) for name, v in re.findall(r"([a-zA-Z ]+?) ([\d.]+)(?:, |$)", line))
    assert list(terms) == ["compute", "exposed comm", "pipeline bubble", "optimizer step", "CPU offload"], line
    assert terms["CPU offload"] > 0
    step = float(re.search(r"^step ([\d.]+) s,", out, re.M).group(1))
    assert sum(terms.values()) == pytest.approx(step, abs=0.03)


def test_estimate_says_why_mfu_can_pass_100_percent_at_long_sequences(capsys):
    """MFU counts causal attention in full (12·L·h·s, as every published table does) while the model times half of it:
    at 131k tokens on A100 that convention passes 100%. estimate says so, and only then."""
    argv = ["estimate", "--model", "llama2-13b", "--gpu", "a100-80gb", "--gpus", "2", "--seq-len", "131072",
            "--global-batch", "4", "--finetune", "lora", "--kernels", "fused", "--json"]
    assert main(argv) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["hfu"] > 1.0
    assert main(argv[:-1]) == 0
    assert "the convention exceeds the peak, not the GPU" in capsys.readouterr().out
    assert main(["estimate", "--model", "llama2-13b"]) == 0
    assert "convention exceeds" not in capsys.readouterr().out


def test_estimate_takes_the_clusters_link_bandwidths(capsys):
    """--intra-busbw / --inter-busbw set the cluster's NCCL busbw as the config keys do (they were fixed at the DGX
    H100 defaults for every GPU): half the NVLink busbw doubles TP8's exposed communication time."""
    base = ["estimate", "--tp", "8", "--sp", "--gpus", "32", "--global-batch", "32", "--json"]
    runs = {}
    for extra in ([], ["--intra-busbw", "180"], ["--intra-busbw", "360", "--inter-busbw", "46"]):
        assert main(base + extra) == 0
        runs[" ".join(extra)] = json.loads(capsys.readouterr().out)["breakdown"]["tp_comm_s"]
    assert runs["--intra-busbw 360 --inter-busbw 46"] == runs[""]  # the defaults, spelled out
    assert runs["--intra-busbw 180"] == pytest.approx(2 * runs[""], rel=0.05)


def test_estimate_takes_the_host_link_and_warns_on_a100s_gen4_at_the_gen5_default(capsys):
    """--host-bw sets cluster.host_to_device_GBps: FSDP2 offload's copies scale with it (at 8 micro-batches the
    synchronous D2H copies are in the offload term). On an A100 the Gen5 default is a one-line warning."""
    base = ["estimate", "--sharding", "zero3", "--offload", "cpu", "--micro-batch", "1", "--json"]
    terms = {}
    for extra in ([], ["--host-bw", "25"]):
        assert main(base + extra) == 0
        terms[" ".join(extra)] = json.loads(capsys.readouterr().out)["breakdown"]["offload_s"]
    assert terms["--host-bw 25"] > terms[""]
    assert main(["estimate", "--gpu", "a100-80gb", "--intra-busbw", "230", "--inter-busbw", "23"]) == 0
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and "--host-bw=50 GB/s: the default for PCIe Gen5" in err
    assert main(["estimate", "--gpu", "a100-80gb", "--intra-busbw", "230", "--inter-busbw", "23", "--host-bw", "25"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_plan_layers_a_variant_overlay_over_its_base(tmp_path, capsys):
    """`trainplan plan base.yaml variant.yaml` deep-merges the files in order, as Snakemake layers --configfile over
    config/config.yaml: the same ranking as one merged file, not the base's; the overlay alone says to give its base."""
    import pandas as pd
    import yaml

    from trainplan.config import deep_merge

    base, lora = ROOT / "config" / "config.yaml", ROOT / "config" / "lora.yaml"
    merged = tmp_path / "merged.yaml"
    merged.write_text(yaml.safe_dump(deep_merge(yaml.safe_load(base.read_text()), yaml.safe_load(lora.read_text()))))
    for name, files in (("two", [base, lora]), ("one", [merged]), ("base", [base])):
        assert main(["plan", *map(str, files), "--top", "1", "--csv", str(tmp_path / f"{name}.csv")]) == 0
    capsys.readouterr()
    two, one, alone = (pd.read_csv(tmp_path / f"{n}.csv", low_memory=False) for n in ("two", "one", "base"))
    pd.testing.assert_frame_equal(two, one)
    assert (two["tokens_per_s_per_gpu"] != alone["tokens_per_s_per_gpu"]).any()  # LoRA is planned, not full FT
    assert main(["plan", str(lora)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "give its base first: trainplan plan config/config.yaml" in err


def test_estimate_takes_the_lora_rank_and_targets(capsys):
    """--lora-rank / --lora-targets size the adapters as training.lora_rank / lora_targets do (they were fixed at 16 on
    q,k,v,o): Llama 2 13B, rank 64 on every projection = 40 layers · 64 · (4·(5120+5120) + 3·(5120+13824)) params,
    6 FLOPs per adapter parameter more per token; misuse is a one-line error naming the flag."""
    base = ["estimate", "--model", "llama2-13b", "--finetune", "lora", "--micro-batch", "1", "--json"]
    assert main(base) == 0
    default = json.loads(capsys.readouterr().out)
    assert main([*base, "--lora-rank", "64", "--lora-targets", "q,k,v,o,gate,up,down"]) == 0
    big = json.loads(capsys.readouterr().out)
    n = 40 * 64 * (4 * (5120 + 5120) + 3 * (5120 + 13824))
    assert default["finetune"] == {"kind": "lora", "lora_rank": 16, "lora_targets": ["q", "k", "v", "o"],
                                   "adapter_params": 40 * 16 * 4 * (5120 + 5120)}
    assert big["finetune"]["adapter_params"] == n
    assert big["flops_per_token"] - default["flops_per_token"] == pytest.approx(6 * (n - 40 * 16 * 4 * 10240))
    assert big["memory_gib"]["optimizer"] > default["memory_gib"]["optimizer"]
    assert main(base[:-1] + ["--lora-rank", "8"]) == 0
    assert "lora: rank 8 on q,k,v,o, 13.1M trainable adapter params" in capsys.readouterr().out
    for argv, key in ((["--finetune", "full", "--lora-rank", "8"], "lora-rank=8: only applies with --finetune lora"),
                      (["--finetune", "qlora", "--lora-targets", "q,q"], "lora-targets=q,q: comma-separated, each"),
                      (["--finetune", "qlora", "--lora-targets", "qkv"], "lora-targets=qkv: comma-separated"),
                      (["--finetune", "lora", "--lora-rank", "0"], "lora-rank=0: must be an integer in 1..65536")):
        assert main(["estimate", "--model", "llama2-13b", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert key in err and err.count("\n") == 1, err


def test_estimate_reproduces_the_qlora_studys_top_row(tmp_path, capsys):
    """The QLoRA variant (rank 64 on every projection) plans its best layout; estimate with the same flags gives the
    same tokens/s and memory (without --lora-rank/--lora-targets it sized rank 16 on q,k,v,o)."""
    import pandas as pd

    assert main(["plan", str(ROOT / "config" / "config.yaml"), str(ROOT / "config" / "qlora.yaml"), "--top", "1",
                 "--csv", str(tmp_path / "c.csv")]) == 0
    c = pd.read_csv(tmp_path / "c.csv", low_memory=False)
    top = c[c["feasible"].astype(bool)].sort_values("rank").iloc[0]
    # the argv below; the fastest layout, zero3 mb2, needs 79.6 GiB even as QLoRA with Hugging Face's norms (over 90%
    # of usable HBM; 72.7 GiB with fused norms: the window where it fits as planned and not as launched is
    # tests/unit/launch/test_as_launched.py's); ZeRO-1 mb1 runs as ZeRO-2 mb1 under Accelerate's FSDP2
    assert top["layout_text"] == "dp32·tp1·pp1·cp1 zero2 rc=none mb=1", top["layout_text"]
    z3 = c[c["layout_text"] == "dp32·tp1·pp1·cp1 zero3 rc=none mb=2"].iloc[0]
    assert not z3["feasible"] and z3["reason"].startswith("OOM: needs 79.6 GiB > 90% of 79.6 GiB")
    z1 = c[c["layout_text"] == "dp32·tp1·pp1·cp1 zero1 rc=none mb=1"].iloc[0]
    assert not z1["feasible"] and z1["reason"].startswith("launched as dp32·tp1·pp1·cp1 zero2 rc=none mb=1 (accelerate")
    capsys.readouterr()
    argv = ["estimate", "--model", "llama2-13b", "--finetune", "qlora", "--sharding", "zero2", "--micro-batch", "1",
            "--json"]
    assert main([*argv, "--lora-rank", "64", "--lora-targets", "q,k,v,o,gate,up,down"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["tokens_per_s_per_gpu"] == pytest.approx(top["tokens_per_s_per_gpu"], rel=1e-9)
    assert js["memory_gib"]["total"] == pytest.approx(top["mem_total_gib"], rel=1e-9)
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["memory_gib"]["total"] != pytest.approx(top["mem_total_gib"], rel=1e-6)


def test_plan_and_estimate_warn_when_an_a100_keeps_dgx_h100_links(tmp_path, capsys):
    """config.yaml's links are DGX H100's; switching only cluster.gpu to a100-80gb plans with them: a warning on
    stderr names the key (estimate: the flag), and is gone once the cluster's own busbw is set."""
    over = tmp_path / "a100.yaml"
    over.write_text("cluster: {gpu: a100-80gb}\n")
    base = str(ROOT / "config" / "config.yaml")
    assert main(["plan", base, str(over), "--top", "1"]) == 0
    err = capsys.readouterr().err
    assert "warning: cluster.intra_busbw_GBps=360 and cluster.inter_busbw_GBps=46 GB/s: " in err
    over.write_text("cluster: {gpu: a100-80gb, intra_busbw_GBps: 230, inter_busbw_GBps: 23}\n")
    assert main(["plan", base, str(over), "--top", "1"]) == 0
    assert "busbw" not in capsys.readouterr().err
    assert main(["estimate", "--gpu", "a100-80gb", "--gpus", "8", "--inter-busbw", "23"]) == 0
    err = capsys.readouterr().err
    assert "warning: --intra-busbw=360 GB/s: " in err and "inter-busbw" not in err


def test_lora_on_only_the_gate_of_a_gelu_mlp_is_an_error(tmp_path, capsys):
    """A GELU MLP has no gate projection (adapter_params skips ``gate``): LoRA on ``gate`` alone planned a fine-tune
    of zero trainable parameters. Refused in estimate (the flag) and in a config (the key); gate among others is
    fine (it is skipped, the rest train)."""
    gpt2 = ["--arch", "layers=12,hidden=768,heads=12,vocab=50257,mlp=gelu,norm=layernorm,pos=learned,bias=all,"
                      "tied=true,max_seq=1024", "--gpus", "8", "--seq-len", "1024", "--global-batch", "64",
            "--finetune", "lora", "--json"]
    assert main(["estimate", *gpt2, "--lora-targets", "gate"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainplan: error: lora-targets=gate: custom's gelu MLP has no gate projection") and \
        err.count("\n") == 1
    assert main(["estimate", *gpt2, "--lora-targets", "gate,up"]) == 0
    assert json.loads(capsys.readouterr().out)["finetune"]["adapter_params"] == 12 * 16 * (768 + 3072)
    cfg = tmp_path / "gelu.yaml"
    cfg.write_text("model: {layers: 12, hidden: 768, heads: 12, vocab: 50257, mlp: gelu, norm: layernorm, "
                   "pos_embedding: learned, bias: all, tied_embeddings: true, max_seq_len: 1024}\n"
                   "cluster: {nodes: 1, gpus_per_node: 8, gpu: h100-sxm-80gb}\n"
                   "training: {seq_len: 1024, global_batch: 64, finetune: qlora, lora_targets: [gate]}\n"
                   "cost: {price_per_gpu_hour_usd: 3}\n")
    assert main(["plan", str(cfg)]) == 2
    assert "training.lora_targets=gate: custom's gelu MLP has no gate projection" in capsys.readouterr().err


def test_an_estimate_that_does_not_fit_says_what_would_with_the_same_degrees(capsys):
    """DDP of a 13B at micro-batch 4 on 32 GPUs needs 331 GiB: the estimate names the memory knobs that make it
    fit with dp32 kept (the fastest such layout), and that layout, estimated as named, fits at that speed."""
    base = ["estimate", "--model", "llama2-13b", "--gpus", "32", "--json"]
    assert main([*base, "--sharding", "none", "--micro-batch", "4"]) == 0
    js = json.loads(capsys.readouterr().out)
    fix = js["fits_with"]
    assert not js["feasible"] and fix["changes"] and "sharding" in fix["changes"]
    assert fix["layout"].startswith("dp32·tp1·pp1·cp1 ")
    flags = [x for k, v in fix["changes"].items() for x in (f"--{k.replace('_', '-')}", str(v))]
    args = [*base, "--sharding", "none", "--micro-batch", "4", *flags]
    assert main(args) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["feasible"] and "fits_with" not in again
    assert again["tokens_per_s_per_gpu"] == pytest.approx(fix["tokens_per_s_per_gpu"])
    assert again["memory_gib"]["total"] == pytest.approx(fix["memory_gib"])
    assert main(["estimate", "--model", "llama2-13b", "--gpus", "32", "--sharding", "none", "--micro-batch", "4"]) == 0
    assert "fits with the same dp·tp·pp·cp: --sharding " in capsys.readouterr().out


def test_plan_on_24_gpus_says_once_why_pure_data_parallelism_is_out_and_what_batch_would_allow_it(tmp_path, capsys):
    """256 sequences on 24 GPUs: one line for the five shardings ruled out as dp24 (with the nearest batches) and
    one naming the nearest batch that divides and the layout it allows with what it buys (no PP: dp12·tp2) (search.layouts.group_infeasible, batch_alternative)."""
    over = tmp_path / "24.yaml"
    over.write_text("cluster: {nodes: 3}\nsearch: {micro_batches: [1, 2], recomputes: [none], offloads: [none]}\n")
    assert main(["plan", str(ROOT / "config" / "config.yaml"), str(over), "--top", "1"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert ("DDP, ZeRO-1, ZeRO-2, FSDP, HSDP (infeasible): dp24·tp1·pp1·cp1: global_batch=256 is not a multiple of "
            "dp·micro_batch = 24·1 (the nearest that are: 240, 264)") in text
    assert text.count("24·1 (the nearest") == 1
    assert re.search(r"Global batch: 256 sequences do not divide over 24 GPUs \(no layout with dp = 24\); at 264 "
                     r"\(or 240\) the best would be ZeRO-2×TP \(dp12·tp2\(sp\)·pp1·cp1 zero2 rc=none mb=2\), [\d,]+ "
                     r"tokens/s/GPU, [12]\d\.\d% faster", text)


def test_estimate_auto_micro_batch_blames_the_global_batch_not_a_micro_batch(capsys):
    """24 GPUs, batch 256: no micro-batch can divide it; with --micro-batch auto (the default) the error names
    --global-batch and the nearest batches that divide, not 'layout.micro_batch=1', a value nobody chose."""
    assert main(["estimate", "--model", "llama2-13b", "--gpus", "24", "--global-batch", "256"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("trainplan: error: global-batch=256: must be a multiple of dp = 24 (--gpus / (tp·pp·cp)) for any "
                   "micro-batch (the nearest that are: 240, 264)")
    assert main(["estimate", "--model", "llama2-13b", "--gpus", "24", "--global-batch", "256", "--micro-batch", "2"]) == 2
    assert "layout.micro_batch=2" in capsys.readouterr().err  # a micro-batch the user chose is named as before


def test_plan_with_an_empty_search_space_is_a_config_error_and_writes_nothing(tmp_path, capsys):
    """shardings [none] with offloads [cpu] leaves no layout to size: one line naming ``search`` (it was a KeyError
    traceback from the family verdicts), and no --csv file."""
    over = tmp_path / "s.yaml"
    over.write_text("search:\n  shardings: [none]\n  offloads: [cpu]\n")
    out = tmp_path / "c.csv"
    assert main(["plan", str(ROOT / "config" / "config.yaml"), str(over), "--csv", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trainplan: error: search=0 layouts") and "offload" in err[0]
    assert not out.exists()
