"""The conda env files (envs/*.yaml, used with --use-conda) pin exactly what the tested .venv has installed."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
ENVS = sorted((ROOT / "envs").glob("*.yaml"))


def _pins(env: Path) -> dict[str, str]:
    deps = yaml.safe_load(env.read_text())["dependencies"]
    pip = next(d["pip"] for d in deps if isinstance(d, dict) and "pip" in d)
    return dict(p.split("==", 1) for p in pip if not p.startswith("-e"))


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower()


@pytest.mark.parametrize("env", ENVS, ids=lambda p: p.name)
def test_every_python_package_is_pinned_to_the_installed_version(env):
    deps = yaml.safe_load(env.read_text())["dependencies"]
    pip = next(d["pip"] for d in deps if isinstance(d, dict) and "pip" in d)
    assert all("==" in p for p in pip if not p.startswith("-e")), pip  # no lower bounds only
    for name, pinned in _pins(env).items():
        try:
            installed = version(name)
        except PackageNotFoundError:
            pytest.fail(f"{env.name}: {name} is pinned but not installed here")
        assert installed.split("+")[0] == pinned, (env.name, name, installed, pinned)  # torch 2.13.0+cpu


@pytest.mark.parametrize("env", ENVS, ids=lambda p: p.name)
def test_env_covers_the_package_dependencies(env):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    needed = {_name(r) for r in project["dependencies"]}
    if "proxy" in env.stem:
        needed |= {_name(r) for r in project["optional-dependencies"]["proxy"]}
    assert needed <= {n.lower() for n in _pins(env)}, needed - {n.lower() for n in _pins(env)}
