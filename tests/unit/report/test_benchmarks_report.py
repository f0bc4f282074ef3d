"""benchmarks_report: Snakemake `benchmark:` TSVs → rows {rule, wall_s, max_rss_mb, cpu_s} for the memo."""

from __future__ import annotations

import pytest

from trainplan.report.benchmarks import benchmark_rows, benchmark_summary

HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def _tsv(path, *rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER + "".join("\t".join(map(str, r)) + "\n" for r in rows))
    return path


@pytest.fixture
def bench(tmp_path):
    b = tmp_path / "benchmarks"
    _tsv(b / "analytic_model.tsv", (2.04, "0:00:02", 152.70, 1347.83, 66.05, 90.77, 0.04, 0.00, 28.06, 0.81))
    _tsv(b / "calibrate.tsv", (102.30, "0:01:42", 193.04, 1530.61, 88.79, 120.09, 0.0, 0.01, 26.91, 27.63))
    _tsv(b / "proxy_run" / "depth-L1.tsv", (15.69, "0:00:15", 1075.90, 3410.67, 613.61, 787.81, 1.78, 0.07, 95.94, 17.57))
    _tsv(b / "proxy_run" / "width-h64.tsv", (20.99, "0:00:20", 1079.77, 3413.78, 617.26, 773.65, 0.29, 0.08, 72.98, 18.51))
    # repeat("...", 3): three rows, the median is reported; "-" (not measured) is None
    _tsv(b / "figures.tsv", (10, "0:00:10", "-", 1, 1, 1, 0, 0, 1, 3), (12, "0:00:12", "-", 1, 1, 1, 0, 0, 1, 4),
         (30, "0:00:30", "-", 1, 1, 1, 0, 0, 1, 5))
    (b / "empty.tsv").write_text("")
    return b


def test_rows_from_the_benchmark_tsvs(bench):
    rows = benchmark_rows([bench / "analytic_model.tsv", bench / "proxy_run" / "depth-L1.tsv",
                           bench / "missing.tsv", bench / "empty.tsv", bench / "figures.tsv"])
    assert rows == [
        {"rule": "analytic_model", "wall_s": 2.04, "max_rss_mb": 152.70, "cpu_s": 0.81},
        {"rule": "proxy_run depth-L1", "wall_s": 15.69, "max_rss_mb": 1075.90, "cpu_s": 17.57},
        {"rule": "figures", "wall_s": 12.0, "max_rss_mb": None, "cpu_s": 4.0},
    ]
    assert [r["rule"] for r in benchmark_rows(bench)] == [  # a directory: every TSV under it, sorted
        "analytic_model", "calibrate", "figures", "proxy_run depth-L1", "proxy_run width-h64"]


def test_summary_folds_the_proxies_into_one_line(bench):
    s = benchmark_summary(benchmark_rows(bench))
    assert [r["rule"] for r in s["rows"]] == ["analytic_model", "calibrate", "figures",
                                              "proxy_run x2 (slowest: width-h64, 21.0 s)"]
    proxies = s["rows"][-1]
    assert proxies["wall_s"] == pytest.approx(15.69 + 20.99) and proxies["max_rss_mb"] == 1079.77
    assert s["total_wall_s"] == pytest.approx(2.04 + 102.30 + 12.0 + 15.69 + 20.99) and s["n_files"] == 5
    assert benchmark_summary([]) == {"rows": [], "total_wall_s": 0, "n_files": 0}


def test_the_memo_template_shows_the_table_once_the_context_has_it(bench):
    """report/templates/memo.html.j2: Appendix D appears only with a `benchmarks` context key."""
    from pathlib import Path

    from trainplan.report import memo

    ctx = memo.build_context(memo.memo_inputs(Path(__file__).resolve().parents[2] / "fixtures" / "results_min"),
                             config={"study": {"name": "x"}},
                             study_hash="5f" * 32, git_commit="c" * 40)
    assert "sec-benchmarks" not in memo.render_html(ctx)
    html = memo.render_html({**ctx, "benchmarks": benchmark_summary(benchmark_rows(bench))})
    table = html[html.index('id="sec-benchmarks"'):]
    assert "calibrate</td><td>102.3" in table and "proxy_run x2 (slowest: width-h64, 21.0 s)" in table, table
