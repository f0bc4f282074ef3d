"""Every file a rule's code reads is a declared input of that rule, read from the path the rule gives it (issue 11).

The complete results tree is the session's tiny study (``snakemake --cores 2 --configfile config/tiny.yaml``, the
``tiny_study`` fixture; its two proxy runs are real CPU runs). Then each rule of ``rules/*.smk``
(``scripts/rule_io.py``) runs in a fresh directory that holds ONLY its declared inputs, copied from that tree: it
must succeed and write, in this process (``trainplan.stages.<rule>.run``), the bytes Snakemake's run wrote. A stage
that finds a file by walking from one input to its neighbours (``Path(inp["cost"]).parent.parent / ...``) fails here.

``proxy_run`` is not rerun on its own (a real torch run; it reads only ``proxy_set``). Package data (the published
tables) stays where it is. The committed GPU records (``data/calibration/...``) are copied like any other input, to
the relative paths the rule gives them: the calibrate stage opens their directory by the config's relative path.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from trainplan.config import config_slice, load_config
from trainplan.io import read_json

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from rule_io import gpu_record_files, rule_io  # noqa: E402

TINY = [str(ROOT / "config" / "config.yaml"), str(ROOT / "config" / "tiny.yaml")]
ORDER = ("analytic_model", "select_proxies", "proxy_run", "aggregate", "calibrate", "fit_scaling",
         "predict_production", "cost_and_risk", "launch_artifacts", "figures", "memo")
IO = rule_io()
RULES = sorted(r for r in IO if r != "proxy_run")

pytestmark = pytest.mark.slow


@contextmanager
def _cwd(d: Path) -> Iterator[None]:
    old = os.getcwd()
    os.chdir(d)
    try:
        yield
    finally:
        os.chdir(old)


def _ids(work: Path) -> list[str]:
    return [p["id"] for p in read_json(work / "results/proxies/proxy_set.json")["proxies"]]


def _resolve(value: str, study: Path, raw: dict, wildcards: dict | None = None) -> str | list[str]:
    """A rule_io value as the path(s) Snakemake would give the rule, relative to the working dir. The input
    functions read the select_proxies checkpoint's output of the ``study`` tree (as Snakemake does: the
    rule itself need not declare proxy_set.json)."""
    if value == "<proxy_records>":  # rules/common.smk: proxy_records
        return [f"results/proxies/runs/{i}.json" for i in _ids(study)]
    if value == "<benchmark_files>":  # rules/common.smk: benchmark_files, BENCHMARKED
        return [f"results/benchmarks/{r}.tsv" for r in ("analytic_model", "calibrate", "cost_and_risk", "figures")] + [
            f"results/benchmarks/proxy_run/{i}.tsv" for i in _ids(study)]
    if value == "<PUBLISHED>":
        from trainplan import pkgdata

        return sorted(str(p) for p in pkgdata.path(pkgdata.DATA).glob("*.csv"))
    if value in ("<GPU_RECORDS>", "<GPU_CHECK>"):  # rules/common.smk: GPU_RECORDS, GPU_CHECK
        # relative to the working dir, as common.smk globs them there (the study tree is a workflow copy: data/)
        files = gpu_record_files(value.strip("<>"), raw, study)
        return [os.path.relpath(f, study) if Path(f).is_relative_to(study) else f for f in files]
    path = value.replace("{R}", "results")
    for k, v in (wildcards or {}).items():
        path = path.replace("{" + k + "}", v)
    return path


def _files(v: str | list[str]) -> list[str]:
    return list(v) if isinstance(v, list) else [v]


def _run(rule: str, work: Path, raw: dict, study: Path, drop: tuple[str, ...] = ()) -> dict:
    """Run the stage of ``rule`` in ``work`` with its declared inputs (less ``drop``) and outputs; ``study``: the
    tree whose proxy set names the proxy records (every rule here but ``proxy_run``, which takes an ``{id}``)."""
    inp = {k: _resolve(v, study, raw) for k, v in IO[rule]["input"].items() if k not in drop}
    out = {k: _resolve(v, study, raw) for k, v in IO[rule]["output"].items()}
    with _cwd(work):
        for v in out.values():
            for f in _files(v):
                Path(f).parent.mkdir(parents=True, exist_ok=True)
        importlib.import_module(f"trainplan.stages.{rule}").run(inp, out, config_slice(raw, rule))
    return out


@pytest.fixture(scope="module")
def study(tiny_study) -> dict:
    """The tiny study's complete results tree: the session's one Snakemake run (``tests/integration/conftest.py``),
    read, never changed. Its ``benchmark:`` TSVs are the ones Snakemake wrote."""
    return {"raw": load_config(TINY).raw, "work": tiny_study[0]}


def _copy_declared(rule: str, study: dict, dest: Path, drop: tuple[str, ...] = ()) -> None:
    """Copy the declared input files of ``rule`` (less ``drop``) from the study into ``dest``, each with its
    provenance sidecar (``stage.main`` verifies inputs against it). A directory input: the directory. The launch
    manifest: with the files it lists next to it (the launch_artifacts rule's output set: the sbatch file's name
    depends on the cluster, so the rule declares only the manifest)."""
    from trainplan.report.memo import launch_files

    src = study["work"]
    for k, v in IO[rule]["input"].items():
        if k in drop:
            continue
        for f in _files(_resolve(v, src, study["raw"])):
            if Path(f).is_absolute():
                assert Path(f).exists(), f  # package data: read in place
                continue
            a = src / f
            assert a.exists(), f"{rule}: declared input {f} was not produced by the study"
            if v == "{R}/launch/manifest.json":
                extra = launch_files(a)
                assert extra, "the study's manifest lists no launch files"
            else:
                extra = []
            for q in [a, *extra]:
                b = dest / q.relative_to(src)
                b.parent.mkdir(parents=True, exist_ok=True)
                if q.is_dir():
                    shutil.copytree(q, b)
                    continue
                shutil.copy2(q, b)
                sc = q.with_name(q.name + ".provenance.json")
                if sc.exists():
                    shutil.copy2(sc, b.with_name(b.name + ".provenance.json"))


def test_the_study_tree_has_every_declared_output(study):
    for rule in ORDER:
        for v in IO[rule]["output"].values():
            if "{id}" in v:
                for i in _ids(study["work"]):
                    assert (study["work"] / _resolve(v, study["work"], study["raw"], {"id": i})).exists()
            else:
                assert (study["work"] / _resolve(v, study["work"], study["raw"])).exists(), (rule, v)


def _outputs(rule: str, work: Path, raw: dict) -> dict[str, bytes]:
    """Every file of the declared outputs of ``rule`` (a directory: its files) and their sidecars, by path."""
    files: dict[str, bytes] = {}
    for v in IO[rule]["output"].values():
        for f in _files(_resolve(v, work, raw)):
            p = work / f
            for q in sorted(p.rglob("*")) if p.is_dir() else [p, p.with_name(p.name + ".provenance.json")]:
                if q.is_file() and q.name != ".snakemake_timestamp":
                    files[str(q.relative_to(work))] = q.read_bytes()
    return files


@pytest.mark.parametrize("rule", RULES)
def test_each_stage_runs_with_only_its_declared_inputs(rule, study, tmp_path):
    """Only the declared inputs present: the stage succeeds and writes exactly what it wrote in the full tree
    (a file it found outside its inputs would be missing here: an error, or different bytes)."""
    work = tmp_path / "work"
    work.mkdir()
    _copy_declared(rule, study, work)
    _run(rule, work, study["raw"], study["work"])
    got, want = _outputs(rule, work, study["raw"]), _outputs(rule, study["work"], study["raw"])
    assert want and sorted(got) == sorted(want), rule
    differ = [f for f in want if got[f] != want[f]]
    assert not differ, f"{rule}: outputs differ from the full tree's: {differ}"


@pytest.mark.parametrize(("rule", "left_out"), [("memo", "candidates"), ("figures", "summary")])
def test_the_check_bites_an_undeclared_read(rule, left_out, study, tmp_path):
    """A file the stage reads but the rule does not declare (as the memo rule left out candidates.csv, the
    figures rule summary.json, before issue 11): absent here, so the output differs, and the test above fails."""
    work = tmp_path / "work"
    work.mkdir()
    _copy_declared(rule, study, work, drop=(left_out,))
    _run(rule, work, study["raw"], study["work"], drop=(left_out,))
    got, want = _outputs(rule, work, study["raw"]), _outputs(rule, study["work"], study["raw"])
    assert [f for f in want if got.get(f) != want[f]]
