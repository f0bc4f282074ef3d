"""benchmarks/bench_study_search.py: a run on the LoRA study (the smallest feasible table) prints one row of figures,
and its row-by-row references agree with the vectorised runner-up, check 2's filter and the ranking it times (it
asserts so)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("bench_study_search", ROOT / "benchmarks" / "bench_study_search.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)  # type: ignore[union-attr]


def test_the_benchmark_times_a_study_and_checks_the_vectorised_forms(capsys):
    bench.main(["lora.yaml"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["study", "rows", "feasible"] and len(out) == 2
    row = out[1].split()
    assert row[0] == "lora" and row[4].endswith("ms") and row[6].endswith("x") and row[10].endswith("s")
    assert row[-3].endswith("s") and row[-2].endswith("s") and row[-1].endswith("x")  # tie_order, its earlier form
