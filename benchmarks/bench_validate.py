"""What the published-table check costs (prints numbers; asserts nothing about speed).

Run: ``.venv/bin/python benchmarks/bench_validate.py [--repeat N]``. ``trainplan validate --heldout`` refits each GPU
generation once per left-out table: scipy's least squares evaluates every table of the generation a few thousand
times (``published.tables.validate_all``), one ``timing.step_time`` per published row. Printed, median of N:

* one ``validate_all`` over every open table (what one residual evaluation of a refit costs);
* reading one table: the per-process parse (``_parsed_table``, uncached) against the copy ``load_table`` returns now;
* one row's ``step_time`` for a layout that keeps its states on the GPU and for one with FSDP2 CPU offload (only the
  latter sizes the host-side states: ``timing.fsdp_offload_pcie_mb_s``);
* one residual evaluation of the H100 fit (its four tables) with and without torchtitan's memory rows (the fit reads
  throughput only: ``validate_all(memory_rows=False)``), and ``np.isin`` on one layout's sharding against
  ``timing._isin``;
* once, not repeated: the A100 fit that holds torchtitan_a100 out (its ``attn_eff`` is seen by no remaining row and is
  left out of the fit: ``fit._unidentified``; fitted, it ran ``least_squares`` to its 500-evaluation cap, ~147 s).
"""

from __future__ import annotations

import argparse
import statistics
import timeit

import numpy as np

from trainplan.model.arch import resolve_model
from trainplan.model.hardware import ClusterSpec, resolve_gpu
from trainplan.model.layout import Layout
from trainplan.model.timing import _isin, step_time
from trainplan.model.training import TrainingSpec
from trainplan.published import fit, tables


def median_s(fn, n: int) -> float:
    return statistics.median(timeit.repeat(fn, number=1, repeat=n))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=20, help="timed calls per figure (median)")
    ap.add_argument("--skip-refit", action="store_true", help="leave out the one timed refit (~5 s)")
    args = ap.parse_args(argv)
    n = args.repeat
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
    h100 = fit.GEN_FIT["h100"]["tables"]
    with_mem = median_s(lambda: tables.validate_all(tables=h100), n)
    without = median_s(lambda: tables.validate_all(tables=h100, memory_rows=False), n)
    print(f"validate_all, the H100 fit's tables: with memory rows {1e3 * with_mem:.1f} ms, throughput only "
          f"{1e3 * without:.1f} ms ({with_mem / without:.2f}x)")
    opts = ("zero3", "hsdp")
    numpy_isin = median_s(lambda: [np.isin("zero2", opts) for _ in range(1000)], n) / 1000
    scalar_isin = median_s(lambda: [_isin("zero2", opts) for _ in range(1000)], n) / 1000
    print(f"isin on one layout's sharding: np.isin {1e6 * numpy_isin:.1f} us, timing._isin {1e6 * scalar_isin:.2f} us "
          f"({numpy_isin / scalar_isin:.0f}x)")
    if args.skip_refit:
        return
    a100 = tuple(t for t in fit.GEN_FIT["a100"]["tables"] if t != "torchtitan_a100")
    once = timeit.timeit(lambda: fit.fit_generation("a100", a100), number=1)
    print(f"refit A100 without torchtitan_a100 (attn_eff unseen, not fitted): {once:.1f} s, once")


if __name__ == "__main__":
    main()
