"""Rerun the study's deterministic stages with this checkout's code on another run's proxy measurements, and
diff every result against that run: the proof that a refactor changed no result (issue 11).

    .venv/bin/python scripts/diff_results.py BASE_RESULTS [--configfile config/config.yaml ...] [--keep]

BASE_RESULTS is a ``results/`` tree (a variant's: ``results/lora`` with ``--configfile config/config.yaml
config/lora.yaml``; the rerun writes to the config's ``study.results_dir``) written by ``snakemake`` at another commit (e.g. a ``git worktree`` of the
previous commit: ``git worktree add /tmp/base HEAD~1 && (cd /tmp/base && PYTHONPATH=src snakemake --cores 2)``).
The proxy runs are measurements (CPU timings differ run to run), so they and the benchmark TSVs are copied from
BASE_RESULTS; every other rule is rerun here, in DAG order, through ``trainplan.stages.<rule>.run`` with the
inputs and outputs its rule declares (``scripts/rule_io.py``). Then each file is compared with BASE_RESULTS:

* bytes, after the module renames of the restructure (``RENAMES``) are applied to the base file: a result that
  names a module (``python -m trainplan.trainers`` in sbatch, ``trainplan.memory`` in the memo) names it where it
  now lives; nothing else may differ;
* provenance sidecars: as JSON, with the checkout's location masked in package-data paths; the sidecars of the
  rules in ``INPUTS_CHANGED`` (their declared inputs changed on purpose) may list other inputs, printed, but an
  input listed in both must have the same sha256;
* the PDF memo: its extracted text (pdftotext).

A file that differs only by the renames changes its sha256, which the memo and the sidecars print: those hashes
are mapped too. The commit printed is the base run's (``TRAINPLAN_GIT_COMMIT``), so the texts compare exactly.

Exit status 0 when everything matches; 1 with a list of differences otherwise.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import hashlib
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rule_io import ROOT, gpu_record_files, rule_io, smk_constant  # noqa: E402

from trainplan import pkgdata  # noqa: E402
from trainplan.config import config_slice, load_config  # noqa: E402

# old module → new module (issue 11's restructure, commit after 6cd9813)
RENAMES = {
    "trainplan.specs": "trainplan.model", "trainplan.efficiency": "trainplan.model.efficiency",
    "trainplan.flops": "trainplan.model.flops", "trainplan.memory": "trainplan.model.memory",
    "trainplan.comm": "trainplan.model.comm", "trainplan.timing": "trainplan.model.timing",
    "trainplan.estimate": "trainplan.model.estimate", "trainplan.search": "trainplan.search.layouts",
    "trainplan.validate": "trainplan.published.fit", "trainplan.cost": "trainplan.cost.budget",
    "trainplan.sensitivity": "trainplan.cost.sensitivity", "trainplan.calibrate": "trainplan.calibration.sources",
    "trainplan.calibrate_gpu": "trainplan.calibration.gpu",
    "trainplan.extrapolate": "trainplan.prediction.production", "trainplan.figures": "trainplan.report.figures",
    "trainplan.memo": "trainplan.report.memo", "trainplan.reportlabels": "trainplan.report.labels",
    "trainplan.benchmarks_report": "trainplan.report.benchmarks", "trainplan.launch": "trainplan.launch.artifacts",
    "trainplan.preflight": "trainplan.launch.preflight", "trainplan.trainers": "trainplan.launch.trainers",
    "trainplan.ingest": "trainplan.launch.ingest", "trainplan.slurm_resources": "trainplan.proxy.slurm_resources",
    "trainplan.proxy.launch": "trainplan.proxy.torchrun", "trainplan.proxy.cli": "trainplan.proxy.command",
}
# Rules whose declared inputs changed on purpose (issue 11 item 3: each rule declares every file its code reads):
# their sidecars' ``inputs`` lists may gain or lose entries; an input in both must have the same sha256.
INPUTS_CHANGED = ("figures", "memo")
ORDER = ("analytic_model", "select_proxies", "aggregate", "calibrate", "fit_scaling", "predict_production",
         "cost_and_risk", "launch_artifacts", "figures", "memo")
MEASURED = ("proxies/runs/", "benchmarks/", "logs/")
_CHECKOUT = re.compile(r'"/[^"]*?/src/trainplan/')  # package data named by absolute path
_DOTTED = re.compile(r"(?<![\w/.])trainplan(?:\.[A-Za-z_][A-Za-z_0-9]*)+")


# specs.py was split into model.arch / hardware / training / layout / base: a name it held goes where it now lives.
SPECS_SPLIT = ("trainplan.model.arch", "trainplan.model.hardware", "trainplan.model.training",
               "trainplan.model.layout", "trainplan.model.base")


def _specs_home(attr: str) -> str:
    for mod in SPECS_SPLIT:
        if hasattr(importlib.import_module(mod), attr):
            return mod
    return "trainplan.model"


@functools.cache
def _is_module(name: str) -> bool:
    """Whether ``name`` is a module of this checkout (importable now)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def renamed(text: str) -> str:
    def new(m: re.Match) -> str:
        parts = m.group(0).split(".")
        if parts[:2] == ["trainplan", "specs"] and len(parts) > 2:
            return ".".join([_specs_home(parts[2]), *parts[2:]])
        for i in range(len(parts), 0, -1):
            p = ".".join(parts[:i])
            if p in RENAMES:
                # a base written after the restructure already names a module that lives deeper than the old name
                # (``trainplan.launch.trainers`` under the old ``trainplan.launch``): leave it
                if any(_is_module(".".join(parts[:j])) for j in range(len(parts), i, -1)):
                    return m.group(0)
                return ".".join([RENAMES[p], *parts[i:]])
        return m.group(0)

    return _DOTTED.sub(new, text)


def results_dir(raw: dict) -> str:
    """The study's results directory (``study.results_dir``: ``results``, or ``results/lora`` for a variant)."""
    return str(raw.get("study", {}).get("results_dir") or "results").rstrip("/")


def _resolve(value: str, res: Path, raw: dict) -> str | list[str]:
    r = results_dir(raw)
    if value == "<proxy_records>":
        ids = [p["id"] for p in json.loads((res / "proxies/proxy_set.json").read_text())["proxies"]]
        return [f"{r}/proxies/runs/{i}.json" for i in ids]
    if value == "<PUBLISHED>":  # rules/common.smk: PUBLISHED
        return sorted(str(p) for p in pkgdata.path(pkgdata.DATA).glob("*.csv"))
    if value in ("<GPU_RECORDS>", "<GPU_CHECK>"):  # rules/common.smk: GPU_RECORDS, GPU_CHECK
        return gpu_record_files(value.strip("<>"), raw, Path("."))  # relative, as Snakemake gives them
    if value == "<benchmark_files>":  # rules/common.smk: benchmark_files
        ids = [p["id"] for p in json.loads((res / "proxies/proxy_set.json").read_text())["proxies"]]
        return [f"{r}/benchmarks/{b}.tsv" for b in smk_constant("BENCHMARKED")] + [
            f"{r}/benchmarks/proxy_run/{i}.tsv" for i in ids]
    return value.replace("{R}", r)


def run_stages(base: Path, work: Path, configs: list[str]) -> Path:
    """Rerun every deterministic rule into ``work``; returns the rerun's results directory."""
    raw = load_config(configs).raw
    res = work / results_dir(raw)
    # the memo and sidecars print the commit: use the base run's, so the texts can be compared exactly
    git = json.loads((base / "analytic/summary.json.provenance.json").read_text()).get("git") or {}
    os.environ["TRAINPLAN_GIT_COMMIT"] = str(git.get("commit"))
    os.environ["TRAINPLAN_GIT_DIRTY"] = "1" if git.get("dirty") else "0"
    for rel in ("proxies/runs", "benchmarks"):
        if (base / rel).exists():
            shutil.copytree(base / rel, res / rel)
    (work / "report").symlink_to(ROOT / "report")
    (work / "data").symlink_to(ROOT / "data")  # the config's relative data paths (calibration.gpu_check_dir), as in a checkout
    os.chdir(work)
    io = rule_io()
    for rule in ORDER:
        inp = {k: _resolve(v, res, raw) for k, v in io[rule]["input"].items()}
        out = {k: _resolve(v, res, raw) for k, v in io[rule]["output"].items()}
        for v in out.values():
            Path(v).parent.mkdir(parents=True, exist_ok=True)
        print(f"  run {rule}", flush=True)
        importlib.import_module(f"trainplan.stages.{rule}").run(inp, out, config_slice(raw, rule))
        if rule == "figures":  # what Snakemake leaves in a directory() output
            (res / "figures/.snakemake_timestamp").touch()
    return res


def _pdf_text(p: Path) -> str:
    return subprocess.run(["pdftotext", "-layout", str(p), "-"], capture_output=True, text=True, check=True).stdout


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _renamed_hashes(base: Path, new: Path) -> dict[str, str]:
    """sha256 of a base file → sha256 of its rerun, for every file that differs only by the module renames (the
    memo and the sidecars print these hashes): results files, and the memo template/CSS of the two checkouts."""
    pairs = [(p, new / p.relative_to(base)) for p in base.rglob("*") if p.is_file() and p.suffix != ".pdf"]
    pairs += [(base.parent / "report/templates" / n, ROOT / "report/templates" / n) for n in ("memo.html.j2", "memo.css")]
    out = {}
    for a, b in pairs:
        if not (a.is_file() and b.is_file()) or a.read_bytes() == b.read_bytes():
            continue
        try:
            if renamed(a.read_text()) == b.read_text():
                out[_sha(a)] = _sha(b)
        except UnicodeDecodeError:
            continue
    return out


def _rehash(text: str, hashes: dict[str, str]) -> str:
    for old, new in hashes.items():
        text = text.replace(old, new).replace(old[:16], new[:16])
    return text


def compare(base: Path, new: Path) -> list[str]:
    problems: list[str] = []
    declared: list[str] = []  # sidecars of INPUTS_CHANGED rules whose inputs list changed (not a difference)
    hashes = _renamed_hashes(base, new)
    n_same = n_renamed = 0
    # a variant's results tree inside the base (results/lora/ of a default run's results/) is another study
    nested = [d for d in base.rglob("analytic") if d.is_dir() and d.parent != base]
    files = sorted(p.relative_to(base) for p in base.rglob("*")
                   if p.is_file() and not any(d.parent in p.parents for d in nested))
    for rel in files:
        s = str(rel)
        if s.startswith(MEASURED) or rel.name == ".snakemake_timestamp":
            continue
        a, b = base / rel, new / rel
        if not b.exists():
            problems.append(f"{s}: missing in the rerun")
            continue
        if a.suffix == ".pdf":
            ta, tb = _rehash(renamed(_pdf_text(a)), hashes), _pdf_text(b)
            same = ta == tb
            diff = (ta, tb)
        elif s.endswith(".provenance.json"):
            # package data is named by absolute path: the two checkouts differ in location only
            ta = _CHECKOUT.sub('"<checkout>/src/trainplan/', _rehash(renamed(a.read_text()), hashes))
            da, db = json.loads(ta), json.loads(_CHECKOUT.sub('"<checkout>/src/trainplan/', b.read_text()))
            for d in (da, db):
                d.pop("git", None)
            if s.endswith(".pdf.provenance.json"):  # the PDF is compared by its text above
                da.pop("output_sha256"), db.pop("output_sha256")
            if da.get("rule") in INPUTS_CHANGED and db.get("rule") == da.get("rule"):
                ia = {i["path"]: i["sha256"] for i in da.pop("inputs", [])}
                ib = {i["path"]: i["sha256"] for i in db.pop("inputs", [])}
                da["inputs_in_both"] = {k: v for k, v in ia.items() if k in ib}
                db["inputs_in_both"] = {k: ib[k] for k in ia if k in ib}
                if set(ia) != set(ib):
                    declared.append(f"{s}: inputs -{sorted(set(ia) - set(ib))} +{sorted(set(ib) - set(ia))}")
            same = da == db
            diff = (json.dumps(da, indent=1, sort_keys=True), json.dumps(db, indent=1, sort_keys=True))
        else:
            ba, bb = a.read_bytes(), b.read_bytes()
            if ba == bb:
                n_same += 1
                continue
            try:
                ta, tb = renamed(ba.decode()), bb.decode()
            except UnicodeDecodeError:
                problems.append(f"{s}: binary content differs")
                continue
            same = ta == tb
            n_renamed += same
            diff = (ta, tb)
            if same:
                continue
        if not same:
            d = "".join(list(difflib.unified_diff(diff[0].splitlines(True), diff[1].splitlines(True),
                                                  "base/" + s, "rerun/" + s, n=1))[:40])
            problems.append(f"{s}: differs\n{d}")
        else:
            n_same += 1
    print(f"compared {n_same + n_renamed + len(problems)} result files: {n_same} identical, "
          f"{n_renamed} identical after the module renames, {len(problems)} different")
    if declared:
        print(f"{len(declared)} sidecars list the changed declared inputs of {', '.join(INPUTS_CHANGED)} "
              "(every input in both has the same sha256):")
        summary: dict[str, list[str]] = {}
        for d in declared:
            f, change = d.split(": inputs ", 1)
            summary.setdefault(change, []).append(f)
        for change, fs in summary.items():
            print(f"  {', '.join(fs)}: {change}")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", type=Path, help="results/ of a snakemake run at the base commit")
    ap.add_argument("--configfile", nargs="*", default=[str(ROOT / "config/config.yaml")])
    ap.add_argument("--keep", action="store_true", help="keep the rerun's directory (printed)")
    a = ap.parse_args(argv)
    base = a.base.resolve()
    configs = [str(Path(c).resolve()) for c in a.configfile]
    os.environ.setdefault("SOURCE_DATE_EPOCH", "0")
    work = Path(tempfile.mkdtemp(prefix="trainplan-diff-"))
    try:
        problems = compare(base, run_stages(base, work, configs))
    finally:
        os.chdir(ROOT)
        if a.keep:
            print("rerun kept in", work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
