"""Size the real full-depth model on a simulated N-rank world with PyTorch's own ``FSDPMemTracker``.

The fake process group (``FakeStore``, backend ``"fake"``) and ``FakeTensorMode`` make one CPU process
act as rank 0 of an N-rank FSDP2 job: no tensor holds memory, yet the tracker sees every allocation
FSDP2 makes (sharded params, all-gather buffers, grads, optimizer states, activations). The DeviceMesh
is built *before* entering FakeTensorMode (inside it, mesh construction hits a data-dependent op).
Reported next to the analytic ``memory_breakdown`` of the same layout.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from trainplan.io import write_json
from trainplan.model import memory
from trainplan.model.arch import resolve_model
from trainplan.model.base import ConfigError
from trainplan.model.efficiency import Efficiency
from trainplan.model.hardware import ClusterSpec
from trainplan.model.layout import Layout
from trainplan.model.training import TrainingSpec
from trainplan.proxy.model import Transformer
from trainplan.proxy.parallelize import apply_ac, apply_fsdp

GiB = 1024**3


def fakemem(model: str, *, world: int = 32, seq_len: int = 4096, micro_batch: int = 1, dtype: str = "bf16",
            recompute: str = "none", device: str = "cuda") -> dict[str, Any]:
    """Peak bytes per category and phase on rank 0 of a fake ``world``-rank FSDP2 full-shard run."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore


    spec = resolve_model(model)
    if world < 1:
        raise ConfigError("world", world, "a positive integer")
    if seq_len > spec.max_seq_len:
        raise ConfigError("seq_len", seq_len, f"≤ max_seq_len={spec.max_seq_len}")
    dev_type = device if device == "cpu" or torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        mesh = init_device_mesh(dev_type, (world,), mesh_dim_names=("dp_shard",))
        with FakeTensorMode():
            with torch.device(dev_type):
                m = Transformer(spec)
            apply_ac(m, recompute)
            apply_fsdp(m, mesh, reshard_after_forward=True, bf16=dtype == "bf16")
            opt = torch.optim.AdamW(m.parameters(), lr=1e-4, foreach=False)  # foreach temporaries would dominate the peak
            tokens = torch.randint(0, spec.vocab, (micro_batch, seq_len + 1), device=dev_type)
            tracker = FSDPMemTracker(m, opt)
            tracker.track_inputs((tokens,))
            with tracker:
                for it in range(2):  # iteration 2 has the optimizer states: the steady-state peak
                    logits = m(tokens[:, :-1])
                    loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
                    if it == 0:
                        tracker.reset_mod_stats()
            snap = tracker.get_tracker_snapshot("peak")
    finally:
        if created:
            dist.destroy_process_group()
    per_dev = {str(d): {str(getattr(k, "name", k)).lower(): int(v) for k, v in cats.items()} for d, cats in snap.items()}
    peak_total = max((c.get("total", 0) for c in per_dev.values()), default=0)
    layout = Layout(dp=world, sharding="zero3", recompute=recompute, micro_batch=micro_batch)
    return {"model": spec.name, "world": world, "seq_len": seq_len, "micro_batch": micro_batch, "dtype": dtype,
            "recompute": recompute, "device_type": dev_type, "peak_bytes_by_category": per_dev,
            "peak_total_bytes": peak_total, "seconds": time.perf_counter() - t0,
            "analytic": _analytic(spec, layout, seq_len, dtype)}


def _analytic(spec: Any, layout: Any, seq_len: int, dtype: str) -> dict[str, Any] | None:
    cluster = ClusterSpec(nodes=max(1, layout.dp // 8), gpus_per_node=min(8, layout.dp), gpu="h100-sxm-80gb")
    training = TrainingSpec(seq_len=seq_len, global_batch=layout.dp * layout.micro_batch,
                            precision="bf16" if dtype == "bf16" else "fp32")
    bd = memory.memory_breakdown(spec, cluster, training, layout, Efficiency())
    return {k: float(v) for k, v in bd.items()}


def format_fakemem(res: dict[str, Any]) -> str:
    """A short human-readable comparison (GiB)."""
    lines = [f"FSDPMemTracker: {res['model']} on {res['world']} fake ranks, seq {res['seq_len']}, "
             f"mb {res['micro_batch']}, {res['dtype']}, recompute={res['recompute']} ({res['seconds']:.1f} s)"]
    for dev, cats in res["peak_bytes_by_category"].items():
        lines.append(f"  peak on {dev}: " + ", ".join(f"{k} {v / GiB:.2f}" for k, v in cats.items()) + " GiB")
    if res.get("analytic"):
        lines.append("  analytic: " + ", ".join(f"{k} {v / GiB:.2f}" for k, v in res["analytic"].items()) + " GiB")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainplan proxy fakemem",
                                description="FSDPMemTracker on a fake N-rank world (FakeTensorMode; no GPU).",
                                epilog="example: trainplan proxy fakemem --model llama2-13b --world 32 --seq-len 4096 --mb 1")
    p.add_argument("--model", default="llama2-13b", help="preset name or config.json")
    p.add_argument("--world", type=int, default=32, help="simulated ranks (FSDP full shard)")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--mb", type=int, default=1, help="micro-batch (sequences per rank)")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--recompute", choices=("none", "full"), default="none")
    p.add_argument("--out", help="write the result JSON here")
    return p


def main(argv: list[str]) -> int:
    """``trainplan proxy fakemem …`` (``argv`` after ``fakemem``): print the comparison, write it with ``--out``."""
    a = _parser().parse_args(argv)
    res = fakemem(a.model, world=a.world, seq_len=a.seq_len, micro_batch=a.mb, dtype=a.dtype, recompute=a.recompute)
    if a.out:
        write_json(a.out, res)
    print(format_fakemem(res))
    return 0
