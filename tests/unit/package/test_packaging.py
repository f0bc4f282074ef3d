"""Packaging: package data found with importlib.resources (one file per resource, no drifting copy), and the
built wheel, installed outside the checkout, runs `trainplan plan` and `trainplan estimate`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from trainplan import pkgdata

ROOT = Path(__file__).resolve().parents[3]
PKG = ROOT / "src" / "trainplan"
# package resource → the repository file it is (a symlink in the checkout: users edit config/ and report/)
LINKED = {pkgdata.DEFAULT_CONFIG: "config/config.yaml", pkgdata.MEMO_TEMPLATE: "report/templates/memo.html.j2",
          pkgdata.MEMO_CSS: "report/templates/memo.css"}
SHIPPED = [pkgdata.SCHEMA, *LINKED, "templates/sbatch.sh.j2", "templates/torchrun.sh.j2", "trainplan.mplstyle",
           "data/efficiency_fits.json", "data/SOURCES.md"]


def test_package_data_found_through_importlib_resources():
    for name in SHIPPED:
        assert pkgdata.path(name).is_file(), name
    assert sorted(p.name for p in (PKG / "data").glob("*.csv")), "published tables"


@pytest.mark.parametrize("name", sorted(LINKED))
def test_linked_resources_are_one_file_not_copies(name):
    """The package's default config and memo template/CSS are the repository's files (symlinks): nothing to
    keep in sync; the memo rule declares the report/ paths it passes to render_memo."""
    p = PKG / name
    assert p.is_symlink(), f"{p} must be a symlink to {LINKED[name]}, not a copy"
    assert p.resolve() == (ROOT / LINKED[name]).resolve()
    if name.startswith("templates/memo"):
        assert f'"{LINKED[name]}"' in (ROOT / "rules" / "report.smk").read_text()


def test_schema_has_one_home():
    """The schema lives in the package only; the Snakefile validates against the same file as load_config."""
    assert not (ROOT / "config" / "config.schema.yaml").exists()
    assert "schema_path()" in (ROOT / "rules" / "common.smk").read_text()


def test_no_checkout_relative_paths_in_the_package():
    """Nothing in src/trainplan finds files relative to the repository (parents[2] of a module)."""
    offenders = [f"{p.relative_to(ROOT)}:{i}" for p in sorted(PKG.rglob("*.py"))
                 for i, line in enumerate(p.read_text().splitlines(), 1)
                 if re.search(r"parents\[\d\]|REPO_ROOT", line) and not line.lstrip().startswith("#")]
    assert not offenders, offenders


def _build_wheel(tmp: Path) -> Path:
    """Build from a copy of the package sources with the symlinks dereferenced (a clean tree: no stale build/
    of the checkout leaks into the wheel, and the checkout is not written to)."""
    src = tmp / "src_copy"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(PKG, src / "src" / "trainplan", symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    dist = tmp / "dist"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                        "--no-index", "-w", str(dist), "-q"], capture_output=True, text=True, timeout=600, cwd=tmp)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (wheel,) = dist.glob("trainplan-*.whl")
    return wheel


@pytest.mark.slow
def test_wheel_installed_outside_the_checkout_runs_plan_and_estimate(tmp_path):
    wheel = _build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in SHIPPED:
        assert f"trainplan/{name}" in names, name
    # a fresh venv (no pip, no trainplan) that sees this venv's third-party packages through a .pth path line
    # (nested .pth files, the editable install's among them, are not processed: the checkout stays invisible)
    venv = tmp_path / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "_trainplan_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q",
                        str(wheel)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), cwd=work, env=env, capture_output=True, text=True, timeout=300)

    r = run(str(py), "-c", "import trainplan, trainplan.pkgdata as d; print(trainplan.__file__); "
                           "print(all(d.path(n).is_file() and not d.path(n).is_symlink() for n in "
                           f"{SHIPPED!r}))")
    assert r.returncode == 0, r.stderr
    where, ok = r.stdout.split()
    assert Path(where).is_relative_to(venv) and ok == "True", r.stdout
    trainplan = str(venv / "bin" / "trainplan")
    r = run(trainplan, "plan", "--top", "3")  # the embedded default study (package data)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "llama2-13b" in r.stdout.lower() and "feasible" in r.stdout, r.stdout[-3000:]
    r = run(trainplan, "estimate", "--model", "llama2-13b", "--gpus", "32", "--seq-len", "4096", "--global-batch",
            "256", "--sharding", "zero3", "--json")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert json.loads(r.stdout)["layout"]["sharding"] == "zero3"
    # the memo template and the schema parse from the installed copies
    r = run(str(py), "-c", "import jinja2, trainplan.pkgdata as d, trainplan.config as c; "
                           "jinja2.Environment().parse(d.path(d.MEMO_TEMPLATE).read_text()); "
                           "print(sorted(c.load_schema()['properties'])[:3])")
    assert r.returncode == 0, r.stderr[-3000:]
