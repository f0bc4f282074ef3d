"""What every stage shares: specs from a config slice, sidecars, checked reads of upstream results, the
Snakemake entry-point wrapper. One module per rule sits next to this one (``stages/<rule>.py``).

``workflow/scripts/<rule>.py`` is a three-line adapter calling ``stages.<rule>.main(snakemake)``, which
unpacks the ``snakemake`` object into plain dicts and hands them to ``stages.<rule>.run(inp, out, cfg)``
(what tests call without Snakemake). ``run`` reads only the paths in ``inp`` and writes only those in
``out``. Every output gets a provenance sidecar whose config hash covers exactly the slice in ``params.cfg``
(see ``trainplan.config.RULE_SECTIONS``). Nothing in the package imports ``trainplan.stages``.
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from trainplan.config import build_cluster, build_efficiency
from trainplan.io import read_json
from trainplan.model.arch import resolve_model
from trainplan.model.layout import Layout
from trainplan.model.training import TrainingSpec
from trainplan.provenance import file_sha256, sidecar_path, write_sidecar

log = logging.getLogger("trainplan.stages")


# ------------------------------------------------------------------------------------------ helpers
def specs_from_cfg(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec/ClusterSpec/TrainingSpec/Layout/Efficiency for whichever sections the slice holds."""
    out: dict[str, Any] = {}
    if "model" in cfg:
        out["model"] = resolve_model(cfg["model"])
    if "cluster" in cfg:
        out["cluster"] = build_cluster(cfg["cluster"])
    if "training" in cfg:
        tr = dict(cfg["training"])
        tr["lora_targets"] = tuple(tr.get("lora_targets", ("q", "k", "v", "o")))
        out["training"] = TrainingSpec(**tr)
    if "layout" in cfg:
        out["layout"] = Layout.from_dict(cfg["layout"]) if cfg["layout"] else None
    if "efficiency" in cfg:
        gpu = out["cluster"].gpu if "cluster" in out else None
        out["efficiency"] = build_efficiency(cfg["efficiency"] or {}, gpu)
    return out


def files_of(inp: Mapping[str, Any]) -> list[str]:
    files: list[str] = []
    for v in inp.values():
        files += [str(x) for x in v] if isinstance(v, list | tuple) else [str(v)]
    return files


def sidecars(rule: str, out: Mapping[str, Any], cfg: Any, inp: Mapping[str, Any], **kw: Any) -> None:
    """Provenance sidecars; a CSV's also promises its row count (``extra.rows``), which readers check."""
    for o in files_of(out):
        if Path(o).exists():
            extra = dict(kw.get("extra") or {})
            if o.endswith(".csv"):
                extra["rows"] = _csv_rows(o)
            write_sidecar(o, rule=rule, config_slice=cfg, inputs=files_of(inp),
                          **{**kw, "extra": extra or None})


# ------------------------------------------------------------------------------ corrupted results
class CorruptResultError(RuntimeError):
    """A results file is not what the rule that wrote it recorded (cut, emptied, edited): it was removed, with
    its sidecar, so the next ``snakemake`` run rebuilds it."""


def _csv_rows(path: str | Path) -> int | None:
    """Data rows of a CSV (quoted newlines handled), or None if it cannot be parsed."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return max(sum(1 for _ in csv.reader(f)) - 1, 0)
    except (OSError, UnicodeDecodeError, csv.Error):
        return None


def remove_result(path: Path) -> None:
    for q in (path, sidecar_path(path)):
        q.unlink(missing_ok=True)


def verify_result(path: str | Path) -> None:
    """Check a file a rule wrote against its provenance sidecar (sha256, and a CSV's promised row count).
    On a mismatch, remove it and its sidecar and raise :class:`CorruptResultError` naming the file, so the
    rerun rebuilds it instead of using it. Files without a sidecar (sources, published data) are not judged."""
    p, sc_path = Path(path), sidecar_path(path)
    if not p.is_file() or not sc_path.is_file():
        if sc_path.is_file() and not p.exists():
            raise CorruptResultError(f"{p}: missing (its provenance sidecar is there): rerun to rebuild it")
        return
    try:
        sc = read_json(sc_path)
        promised = sc["output_sha256"]
        rule = sc.get("rule", "its rule")
        rows = (sc.get("extra") or {}).get("rows")
    except (OSError, ValueError, KeyError, TypeError) as e:
        remove_result(p)
        raise CorruptResultError(f"{p}: its provenance sidecar {sc_path} is unreadable ({type(e).__name__}: {e}); "
                                 "removed both, so the next run rebuilds them") from None
    if promised is None or file_sha256(p) == promised:
        return
    what = "its content differs from what it wrote"
    if p.suffix == ".csv" and rows is not None:
        now = _csv_rows(p)
        if now != rows:
            what = f"{'unparseable' if now is None else f'{now} rows'} but {rule} wrote {rows}"
    elif p.suffix == ".json":
        text = p.read_text(encoding="utf-8", errors="replace")
        try:
            json.loads(text)
        except json.JSONDecodeError as e:
            what = f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno} of {len(text)} characters)"
    remove_result(p)
    raise CorruptResultError(f"{p}: {what} (sha256 differs from {sc_path.name}): cut, emptied or edited after "
                             f"{rule} wrote it; removed with its sidecar, so the next run rebuilds it")


def verify_inputs(inp: Mapping[str, Any]) -> None:
    """:func:`verify_result` for every input file; all problems in one error."""
    problems = []
    for f in files_of(inp):
        try:
            verify_result(f)
        except CorruptResultError as e:
            problems.append(str(e))
    if problems:
        raise CorruptResultError("; ".join(problems))


def read_table(path: str | Path) -> Any:
    """A results CSV, checked against its sidecar first (:func:`verify_result`), parsed whole: read in chunks (pandas'
    default), a column empty for the first rows and text later (candidates.csv's ``reason``) warns of mixed types."""
    verify_result(path)
    return pd.read_csv(path, low_memory=False)


def _smk_dicts(smk: Any) -> tuple[dict, dict, dict, dict]:
    inp = {k: v for k, v in smk.input.items()}
    out = {k: v for k, v in smk.output.items()}
    params = {k: v for k, v in smk.params.items()}
    wc = {k: v for k, v in smk.wildcards.items()}
    return inp, out, params, wc


def _with_log(smk: Any, fn: Callable[[], None]) -> None:
    """Run ``fn`` with logging (and stdout/stderr of this process) going to the rule's log file."""
    logfile = smk.log[0] if len(smk.log) else None
    if logfile is None:
        fn()
        return
    Path(logfile).parent.mkdir(parents=True, exist_ok=True)
    attempt = int(getattr(smk, "attempt", 1) or 1)
    # A retried job appends, so its log shows every attempt (Snakemake's `retries`).
    handler = logging.FileHandler(logfile, mode="a" if attempt > 1 else "w", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    log.info("%s: attempt %d", smk.rule, attempt)
    try:
        fn()
    except Exception:
        log.exception("%s failed", smk.rule)
        raise
    finally:
        root.removeHandler(handler)
        handler.close()


def stage(run: Callable[..., None], rule: str) -> Callable[[Any], None]:
    """The Snakemake entry point of ``rule`` (``main(snakemake)``): unpack the snakemake object, verify the
    inputs against their sidecars, run ``run(inp, out, cfg)`` with the rule's log."""

    def main(smk: Any) -> None:
        inp, out, params, wc = _smk_dicts(smk)

        def go() -> None:
            verify_inputs(inp)  # a cut or edited upstream result fails here, named, and is removed
            run(inp, out, params.get("cfg", {}), **({"wildcards": wc} if wc else {}))

        _with_log(smk, go)

    main.__doc__ = f"Snakemake entry point for rule ``{rule}`` (see ``{run.__module__}.run``)."
    return main


