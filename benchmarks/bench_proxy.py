"""Harness overhead: proxy tokens/s (1 rank, debug preset) vs a plain single-process PyTorch loop.

Same model, batch, sequence, optimizer and thread count (OMP_NUM_THREADS=1, as the launcher sets).
The proxy's step 0 carries the instrumentation (FLOP counter, saved-tensor hooks, comm counter) and is
excluded by its warm-up, so the ratio measures the per-step overhead of the harness. Target ≥ 0.9.

    .venv/bin/python benchmarks/bench_proxy.py [--model debug-wide] [--seq-len 128] [--steps 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from trainplan.model.arch import resolve_model
from trainplan.proxy.model import build_model  # noqa: E402
from trainplan.proxy.run import synthetic_tokens  # noqa: E402
from trainplan.proxy.schema import normalize_run_spec  # noqa: E402
from trainplan.proxy.torchrun import launch  # noqa: E402


def plain_tokens_per_s(model: str, seq_len: int, batch: int, steps: int, warmup: int, lr: float = 3e-3) -> float:
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    spec = resolve_model(model)
    m = build_model(spec, seed=0)
    opt = torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=0.0)
    times = []
    for step in range(steps):
        x = synthetic_tokens(step, batch, seq_len, spec.vocab, 0)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for i in range(batch):  # micro-batch 1, like the proxy
            xi = x[i:i + 1]
            loss = F.cross_entropy(m(xi[:, :-1]).flatten(0, 1).float(), xi[:, 1:].flatten()) / batch
            loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return batch * seq_len / statistics.median(times[warmup:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="debug")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3, help="alternating repetitions; best of each is compared")
    a = ap.parse_args()
    spec = normalize_run_spec({"id": "bench", "model": a.model, "layout": {"dp": 1, "sharding": "none"},
                               "seq_len": a.seq_len, "global_batch": a.batch, "steps": a.steps,
                               "warmup": a.warmup, "nproc_per_node": 1, "timeout_s": 600})
    proxies, plains = [], []
    for _ in range(a.repeat):  # alternate, so load from other processes hits both alike
        plains.append(plain_tokens_per_s(a.model, a.seq_len, a.batch, a.steps, a.warmup))
        with tempfile.TemporaryDirectory() as d, open(os.devnull, "w") as null:
            rec, _ = launch(spec, Path(d) / "bench.json", log=null)
        proxies.append(rec["timing"]["tokens_per_s"])
    proxy, plain = max(proxies), max(plains)
    print(f"model {a.model} seq {a.seq_len} batch {a.batch}: proxy {proxy:,.0f} tok/s, plain loop {plain:,.0f} tok/s, "
          f"ratio {proxy / plain:.3f} (target ≥ 0.9)")


if __name__ == "__main__":
    main()
