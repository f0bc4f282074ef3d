"""Helpers: copy the workflow into a temp dir, run Snakemake there, read the jobs a dry run plans."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
COPY = ("Snakefile", "rules", "workflow", "config", "profiles", "envs", "slurm", "data", "report")


def copy_workflow(dst: Path) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for name in COPY:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            shutil.copy2(src, dst / name)
    return dst


def snakemake(cwd: Path, *args: str, timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run Snakemake in ``cwd``: the real stages (no placeholders) on whatever config ``args`` name."""
    e = {**os.environ, **(env or {})}
    return subprocess.run([SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=e)


def planned_jobs(out: str) -> dict[str, int]:
    """{rule: count} from the 'Job stats' table of a (dry) run."""
    jobs: dict[str, int] = {}
    m = re.search(r"Job stats:\n.*?\n-+\s+-+\n(.*?)\ntotal", out, re.S)
    if not m:
        return jobs
    for line in m.group(1).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            jobs[parts[0]] = int(parts[1])
    return jobs


def clone_study(src: Path, dst: Path) -> Path:
    """A copy of a workflow tree that Snakemake has run (``results/`` and ``.snakemake/`` included, every file's
    modification time kept), so Snakemake finds it exactly as up to date as ``src``: tests that start from a
    finished study copy one run instead of repeating it."""
    shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
    return dst
