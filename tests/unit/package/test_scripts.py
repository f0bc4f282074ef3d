"""The README's entry scripts: a missing --configfile is one line before anything runs, and a venv set up with a
CUDA torch keeps it through study.sh / test.sh (which call setup.sh without TRAINPLAN_TORCH)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("args", [["--configfile", "config/nope.yaml"],
                                  ["--configfile", "config/lora.yaml", "config/nope.yaml"],
                                  ["--configfile=config/nope.yaml"]])
def test_study_sh_names_a_missing_configfile_before_setup_or_snakemake(tmp_path, args):
    """It printed Snakemake's 30-line traceback ending in FileNotFoundError."""
    r = subprocess.run(["bash", str(ROOT / "scripts" / "study.sh"), *args], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == "study: --configfile config/nope.yaml: no such file"
    assert r.stdout == ""  # neither setup.sh nor snakemake ran


@pytest.mark.parametrize(("flavour", "env", "reinstalls"), [("cuda", {}, False), ("cpu", {}, False),
                                                           ("cuda", {"TRAINPLAN_TORCH": "cpu"}, True)])
def test_setup_sh_keeps_the_venvs_torch_flavour_unless_told(tmp_path, flavour, env, reinstalls):
    """study.sh and test.sh call setup.sh without TRAINPLAN_TORCH; it used to mean cpu, so after
    `TRAINPLAN_TORCH=cuda ./scripts/setup.sh` the next study.sh silently put the CPU wheel back. A stamp that
    matches runs nothing; a mismatch reaches the venv step, where a stub python3 stops it."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(ROOT / "envs", tmp_path / "envs")
    (tmp_path / ".venv").mkdir()
    # the stamp hashes pyproject.toml and the env files' pins (setup.sh installs those versions)
    pinned = b"".join(p.read_bytes() for p in [ROOT / "pyproject.toml", *sorted((ROOT / "envs").glob("*.yaml"))])
    digest = hashlib.sha256(pinned).hexdigest()[:16]
    stamp = f"{digest} dev,workflow,launch torch-{flavour}\n"
    (tmp_path / ".venv" / ".trainplan-setup").write_text(stamp)
    stub = tmp_path / "bin"
    stub.mkdir()
    for tool in ("python3", "dpkg"):  # dpkg: every system package "installed", so no apt-get
        (stub / tool).write_text("#!/bin/sh\n" + ("exit 0\n" if tool == "dpkg" else "echo stub-python3 >&2; exit 97\n"))
        (stub / tool).chmod(0o755)
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINPLAN_")}
    run_env |= {"PATH": f"{stub}:{os.environ['PATH']}", **env}
    r = subprocess.run(["bash", "scripts/setup.sh"], cwd=tmp_path, env=run_env, capture_output=True, text=True,
                       timeout=60)
    if reinstalls:
        assert r.returncode == 97 and "stub-python3" in r.stderr, r.stderr
    else:
        assert r.returncode == 0, r.stderr
        assert (tmp_path / ".venv" / ".trainplan-setup").read_text() == stamp
