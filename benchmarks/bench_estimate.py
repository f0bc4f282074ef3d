"""What ``trainplan estimate`` costs (prints numbers; asserts nothing about speed).

Run: ``.venv/bin/python benchmarks/bench_estimate.py``. Two views:

* in process, the median of repeated calls: one ``estimate`` (a pinned micro-batch), ``fastest_micro_batch`` (the
  default ``--micro-batch auto``: one estimate per micro-batch tried) and the p10–p90 from the shipped held-out errors;
* the whole command in a fresh interpreter (imports included, what a user waits for), pinned against auto.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from trainplan.model.arch import resolve_model
from trainplan.model.efficiency import Efficiency
from trainplan.model.estimate import estimate, fastest_micro_batch
from trainplan.model.hardware import ClusterSpec, resolve_gpu
from trainplan.model.layout import Layout
from trainplan.model.training import TrainingSpec
from trainplan.published.intervals import family_class, throughput_interval


def median_s(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    model = resolve_model("llama2-13b")
    cluster = ClusterSpec(nodes=4, gpus_per_node=8, gpu=resolve_gpu("h100-sxm-80gb"))
    training = TrainingSpec(seq_len=4096, global_batch=256)
    layout = Layout(dp=32, sharding="zero2", micro_batch=1)
    eff = Efficiency.for_gpu(cluster.gpu)
    est = estimate(model, cluster, training, layout, eff)
    js = est.to_json()
    throughput_interval(js, cluster.gpu.generation, family_class(layout))  # warm: the lazy scipy.special import

    one = median_s(lambda: estimate(model, cluster, training, layout, eff), 200)
    auto = median_s(lambda: fastest_micro_batch(model, cluster, training, layout, eff), 50)
    tried = len(fastest_micro_batch(model, cluster, training, layout, eff)[1])
    iv = median_s(lambda: throughput_interval(js, cluster.gpu.generation, family_class(layout)), 200)
    print(f"in process (llama2-13b, 32×H100, ZeRO-2): estimate {one * 1e3:.2f} ms; fastest_micro_batch "
          f"{auto * 1e3:.2f} ms over {tried} micro-batches ({auto / one:.1f}× one estimate); interval {iv * 1e3:.2f} ms")

    base = [sys.executable, "-m", "trainplan.cli", "estimate", "--model", "llama2-13b", "--sharding", "zero2", "--json"]
    cold = {}
    for name, argv in (("--micro-batch 1", [*base, "--micro-batch", "1"]), ("auto (default)", base)):
        cold[name] = median_s(lambda a=argv: subprocess.run(a, check=True, capture_output=True), 5)
        print(f"whole command, fresh interpreter, {name}: {cold[name]:.2f} s (median of 5)")
    print(f"auto / pinned: {cold['auto (default)'] / cold['--micro-batch 1']:.2f}×")


if __name__ == "__main__":
    main()
