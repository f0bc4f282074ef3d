"""Layouts evaluated per second by ``trainplan.search.layouts.search`` (prints numbers; asserts nothing about speed).

Run: ``.venv/bin/python benchmarks/bench_search.py``. The grid is Llama-2-70B on 128 H100s with the full
option set, which enumerates more than 100,000 layouts.
"""

from __future__ import annotations

import time

from trainplan.model.arch import resolve_model
from trainplan.model.efficiency import Efficiency
from trainplan.model.hardware import ClusterSpec, resolve_gpu
from trainplan.model.training import TrainingSpec
from trainplan.search.layouts import search


def main() -> None:
    model = resolve_model("llama2-70b")
    cluster = ClusterSpec(nodes=16, gpus_per_node=8, gpu=resolve_gpu("h100-sxm-80gb"))
    training = TrainingSpec(seq_len=4096, global_batch=1024)
    opts = {"micro_batch": [1, 2, 4, 8, 16, 32], "pp": [1, 2, 4, 8, 16], "cp": [1, 2, 4, 8]}
    for _ in range(2):  # the first run includes imports and caches
        t0 = time.perf_counter()
        df = search(model, cluster, training, Efficiency(), opts)
        dt = time.perf_counter() - t0
    print(f"{len(df):,} layouts ({int(df['feasible'].sum()):,} feasible) in {dt:.2f} s = {len(df) / dt:,.0f} layouts/s")


if __name__ == "__main__":
    main()
