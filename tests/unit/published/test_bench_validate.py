"""benchmarks/bench_validate.py runs and prints its figures; the cached table it times is a fresh copy."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from trainplan.published.tables import load_table

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("bench_validate", ROOT / "benchmarks" / "bench_validate.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)  # type: ignore[union-attr]


def test_the_benchmark_prints_validate_all_the_table_read_step_time_memory_rows_and_isin(capsys):
    bench.main(["--repeat", "1", "--skip-refit"])  # the refit is test_validate's (fit_generation)
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out] == ["validate_all", "read", "step_time,", "validate_all,", "isin"]
    assert out[0].endswith(" ms") and out[1].endswith("x)") and "FSDP2 CPU offload" in out[2]
    assert "throughput only" in out[3] and out[3].endswith("x)") and "timing._isin" in out[4]


def test_load_table_returns_a_copy_a_caller_may_change():
    name = "torchtitan_h100_202412.csv"
    t = load_table(name)
    first = t["model"].tolist()
    t["model"] = "changed"
    t["extra"] = 1
    again = load_table(name)
    assert "extra" not in again and again["model"].tolist() == first != t["model"].tolist()
