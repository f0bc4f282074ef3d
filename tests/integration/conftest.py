"""Shared integration fixtures: the tiny study, run once per test session through real Snakemake."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "slurm"))
from workflow_copy import copy_workflow, snakemake  # noqa: E402

TINY = ("--cores", "2", "--configfile", "config/tiny.yaml")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slurm`` run once more after a failure (pytest-rerunfailures; ``R`` in the summary, the first
    failure's report printed): they start real daemons (munged, slurmctld, slurmd) on a shared machine, and one of
    them (the requeue test) once waited out its 400 s in CI for a requeued job that never ran, which no run here
    reproduces (its failure message now prints Slurm's own view of the job). A second failure fails."""
    for item in items:
        if item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.flaky(reruns=1, reruns_delay=5))


_RERUN_FAILURES: list[tuple[str, str]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Keep the failure of an attempt that was rerun: pytest-rerunfailures lists only its name."""
    if report.outcome == "rerun":
        _RERUN_FAILURES.append((report.nodeid, report.longreprtext))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print each rerun attempt's failure (message, Slurm's view of the job), whatever the rerun's outcome."""
    for nodeid, text in _RERUN_FAILURES:
        terminalreporter.write_sep("=", f"failed attempt, rerun: {nodeid}")
        terminalreporter.write_line(text[-8000:])


@pytest.fixture(scope="session")
def tiny_study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """``snakemake --cores 2 --configfile config/tiny.yaml`` end to end in a fresh copy of the workflow: the
    finished tree and the run. Read it, never change it: a test that reruns, edits or corrupts anything works on
    its own copy (``workflow_copy.clone_study``), which Snakemake finds as up to date as this one."""
    wf = copy_workflow(tmp_path_factory.mktemp("tiny_study"))
    r = snakemake(wf, *TINY, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return wf, r
