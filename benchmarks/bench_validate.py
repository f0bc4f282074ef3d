"""What the published-table check costs (prints numbers; asserts nothing about speed).

Run: ``.venv/bin/python benchmarks/bench_validate.py [--repeat N]``. ``trainplan validate --heldout`` refits each GPU
generation once per left-out table: scipy's least squares evaluates every table of the generation a few thousand
times (``published.tables.validate_all``), one ``timing.step_time`` per published row. Printed, median of N:

* one ``validate_all`` over every open table (what one residual evaluation of a refit costs);
* reading one table: the per-process parse (``_parsed_table``, uncached) against the copy ``load_table`` returns now;
* one row's ``step_time`` for a layout that keeps its states on the GPU and for one with FSDP2 CPU offload (only the
  latter sizes the host-side states: ``timing.fsdp_offload_pcie_mb_s``).
"""

from __future__ import annotations

import argparse
import statistics
import timeit

from trainplan.model.arch import resolve_model
from trainplan.model.hardware import ClusterSpec, resolve_gpu
from trainplan.model.layout import Layout
from trainplan.model.timing import step_time
from trainplan.model.training import TrainingSpec
from trainplan.published import tables


def median_s(fn, n: int) -> float:
    return statistics.median(timeit.repeat(fn, number=1, repeat=n))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=20, help="timed calls per figure (median)")
    n = ap.parse_args(argv).repeat
    rows = len(tables.validate_all())  # also warms the imports and the parse cache
    name = "torchtitan_h100_202412.csv"
    parse = median_s(lambda: tables._parsed_table.__wrapped__(name), n)
    copy = median_s(lambda: tables.load_table(name), n)
    model, training = resolve_model("llama2-13b"), TrainingSpec(seq_len=4096, global_batch=256)
    cluster = ClusterSpec(nodes=4, gpus_per_node=8, gpu=resolve_gpu("h100-sxm-80gb"))
    on_gpu = median_s(lambda: step_time(model, cluster, training, Layout(dp=32, sharding="zero3")), n)
    offload = median_s(lambda: step_time(model, cluster, training, Layout(dp=32, sharding="zero3", offload="cpu")), n)
    print(f"validate_all (every open table, {rows} rows): {1e3 * median_s(tables.validate_all, n):.1f} ms")
    print(f"read {name}: parse {1e3 * parse:.2f} ms, cached copy {1e3 * copy:.2f} ms ({parse / copy:.1f}x)")
    print(f"step_time, one layout: states on the GPU {1e3 * on_gpu:.2f} ms, FSDP2 CPU offload {1e3 * offload:.2f} ms")


if __name__ == "__main__":
    main()
