"""The thin entry point (HF Llama + FSDP2 + DCP) on CPU with gloo, 2 ranks, debug size.

20 steps uninterrupted; the same job stopped by SIGTERM (graceful: checkpoint, exit) and by SIGKILL (hard: resume
from the last interval checkpoint) and resumed: the resumed losses equal the uninterrupted ones exactly.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from trainplan import train_entry as te
from trainplan.model.arch import MODEL_PRESETS, hf_config_dict

STEPS = 20
SLOW = pytest.mark.slow  # 2-rank jobs on 2 shared cores: 15-60 s each


def _dataset(path: Path) -> Path:
    """A learnable token stream (x' = 5x + 3 + noise mod 256) in the documented .npy format."""
    rng = np.random.default_rng(0)
    n = 40_000
    x = np.empty(n, np.uint16)
    x[0] = 1
    noise = rng.integers(0, 2, n)
    for t in range(n - 1):
        x[t + 1] = (int(x[t]) * 5 + 3 + int(noise[t])) % 256
    return te.write_tokens(path, x)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("entry")
    (d / "config.json").write_text(json.dumps(hf_config_dict(MODEL_PRESETS["debug"])))
    _dataset(d / "tokens.npy")
    return d


def _cmd(d: Path, ckpt: str, log: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
            "-m", "trainplan.train_entry", "--model-config", str(d / "config.json"), "--data", str(d / "tokens.npy"),
            "--seq-len", "32", "--micro-batch", "2", "--grad-accum", "2", "--steps", str(STEPS), "--lr", "3e-3",
            "--ckpt-dir", str(d / ckpt), "--ckpt-interval-steps", "5", "--step-log", str(d / log), *extra]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _losses(path: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in _events(path) if r["event"] == "step"}


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _run_until(d: Path, ckpt: str, log: str, step: int, sig: int) -> int:
    p = subprocess.Popen(_cmd(d, ckpt, log, "--sleep-per-step-s", "0.4"), env=_env(), start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        if (d / log).exists() and any(r.get("step", 0) >= step for r in _events(d / log) if r["event"] == "step"):
            break
        if p.poll() is not None:
            break
        time.sleep(0.1)
    if sig == signal.SIGKILL:  # the workers (torchrun starts each in its own session): nothing gets to save
        for child in _children(p.pid):
            os.kill(child, signal.SIGKILL)
    else:
        p.send_signal(sig)  # torchrun forwards SIGTERM to its workers
    return p.wait(timeout=90)


@pytest.fixture(scope="module")
def reference(job):
    r = subprocess.run(_cmd(job, "ck_ref", "ref.jsonl"), env=_env(), capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    return _losses(job / "ref.jsonl")


@SLOW
def test_uninterrupted_run_logs_every_step_and_learns(job, reference):
    assert sorted(reference) == list(range(1, STEPS + 1))
    assert reference[STEPS] < reference[1] - 0.5  # the loss falls on the learnable stream
    ev = _events(job / "ref.jsonl")
    start = ev[0]
    assert start["event"] == "start" and start["world_size"] == 2 and start["backend"] == "gloo"
    assert start["n_params"] == MODEL_PRESETS["debug"].n_params
    steps = [r for r in ev if r["event"] == "step"]
    assert all(r["tokens_per_s_per_gpu"] > 0 and r["peak_mem_bytes"] > 0 and r["tokens"] == 2 * 2 * 2 * 32
               for r in steps)
    assert [r["step"] for r in ev if r["event"] == "checkpoint"] == [5, 10, 15, 20]
    assert (job / "ck_ref" / "DONE").read_text().strip() == str(STEPS)


@SLOW
def test_sigterm_checkpoints_then_resume_continues_the_same_loss(job, reference):
    _run_until(job, "ck_term", "term.jsonl", 8, signal.SIGTERM)
    ev = _events(job / "term.jsonl")
    stop = [r for r in ev if r["event"] == "stop"]
    assert stop and stop[0]["signal"] == signal.SIGTERM
    stopped_at = stop[0]["step"]
    assert (job / "ck_term" / "latest").read_text().strip() == f"step-{stopped_at}"
    assert not (job / "ck_term" / "DONE").exists()
    r = subprocess.run(_cmd(job, "ck_term", "term.jsonl"), env=_env(), capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    starts = [e for e in _events(job / "term.jsonl") if e["event"] == "start"]
    assert starts[-1]["start_step"] == stopped_at
    got = _losses(job / "term.jsonl")
    assert sorted(got) == list(range(1, STEPS + 1))
    assert got == reference  # bit-identical: same data order, restored optimizer and scheduler state


@SLOW
def test_sigkill_resumes_from_the_last_interval_checkpoint(job, reference):
    _run_until(job, "ck_kill", "kill.jsonl", 12, signal.SIGKILL)
    done_before = max(_losses(job / "kill.jsonl"))
    assert done_before >= 12
    latest = int((job / "ck_kill" / "latest").read_text().strip().split("-")[1])
    saved = [r["step"] for r in _events(job / "kill.jsonl") if r["event"] == "checkpoint"]
    # the last finished save: the newest logged one (≥ 10, since step 12 ran), or the next if the kill fell
    # between writing `latest` and logging it — never an older one
    assert max(saved) >= 10 and latest in (max(saved), max(saved) + 5) and latest <= done_before
    r = subprocess.run(_cmd(job, "ck_kill", "kill2.jsonl"), env=_env(), capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    after = _losses(job / "kill2.jsonl")
    assert min(after) == latest + 1  # the steps after the checkpoint are redone ...
    assert after == {s: reference[s] for s in range(latest + 1, STEPS + 1)}  # ... with the same losses


def test_batches_depend_on_the_step_only():
    """The batch is a function of (step, micro-batch, rank) alone, as the module docstring states: a resumed run
    reads what the uninterrupted run would have, and every (step, micro, rank) reads its own samples."""
    tokens = np.arange(100_000, dtype=np.uint32)
    kw = {"grad_accum": 2, "dp": 2, "micro_batch": 2, "seq_len": 8}
    a = te.batch_for(tokens, step=3, micro=1, dp_rank=1, **kw)
    b = te.batch_for(tokens, step=3, micro=1, dp_rank=1, **kw)
    assert a.shape == (2, 8) and a.dtype == np.int64 and (a == b).all()
    # sample i = ((step·grad_accum + micro)·dp + rank)·micro_batch + j starts at token i·seq_len
    first = ((3 * 2 + 1) * 2 + 1) * 2
    assert a[:, 0].tolist() == [first * 8, (first + 1) * 8]
    starts = {int(te.batch_for(tokens, step=s, micro=m, dp_rank=r, **kw)[0, 0])
              for s in range(4) for m in range(2) for r in range(2)}
    assert len(starts) == 4 * 2 * 2  # no two (step, micro, rank) read the same samples


def test_gradients_are_reduce_scattered_after_every_micro_batch(tmp_path):
    """FSDP2 with gradient accumulation keeps only the gradient shard: after the first of two micro-batches every
    parameter already holds its (sharded) gradient. With sync switched off until the last micro-batch, FSDP2 would
    hold the unsharded gradients instead (p.grad None until then): the whole model's fp32 gradients per rank."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    (tmp_path / "config.json").write_text(json.dumps(hf_config_dict(MODEL_PRESETS["debug"])))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        model = te.build_hf_model(tmp_path / "config.json")
        for layer in te.decoder_layers(model):
            fully_shard(layer, reshard_after_forward=False)
        fully_shard(model, reshard_after_forward=False)
        ids = torch.randint(0, 100, (2, 16))
        loss = te.micro_backward(model, ids, grad_accum=2)
        assert loss.requires_grad is False and float(loss) > 0
        assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(("argv", "says"), [
    (["--finetune", "qlora"], "--finetune='qlora': one of full, lora"),
    (["--finetune", "lora", "--lora-targets", "q,foo"], "--lora-targets='q,foo': comma-separated"),
    (["--finetune", "lora", "--lora-targets", "q,q"], "each at most once"),
    (["--finetune", "lora", "--lora-rank", "0"], "--lora-rank=0: a positive integer"),
])
def test_bad_fine_tune_options_are_refused_before_anything_starts(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        te.parse_args(["--model-config", "c.json", "--data", "t.npy", "--seq-len", "8", "--steps", "1", *argv], env={})
    assert e.value.code == 2 and says in capsys.readouterr().err


@SLOW
def test_lora_trains_only_the_plans_adapters(job):
    """--finetune lora (the sbatch's TRAINPLAN_FINETUNE for a LoRA or QLoRA plan): PEFT adapters of the plan's rank
    on the plan's projections, r·(in + out) each (the count the planner sizes), base weights frozen; it learns."""
    from trainplan.proxy.lora import lora_trainable_params

    r = subprocess.run(_cmd(job, "ck_lora", "lora.jsonl", "--finetune", "lora", "--lora-rank", "4",
                            "--lora-targets", "q,v,down"), env=_env(), capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    ev = _events(job / "lora.jsonl")
    spec = MODEL_PRESETS["debug"]
    expected = lora_trainable_params(spec, 4, ["q", "v", "down"])
    assert ev[0]["finetune"] == "lora" and ev[0]["trainable_params"] == expected
    assert ev[0]["n_params"] == spec.n_params + expected
    losses = _losses(job / "lora.jsonl")
    assert sorted(losses) == list(range(1, STEPS + 1)) and losses[STEPS] < losses[1]


def test_bin_format_and_env_defaults_and_cost_interval(tmp_path):
    ids = np.array([1, 2, 70000, 5], dtype=np.uint32)
    te.write_tokens(tmp_path / "t.bin", ids)
    assert te.load_tokens(tmp_path / "t.bin", "uint32").tolist() == ids.tolist()
    assert (tmp_path / "t.bin").stat().st_size == 16
    (tmp_path / "cost.json").write_text(json.dumps({"checkpoint_interval_h": 1.5}))
    a = te.parse_args(["--steps", "7"], env={"TRAINPLAN_MODEL_CONFIG": "c.json", "TRAINPLAN_DATA": "t.bin",
                                             "TRAINPLAN_SEQ_LEN": "4096", "TRAINPLAN_MICRO_BATCH": "2",
                                             "TRAINPLAN_STEPS": "99", "TRAINPLAN_COST_JSON": str(tmp_path / "cost.json")})
    assert (a.seq_len, a.micro_batch, a.steps, a.ckpt_interval_s) == (4096, 2, 7, 5400.0)
    with pytest.raises(SystemExit):
        te.parse_args([], env={})


def test_the_optimizer_implementation_is_an_option_and_fused_by_default(capsys):
    """AdamW runs the kernels the planner timed (training.optimizer_impl, exported by the sbatch script): fused by
    default, foreach on request, anything else refused before a process group starts."""
    need = ["--model-config", "c.json", "--data", "t.npy", "--seq-len", "8", "--steps", "1"]
    assert te.parse_args(need, env={}).optimizer_impl == "fused"
    assert te.parse_args(need, env={"TRAINPLAN_OPTIMIZER_IMPL": "foreach"}).optimizer_impl == "foreach"
    assert te.OPTIMIZER_IMPLS["fused"] == {"fused": True} and te.OPTIMIZER_IMPLS["foreach"] == {"foreach": True}
    with pytest.raises(SystemExit):
        te.parse_args([*need, "--optimizer-impl", "for-loop"], env={})
    assert "--optimizer-impl='for-loop'" in capsys.readouterr().err


@SLOW
def test_accelerate_launch_with_the_generated_config_on_cpu(job, reference, tmp_path):
    """`accelerate launch --config_file <generated accelerate_fsdp2.yaml>` (use_cpu, fp32 for CPU): Accelerate
    resolves the FSDP config to DistributedType.NO on CPU — no sharding and no gradient sync (measured); the entry
    point says so and shards with FSDP2 itself, so the losses equal the torchrun run's."""
    import yaml

    from trainplan.launch import artifacts as launch
    from trainplan.model.hardware import ClusterSpec
    from trainplan.model.layout import Layout
    from trainplan.model.training import TrainingSpec

    text = launch.accelerate_config(MODEL_PRESETS["debug"], ClusterSpec(nodes=1, gpus_per_node=2, gpu="h100-sxm-80gb"),
                                    TrainingSpec(seq_len=32, global_batch=8), Layout(dp=2, sharding="zero3",
                                                                                     micro_batch=2),
                                    study_hash="abc123")
    cfg = yaml.safe_load(text)
    cfg.update(use_cpu=True, mixed_precision="no")
    (tmp_path / "acc.yaml").write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(tmp_path / "acc.yaml"),
           *_cmd(job, "ck_acc", "acc.jsonl")[6:], "--steps", "4"]  # `-m trainplan.train_entry ...`, 4 steps
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    ev = _events(job / "acc.jsonl")
    assert "DistributedType.NO" in ev[0]["warnings"][0] and ev[0]["sharded"] is True
    assert ev[0]["local_params_rank0"] < MODEL_PRESETS["debug"].n_params  # this rank holds a shard
    assert _losses(job / "acc.jsonl") == {s: reference[s] for s in range(1, 5)}


@SLOW
def test_hsdp_shard_group_gives_the_same_losses(job, reference):
    """--shard-group 1 on 2 ranks: HSDP (2-D mesh, replicate 2 x shard 1), the same math as FSDP over 2."""
    r = subprocess.run(_cmd(job, "ck_hsdp", "hsdp.jsonl", "--steps", "4", "--shard-group", "1"), env=_env(),
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    start = _events(job / "hsdp.jsonl")[0]
    assert start["layout"]["sharding"] == "hsdp" and start["layout"]["shard_group"] == 1
    assert start["local_params_rank0"] == MODEL_PRESETS["debug"].n_params  # shard groups of one rank: replicas
    got = _losses(job / "hsdp.jsonl")
    assert got == pytest.approx({s: reference[s] for s in range(1, 5)}, rel=1e-6)


def test_hf_rms_norms_become_torch_rms_norm_with_the_same_output(tmp_path):
    """transformers' eager LlamaRMSNorm saves its fp32 input and x·rstd; torch.nn.RMSNorm (F.rms_norm, fused on
    CUDA) the input and rstd, as the plan sizes: every block's two norms and the final one are swapped, and the
    model computes the same logits."""
    import torch

    (tmp_path / "config.json").write_text(json.dumps(hf_config_dict(MODEL_PRESETS["debug"])))
    model = te.build_hf_model(tmp_path / "config.json")
    with torch.no_grad():  # weights other than 1, so a dropped weight would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    ids = torch.randint(0, 100, (2, 16))
    before = model(input_ids=ids).logits
    assert te.fused_rms_norms(model) == 2 * MODEL_PRESETS["debug"].layers + 1
    assert not any(type(m).__name__ == "LlamaRMSNorm" for m in model.modules())
    assert torch.allclose(model(input_ids=ids).logits, before, atol=1e-5, rtol=1e-5)
    assert te.fused_rms_norms(model) == 0  # idempotent


def test_accelerate_reduces_gradients_in_fp32_as_planned(monkeypatch):
    """Accelerate 1.16's FSDP2 plugin reduces gradients in the parameter dtype when no policy is given (bf16 here):
    the entry point passes a plugin with fp32 reduction, as the plan sizes and times it and the other paths run;
    Accelerator's own set_mixed_precision('bf16') keeps it."""
    import torch

    pytest.importorskip("accelerate")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    plugin = te.accelerate_fsdp_plugin(True)
    plugin.set_mixed_precision("bf16")
    assert plugin.fsdp_version == 2
    assert plugin.mixed_precision_policy.param_dtype == torch.bfloat16
    assert plugin.mixed_precision_policy.reduce_dtype == torch.float32
    assert te.accelerate_fsdp_plugin(False) is None


@SLOW
def test_interval_checkpoints_are_written_asynchronously_and_the_final_one_synchronously(job, reference):
    """cost.checkpoint_async (the plan's cost) is what runs: interval saves go through dcp.async_save (the event
    records the stall and, later, the whole write, once every rank finished it, and only then names it ``latest``);
    the final save is synchronous. The uninterrupted losses above come from the same run."""
    ck = [e for e in _events(job / "ref.jsonl") if e["event"] == "checkpoint"]
    interval = [e for e in ck if e["reason"] == "interval"]
    assert interval and all(e["async"] and e["write_s"] >= e["save_s"] >= 0 for e in interval)
    assert [e["step"] for e in interval] == list(range(5, STEPS, 5))
    final = [e for e in ck if e["reason"] == "final"]
    assert len(final) == 1 and final[0]["async"] is False and final[0]["step"] == STEPS
    assert (job / "ck_ref" / "latest").read_text().strip() == f"step-{STEPS}"
