"""Shared integration fixtures: the tiny study, run once per test session through real Snakemake."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "slurm"))
from workflow_copy import copy_workflow, snakemake  # noqa: E402

TINY = ("--cores", "2", "--configfile", "config/tiny.yaml")


@pytest.fixture(scope="session")
def tiny_study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """``snakemake --cores 2 --configfile config/tiny.yaml`` end to end in a fresh copy of the workflow: the
    finished tree and the run. Read it, never change it: a test that reruns, edits or corrupts anything works on
    its own copy (``workflow_copy.clone_study``), which Snakemake finds as up to date as this one."""
    wf = copy_workflow(tmp_path_factory.mktemp("tiny_study"))
    r = snakemake(wf, *TINY, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return wf, r
