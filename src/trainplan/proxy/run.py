"""Per-rank training entry of a proxy run: ``python -m trainplan.proxy.run SPEC.json RANK_DIR``.

Started by torchrun (see :mod:`trainplan.proxy.torchrun`). Each rank trains the same seeded synthetic
stream, measures step 0 in detail (FLOPs, saved activations, collectives, state bytes) and times the
steps after warm-up, then writes ``RANK_DIR/rank{r}.json`` atomically. The launcher merges those into
the RECORD. Memory limit: before allocating, the exact per-rank state bytes are checked against
``mem_limit_bytes``; after step 0, state + saved-activation bytes (max over ranks) are — over the limit
the run ends as ``oom`` on every rank. On CUDA a real ``OutOfMemoryError`` is also ``oom``.

Test hooks: ``TRAINPLAN_PROXY_HANG_RANK=r`` makes rank r sleep forever before its first collective,
which is how the tests produce a hung collective; ``TRAINPLAN_PROXY_FAIL_IDS=id1,id2`` makes every rank of
those proxy ids raise a RuntimeError (status ``error``, exit 1: the failure Snakemake retries).
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainplan.io import read_json, write_json
from trainplan.model.arch import ModelSpec
from trainplan.model.layout import Layout, grad_accum
from trainplan.model.training import TrainingSpec
from trainplan.proxy import analytic, measure
from trainplan.proxy.lora import apply_lora, lora_trainable_params
from trainplan.proxy.model import build_model, n_params
from trainplan.proxy.parallelize import build_mesh, parallelize
from trainplan.proxy.schema import normalize_run_spec, uses_autocast
from trainplan.proxy.torchrun import PROGRESS_ENV, alloc_conf


class ProxyOOM(RuntimeError):
    """The run exceeded its memory limit (a result, not a crash)."""


def synthetic_tokens(step: int, global_batch: int, seq_len: int, vocab: int, seed: int) -> torch.Tensor:
    """(global_batch, seq_len+1) tokens of a seeded, learnable stream: next = perm[prev] w.p. 0.75, else uniform."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(vocab, generator=g)
    g.manual_seed(seed * 1_000_003 + step + 1)
    out = torch.empty(global_batch, seq_len + 1, dtype=torch.long)
    out[:, 0] = torch.randint(vocab, (global_batch,), generator=g)
    noise = torch.randint(vocab, (global_batch, seq_len), generator=g)
    keep = torch.rand(global_batch, seq_len, generator=g) < 0.75
    for i in range(seq_len):
        out[:, i + 1] = torch.where(keep[:, i], perm[out[:, i]], noise[:, i])
    return out


def _dp_coords(mesh: Any, layout: Layout) -> tuple[int, int]:
    """(dp rank, dp size) of this process: its slice of the global batch."""
    if mesh is None:
        return 0, 1
    names = [n for n in ("dp_replicate", "dp_shard") if n in (mesh.mesh_dim_names or ())]
    r = 0
    for n in names:
        r = r * mesh[n].size() + mesh[n].get_local_rank()
    return r, layout.dp


def progress_line(spec: dict[str, Any], step: int, loss: float, times: list[float], *, tokens_per_step: int) -> str:
    """One step of progress: step k/N, loss, this step's time, median so far, tokens/s, elapsed, ETA."""
    med = statistics.median(times)
    done, total = step + 1, spec["steps"]
    phase = "warm-up" if step < spec["warmup"] else "timed"
    return (f"{time.strftime('%Y-%m-%dT%H:%M:%S')} [proxy {spec['id']}] step {done}/{total} ({phase}) "
            f"loss {loss:.4f}  {times[-1] * 1e3:.1f} ms (median {med * 1e3:.1f} ms)  "
            f"{tokens_per_step / times[-1]:,.0f} tokens/s  elapsed {sum(times):.1f} s  "
            f"ETA {med * (total - done):.1f} s")


def _progress(spec: dict[str, Any], step: int, loss: float, times: list[float], *, tokens_per_step: int) -> None:
    """Rank 0's per-step progress: stderr, and appended (flushed per line, so `tail -f` follows a long run)
    to the file named by ``TRAINPLAN_PROXY_PROGRESS`` (the workflow sets it to the proxy's ``.steps.log``)."""
    line = progress_line(spec, step, loss, times, tokens_per_step=tokens_per_step)
    print(line, file=sys.stderr, flush=True)
    path = os.environ.get(PROGRESS_ENV)
    if path:
        with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def _percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def train(spec: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """Build, parallelise, train and measure; returns this rank's result dict (raises ProxyOOM)."""

    mspec = ModelSpec.from_dict(spec["model"])
    layout = Layout.from_dict(spec["layout"])
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if spec["device"] == "cuda" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    bf16 = spec["dtype"] == "bf16"
    limit = spec["mem_limit_bytes"]
    lora = spec["finetune"] == "lora"

    trainable = lora_trainable_params(mspec, spec["lora_rank"], spec["lora_targets"]) if lora else None
    exact = analytic.exact_state_bytes(mspec, layout, trainable_params=trainable)
    if limit is not None and sum(exact.values()) > limit:  # refuse before allocating
        raise ProxyOOM(f"predicted per-rank state {sum(exact.values())} B > mem_limit_bytes={limit}")

    if spec["id"] in os.environ.get("TRAINPLAN_PROXY_FAIL_IDS", "").split(","):  # test hook: a failing run
        raise RuntimeError(f"TRAINPLAN_PROXY_FAIL_IDS test hook: proxy {spec['id']} fails")
    hang = os.environ.get("TRAINPLAN_PROXY_HANG_RANK")
    if hang is not None and int(hang) == rank:
        while True:  # test hook: a rank that never joins the next collective
            time.sleep(3600)

    mesh = build_mesh(layout, dev.type) if world > 1 else None
    model = build_model(mspec, device=dev, seed=spec["seed"], impl=spec.get("model_impl", "trainplan"))
    n_module = n_params(model)
    if lora:

        apply_lora(model, spec["lora_rank"], spec["lora_targets"], seed=spec["seed"])
    n_trainable_full = sum(p.numel() for p in model.parameters() if p.requires_grad)
    model = parallelize(model, layout, mesh, device=dev, bf16=bf16 and layout.sharding != "none",
                        compile=spec["compile"])
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=spec["lr"], weight_decay=0.0)
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=uses_autocast(layout, spec["dtype"]))

    accum = grad_accum_of(spec, layout)
    mb, s = layout.micro_batch, spec["seq_len"]
    dp_rank, dp_size = _dp_coords(mesh, layout)
    comm = measure.CommCounter()
    losses: list[float] = []
    times: list[float] = []
    detail: dict[str, Any] = {}
    for step in range(spec["steps"]):
        data = synthetic_tokens(step, spec["global_batch"], s, mspec.vocab, spec["seed"])
        local = data.view(dp_size, accum * mb, s + 1)[dp_rank].to(dev)
        first = step == 0
        _sync(dev)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        total = torch.zeros((), device=dev)
        with comm if first else _null():
            flop_ctx = measure.count_flops() if first else _null()
            with flop_ctx as fl:
                for i in range(accum):
                    x = local[i * mb:(i + 1) * mb]
                    tracker = measure.SavedTensorTracker(model) if first and i == 0 else _null()
                    with _grad_sync(model, last=i == accum - 1):  # DDP decides in forward: wrap both
                        with tracker, autocast:
                            logits = model(x[:, :-1])
                            loss = F.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten()) / accum
                        loss.backward()
                    total += loss.detach()
                    if first and i == 0:
                        detail["saved"] = tracker.summary()  # carries its own `complete` flag
            opt.step()
        _sync(dev)
        times.append(time.perf_counter() - t0)
        if first:
            detail["flops"] = fl
            detail["state"] = measure.state_bytes(model, opt)
            # one micro-batch's activations at a time: each backward frees them before the next forward (the
            # planner counts one micro-batch in flight without PP, memory.activation_bytes)
            foot = sum(v for k, v in detail["state"].items()) + detail["saved"]["total_bytes"]
            detail["footprint_bytes"] = foot
            if limit is not None:
                worst = torch.tensor([foot], dtype=torch.long, device=dev)
                if world > 1:
                    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
                if int(worst) > limit:
                    raise ProxyOOM(f"measured per-rank state + saved activations {int(worst)} B > "
                                   f"mem_limit_bytes={limit}")
        if first and spec["compile"]:
            # Step 0 ran the compiled blocks under the FLOP counter's dispatch mode and global module hooks: dynamo
            # marks such frames skipped for good, so without a reset `compile: true` trains eagerly (seen on an H200,
            # docs/timing-model.md §7.9). Reset: the next step compiles (a warm-up step; the record counts graphs).
            torch._dynamo.reset()
        if world > 1:
            dist.all_reduce(total, op=dist.ReduceOp.SUM)
            total /= world  # TP ranks hold equal values; the mean over all ranks is the mean over dp
        losses.append(float(total))
        if rank == 0:
            _progress(spec, step, losses[-1], times, tokens_per_step=spec["global_batch"] * s)

    timed = times[spec["warmup"]:]
    tokens_per_step = spec["global_batch"] * s
    med = statistics.median(timed)
    out: dict[str, Any] = {
        "rank": rank, "status": "ok", "message": "",
        "timing": {"step_times_s": times, "step_time_median_s": med, "step_time_p10_s": _percentile(timed, 0.1),
                   "step_time_p90_s": _percentile(timed, 0.9), "tokens_per_s": tokens_per_step / med,
                   "tokens_per_step": tokens_per_step},
        "loss": losses, "comm": comm.summary(), "state": detail["state"], "saved": detail["saved"],
        "flops": detail["flops"], "footprint_bytes": detail["footprint_bytes"],
        "params": {"module": n_module, "spec": mspec.n_params, "trainable": n_trainable_full},
        "exact_state": exact, "accum": accum,
        "environment": {"torch_version": torch.__version__, "world_size": world,
                        "backend": dist.get_backend() if dist.is_initialized() else "none",
                        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                        "hostname": socket.gethostname(),
                        "slurm_node": os.environ.get("SLURMD_NODENAME") or None,
                        # the caching allocator's settings (None: torch's defaults); reserved bytes depend on them
                        "alloc_conf": alloc_conf(os.environ),
                        "compiled_graphs": compiled_graphs()},
    }
    if dev.type == "cuda":
        out["cuda"] = {"max_allocated_bytes": torch.cuda.max_memory_allocated(dev),
                       "max_reserved_bytes": torch.cuda.max_memory_reserved(dev)}
    return out


def compiled_graphs() -> int:
    """Graphs dynamo compiled in this process (``torch._dynamo.utils.counters``): 0 means ``compile: true`` ran eagerly."""
    from torch._dynamo.utils import counters

    return int(counters["stats"].get("unique_graphs", 0))


def _grad_sync(model: Any, *, last: bool) -> Any:
    """DDP: all-reduce only on the last micro-batch (``no_sync``; its gradients are whole on every rank anyway).
    FSDP2 (ZeRO-2/3, HSDP): reduce-scatter after every micro-batch, as the plan times it
    (``timing.dp_comm_step_s``, ``fsdp_comm_mb_s``) and sizes it (gradient shards only): with
    ``set_requires_gradient_sync(False)`` FSDP2 would hold the unsharded gradients until the last one."""
    if hasattr(model, "no_sync"):
        return _null() if last else model.no_sync()
    return _null()


def grad_accum_of(spec: dict[str, Any], layout: Layout) -> int:

    return int(grad_accum(TrainingSpec(seq_len=spec["seq_len"], global_batch=spec["global_batch"]), layout))


class _null:
    def __enter__(self) -> dict:
        return {}

    def __exit__(self, *a: Any) -> None:
        return None


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec_path, rank_dir = argv[0], argv[1]
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    out_path = os.path.join(rank_dir, f"rank{rank}.json")
    try:
        spec = normalize_run_spec(read_json(spec_path))
        if world > 1 or "MASTER_ADDR" in os.environ:
            backend = "nccl" if spec["device"] == "cuda" else "gloo"
            dist.init_process_group(backend=backend)
        res = train(spec, rank, world)
        write_json(out_path, res)
        code = 0
    except ProxyOOM as e:
        write_json(out_path, {"rank": rank, "status": "oom", "message": str(e)})
        code = 0
    except Exception as e:  # noqa: BLE001 - every failure becomes a recorded status
        cuda_oom = torch.cuda.is_available() and isinstance(e, torch.cuda.OutOfMemoryError)
        if cuda_oom or isinstance(e, MemoryError) or "can't allocate memory" in str(e):
            write_json(out_path, {"rank": rank, "status": "oom", "message": str(e)[:2000]})
            code = 0
        else:
            import traceback

            write_json(out_path, {"rank": rank, "status": "error", "message": f"{type(e).__name__}: {e}",
                                  "traceback": traceback.format_exc()[-4000:]})
            code = 1
    if dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
