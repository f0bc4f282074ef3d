"""`snakemake --report`: the memo's figures (with captions carrying their config hash) and the PDF memo.

Copies the session's finished tiny study (tests/integration/conftest.py), then builds the self-contained HTML
report and reads back the JSON blobs Snakemake embeds in it (``var categories = {...}`` and one ``"<path>": {...}`` entry per result).
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "slurm"))
from workflow_copy import clone_study, snakemake  # noqa: E402

from trainplan.provenance import read_sidecar  # noqa: E402
from trainplan.report.figures import read_caption  # noqa: E402

TINY = ("--cores", "2", "--configfile", "config/tiny.yaml")


def _blob(html: str, marker: str) -> dict:
    """The JSON object that follows ``marker`` in the report's HTML."""
    i = html.index(marker) + len(marker)
    obj, _ = json.JSONDecoder().raw_decode(html, i)
    return obj


def _data(entry: dict) -> bytes:
    return base64.b64decode(entry["data_uri"].split("base64,", 1)[1])


@pytest.fixture(scope="module")
def report(tiny_study, tmp_path_factory: pytest.TempPathFactory) -> dict:
    wf = clone_study(tiny_study[0], tmp_path_factory.mktemp("report"))  # the session's finished tiny study
    r = snakemake(wf, *TINY, "--report", "report.html", timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    html = (wf / "report.html").read_text(encoding="utf-8")
    return {"wf": wf, "res": wf / "results", "html": html, "categories": _blob(html, "var categories = ")}


@pytest.mark.slow
def test_every_figure_is_in_the_report_with_its_config_hash_in_caption_and_labels(report):
    res, html = report["res"], report["html"]
    svgs = sorted((res / "figures").glob("*.svg"))
    assert len(svgs) >= 5
    listed = {p for sub in report["categories"]["Figures"].values() for p in sub}
    assert listed == {f"results/figures/{s.name}" for s in svgs}
    for svg in svgs:
        cap = read_caption(svg)
        entry = _blob(html, f'"results/figures/{svg.name}": ')
        assert entry["labels"]["config hash"] == cap["config_hash"], svg.name
        assert entry["labels"]["sources"] == ", ".join(cap["sources"])
        assert cap["config_hash"] in entry["caption"] and "Traceability" in entry["caption"], svg.name
        assert f"{svg.stem}.caption.json" in entry["caption"]
        assert _data(entry) == svg.read_bytes()
    first_words = {"memory": "Predicted peak memory", "pareto": "Pareto front", "cost": "against the study",
                   "tornado": "Sensitivity", "parity": "Analytic prediction", "time_breakdown": "time per optimizer"}
    for name, words in first_words.items():
        if (res / "figures" / f"{name}.svg").exists():
            assert words in _blob(html, f'"results/figures/{name}.svg": ')["caption"], name


@pytest.mark.slow
def test_the_pdf_memo_is_in_the_report_with_the_study_hash(report):
    pdf = report["res"] / "memo" / "design_memo.pdf"
    assert report["categories"]["Design memo"] == {"Other": ["results/memo/design_memo.pdf"]}
    entry = _blob(report["html"], '"results/memo/design_memo.pdf": ')
    assert entry["labels"]["config hash"] == read_sidecar(pdf)["config_hash"]
    assert "tiny-debug" in entry["caption"] and "config.resolved.json" in entry["caption"]
    assert _data(entry) == pdf.read_bytes()
