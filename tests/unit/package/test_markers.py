"""Every test module that starts the real local Slurm cluster (tests/slurm/cluster.py ``local_slurm``) is marked
``slurm`` and ``slow`` for the whole module, so ``pytest -m "not slow"`` (and ``-m "not slurm"``) never starts
slurmctld/slurmd/munged; both markers are registered (pyproject.toml). Static: reads the files, imports none."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]


def _module_marks(tree: ast.Module) -> set[str]:
    """Marker names in the module-level ``pytestmark`` (a single mark or a list/tuple of them)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            vals = node.value.elts if isinstance(node.value, ast.List | ast.Tuple) else [node.value]
            return {v.attr for v in vals if isinstance(v, ast.Attribute)}
    return set()


def _starts_real_slurm(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None)) == "local_slurm"
               for n in ast.walk(tree))


def test_every_real_slurm_test_module_is_marked_slurm_and_slow():
    real = {p.name: _module_marks(t) for p in sorted(TESTS.rglob("test_*.py"))
            if _starts_real_slurm(t := ast.parse(p.read_text(encoding="utf-8")))}
    assert {"test_slurm_e2e.py", "test_slurm_multinode.py", "test_launch_slurm.py"} <= set(real), real
    assert {n: m for n, m in real.items() if not {"slurm", "slow"} <= m} == {}


def test_slurm_and_slow_markers_are_registered():
    ini = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert {m.split(":")[0] for m in ini["markers"]} >= {"slurm", "slow"}
