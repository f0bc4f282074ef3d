"""The import graph of src/trainplan: no cycle among module-level imports, the dependency directions of
docs/ARCHITECTURE.md ("Dependency directions"), no import of another module's private name, and every module
importable in a fresh interpreter in sorted and in reverse-sorted order."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[3] / "src" / "trainplan"

# Layers, lowest first: a module may import (at module level or inside a function) only modules of its own
# layer or a lower one. The same list is in docs/ARCHITECTURE.md; a new module gets a layer here.
LAYERS: list[tuple[str, set[str]]] = [
    ("leaves (standard library + third party only)",
     {"trainplan", "io", "pkgdata", "proxy", "proxy.procs", "proxy.slurm_resources", "report", "report.benchmarks", "report.headline",
      "model", "search", "published", "cost", "calibration", "prediction", "launch", "stages"}),
    ("specs", {"model.base", "model.arch", "model.hardware", "model.training", "model.layout"}),
    ("analytic core (no torch, no snakemake)",
     {"model.efficiency", "model.flops", "model.memory", "model.comm", "model.timing", "model.estimate",
      "search.layouts", "published.intervals", "published.tables", "published.fit", "config", "cost.budget", "cost.sensitivity", "provenance"}),
    ("harness, calibration, report, launch",
     {"proxy.aggregate", "proxy.command", "proxy.fakemem", "proxy.torchrun", "proxy.lora", "proxy.measure",
      "proxy.model", "proxy.parallelize", "proxy.analytic", "proxy.record", "proxy.run", "proxy.schema",
      "proxy.select", "proxy.worker", "calibration.fitting", "calibration.sources", "calibration.scaling", "calibration.gpu", "prediction.production", "launch.ingest",
      "report.labels", "report.figures", "report.memo", "launch.artifacts", "launch.trainers", "train_entry"}),
    ("preflight, subcommands", {"launch.preflight", "commands", "commands.common", "commands.estimate", "commands.plan",
                               "commands.validate"}),
    ("cli", {"cli"}),
    ("stages (the Snakemake glue, one module per rule: nothing in the package imports it)",
     {f"stages.{m}" for m in ("common", "analytic_model", "select_proxies", "proxy_run", "aggregate", "calibrate",
                              "fit_scaling", "predict_production", "cost_and_risk", "figures", "memo",
                              "launch_artifacts")}),
]
LAYER = {("trainplan" if m == "trainplan" else f"trainplan.{m}"): i for i, (_, ms) in enumerate(LAYERS) for m in ms}
CORE_MAX = 2  # layers 0..2 import neither torch nor snakemake, not even inside a function
# Private names still imported across modules: (importer, module, name). calibrate.py is owned elsewhere.
KNOWN_PRIVATE: set[tuple[str, str, str]] = set()


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _targets(cur: str, node: ast.Import | ast.ImportFrom) -> list[tuple[str, str | None]]:
    """(imported trainplan module, imported name or None) of one import statement; relative imports resolved."""
    if isinstance(node, ast.Import):
        return [(a.name, None) for a in node.names if a.name.split(".")[0] == "trainplan"]
    if node.level:
        base = cur.split(".") if MODULES[cur].name == "__init__.py" else cur.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        mod = ".".join(base + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
    if mod.split(".")[0] != "trainplan":
        return []
    return [((f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod), a.name) for a in node.names]


def _module_level(stmts: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported: not inside a def, not under ``if TYPE_CHECKING``."""
    out: list[ast.Import | ast.ImportFrom] = []
    for s in stmts:
        if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if isinstance(s, ast.Import | ast.ImportFrom):
            out.append(s)
        elif isinstance(s, ast.If) and "TYPE_CHECKING" in ast.unparse(s.test):
            continue
        elif isinstance(s, ast.ClassDef):
            out += _module_level(s.body)
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                sub = getattr(s, field, None)
                if isinstance(sub, list):
                    out += _module_level([h for h in sub if isinstance(h, ast.stmt)] if field != "handlers"
                                         else [b for h in sub for b in h.body])
    return out


def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]], list[tuple[str, str, str]], dict[str, set[str]]]:
    """(module-level edges, all edges, private-name imports, third-party top names imported) per module."""
    top: dict[str, set[str]] = {}
    every: dict[str, set[str]] = {}
    private: list[tuple[str, str, str]] = []
    external: dict[str, set[str]] = {}
    for m, p in MODULES.items():
        tree = ast.parse(p.read_text(), filename=str(p))
        nodes = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
        top[m] = {t for n in _module_level(tree.body) for t, _ in _targets(m, n) if t in MODULES and t != m}
        every[m] = {t for n in nodes for t, _ in _targets(m, n) if t in MODULES and t != m}
        private += [(m, t, name) for n in nodes for t, name in _targets(m, n)
                    if name and name.startswith("_") and not name.startswith("__") and t != m]
        external[m] = {a.name.split(".")[0] for n in nodes if isinstance(n, ast.Import) for a in n.names} | {
            (n.module or "").split(".")[0] for n in nodes if isinstance(n, ast.ImportFrom) and not n.level}
    return top, every, private, external


TOP, EVERY, PRIVATE, EXTERNAL = _graph()


def _lazy() -> set[tuple[str, str]]:
    """(importer, trainplan module) of every import statement inside a function."""
    out = set()
    for m, p in MODULES.items():
        tree = ast.parse(p.read_text(), filename=str(p))
        top = {id(n) for n in _module_level(tree.body)}
        out |= {(m, t) for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom) and id(n) not in top
                for t, _ in _targets(m, n) if t in MODULES and t != m}
    return out


LAZY = _lazy()


def _lazy_of(code: str, module: str = "trainplan.cli") -> set[tuple[str, str]]:
    """What :func:`_lazy` finds in ``code`` as if it were ``module`` (the detector's own check)."""
    tree = ast.parse(code)
    top = {id(n) for n in _module_level(tree.body)}
    return {(module, t) for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom) and id(n) not in top
            for t, _ in _targets(module, n) if t in MODULES and t != module}


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out


def test_the_graph_sees_the_package():
    assert {"trainplan.config", "trainplan.stages.memo", "trainplan.proxy.run"} <= set(MODULES)
    assert "trainplan.model.layout" in TOP["trainplan.config"]  # module level
    assert ("trainplan.cli", "trainplan.io") in _lazy_of("def f():\n    from trainplan.io import read_json\n")
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_no_cycle_among_module_level_imports():
    assert _cycles(TOP) == [], "module-level import cycle: move the shared helper to the lower module"


def test_no_cycle_even_through_function_level_imports():
    assert _cycles(EVERY) == []


def test_no_function_level_imports_of_trainplan_modules():
    # cli.py runs a subcommand module by name (importlib, cli.COMMANDS): `trainplan estimate` loads neither pandas
    # nor torch (tests/unit/package/test_cli.py::test_estimate_imports_no_torch_or_snakemake)
    assert set() == LAZY, f"import these at module level: {sorted(LAZY)}"


def test_every_module_has_a_layer():
    assert set(MODULES) == set(LAYER), f"give these a layer in LAYERS: {sorted(set(MODULES) ^ set(LAYER))}"


def test_dependency_directions():
    wrong = [f"{m} ({LAYERS[LAYER[m]][0]}) imports {t} ({LAYERS[LAYER[t]][0]})"
             for m in sorted(EVERY) for t in sorted(EVERY[m]) if LAYER[t] > LAYER[m]]
    assert not wrong, "\n".join(wrong)


def test_core_imports_neither_torch_nor_snakemake():
    bad = {m: sorted(EXTERNAL[m] & {"torch", "snakemake", "torchtitan", "accelerate", "transformers"})
           for m in MODULES if LAYER[m] <= CORE_MAX}
    assert not {m: b for m, b in bad.items() if b}


def test_no_private_names_imported_across_modules():
    assert set(PRIVATE) <= KNOWN_PRIVATE, sorted(set(PRIVATE) - KNOWN_PRIVATE)


@pytest.mark.parametrize("reverse", [False, True], ids=["sorted", "reverse-sorted"])
def test_every_module_imports_in_a_fresh_interpreter(reverse, tmp_path):
    order = sorted(MODULES, reverse=reverse)
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
    r = subprocess.run([sys.executable, "-c", code, *order], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]


def test_the_snakefile_parses_without_torch():
    """Every Snakemake call parses the Snakefile and its rules (each dry run, each Slurm job on its node): the
    trainplan modules they import load no torch (it took 1.7 s of every parse while the signal hook lived in
    proxy.torchrun, which then imported the ranks' code)."""
    root = PKG.parents[1]
    text = "\n".join(p.read_text() for p in [root / "Snakefile", *sorted((root / "rules").glob("*.smk"))])
    mods = sorted(set(re.findall(r"^(?:from|import) (trainplan(?:\.\w+)*)", text, re.M)))
    assert "trainplan.proxy.procs" in mods, mods  # the signal hook: what once pulled torch in
    code = ("import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
            "assert 'torch' not in sys.modules, [m for m in sys.modules if m.startswith('torch')][:5]\n")
    r = subprocess.run([sys.executable, "-c", code, *mods], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


def test_a_proxy_job_imports_torch_only_in_its_ranks():
    """The proxy_run stage and the launcher it calls (``trainplan proxy SPEC --out RECORD``) only start torchrun
    and read what the ranks wrote: importing torch there cost every proxy job 2–3 s before torchrun began."""
    code = ("import sys, trainplan.stages.proxy_run, trainplan.proxy.command, trainplan.proxy.torchrun\n"
            "assert 'torch' not in sys.modules, [m for m in sys.modules if m.startswith('torch')][:5]\n"
            "import trainplan.proxy.worker\nassert 'torch' in sys.modules  # the ranks' entry: the check sees torch\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
