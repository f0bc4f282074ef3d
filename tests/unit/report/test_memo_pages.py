"""The memo's pages as pictures (pdftoppm): every page has content and nothing runs into the page edge.

A table or figure that overflows the 15 mm side margins puts ink into the outermost strip of the page;
this is the automated part of looking at every page (a person still looks, see the issue notes).
"""

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread
from test_memo import FIXTURE, _render

DPI = 40
EDGE_MM = 6.0  # the outer strip that must stay blank: well inside the 15 mm side margins


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> list[np.ndarray]:
    if shutil.which("pdftoppm") is None:
        pytest.skip("pdftoppm (poppler-utils) is not installed")
    base = tmp_path_factory.mktemp("pages")
    root = base / "results"
    shutil.copytree(FIXTURE, root)
    pdf = _render(root, base / "memo.pdf")
    subprocess.run(["pdftoppm", "-r", str(DPI), "-png", str(pdf), str(base / "p")], check=True)
    return [imread(p)[..., :3] for p in sorted(Path(base).glob("p-*.png"))]


def _ink(img: np.ndarray) -> np.ndarray:
    return img.mean(axis=2) < 0.85  # darker than light grey


def test_every_page_has_content(pages):
    assert len(pages) >= 8
    for i, img in enumerate(pages, 1):
        assert _ink(img).mean() > 0.002, f"page {i} is (nearly) blank"


def test_nothing_runs_into_the_side_edges(pages):
    edge = int(round(EDGE_MM / 25.4 * DPI))
    for i, img in enumerate(pages, 1):
        ink = _ink(img)
        assert not ink[:, :edge].any() and not ink[:, -edge:].any(), f"page {i}: content reaches the side edge"


def test_a_table_row_never_splits_across_pages(tmp_path):
    """memo.css keeps each table row on one page. The comparable-runs table of the default study (751d25d; saved as
    tests/fixtures/memo_comparable_table.html) is rendered by WeasyPrint below spacers of 196–210 mm, so that its
    rows meet the page end at every offset: with the stylesheet no row's single-line cells (GPUs, seq) stay behind
    while its wrapped run name moves on (pdftotext -layout: a page that ends in a line starting with two bare
    numbers). The same stylesheet without its ``tr`` rule does split rows there, so the check can fail."""
    if shutil.which("pdftotext") is None:
        pytest.skip("pdftotext (poppler-utils) is not installed")
    import re

    from weasyprint import CSS, HTML

    sheet = (Path(__file__).resolve().parents[3] / "report" / "templates" / "memo.css").read_text()
    table = (Path(__file__).resolve().parents[2] / "fixtures" / "memo_comparable_table.html").read_text()
    rule = "tr { break-inside: avoid; }"
    assert rule in sheet
    split: dict[str, list[int]] = {}
    for name, css in (("memo", sheet), ("without the rule", sheet.replace(rule, ""))):
        style, split[name] = CSS(string=css), []
        for mm in range(196, 211):
            html = (f"<html><body><div class='runinfo'>runinfo</div><section class='page1'><h1>T</h1>"
                    f"<div style='height:{mm}mm'></div>{table}</section></body></html>")
            pdf = tmp_path / "t.pdf"
            HTML(string=html).write_pdf(pdf, stylesheets=[style])
            text = subprocess.run(["pdftotext", "-layout", str(pdf), "-"], check=True, capture_output=True,
                                  text=True).stdout
            for page in text.split("\f")[:-1]:
                body = [ln for ln in page.splitlines() if ln.strip() and "runinfo" not in ln and "Page " not in ln]
                if body and re.match(r"^\s+\d+\s+\d+\s", body[-1]):
                    split[name].append(mm)
                    break
    assert not split["memo"], split
    assert split["without the rule"], split


def test_the_day1_commands_table_stays_inside_the_page(tmp_path):
    """Appendix A's commands, made unbreakable at their hyphens (a command copied from the PDF must run), once
    widened the table past the right edge, cutting off its "passes when" column. The fixture has no day-1 list, so
    the real one for 4 × 8 H100 is rendered here and every page checked at the edges."""
    if shutil.which("pdftoppm") is None:
        pytest.skip("pdftoppm (poppler-utils) is not installed")
    import json

    from trainplan.launch.artifacts import day1_commands
    from trainplan.model.hardware import ClusterSpec

    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    # and the technique table with the seq8k study's long CP layouts, which once ran past the right edge too
    import pandas as pd

    tech = pd.read_csv(root / "analytic/techniques.csv")
    tech["best_with"] = "dp8·tp2(sp)·pp2(interleaved,v4)·cp2(ulysses) async-tp zero2 rc=selective mb=2 offload"
    tech["best_without"] = "dp16·tp1·pp1·cp2(ulysses) zero2 rc=none mb=1"
    tech.to_csv(root / "analytic/techniques.csv", index=False)
    manifest = json.loads((root / "launch/manifest.json").read_text())
    manifest["day1"] = day1_commands(ClusterSpec(nodes=4, gpus_per_node=8, gpu="h100-sxm-80gb"), trainer="accelerate",
                                     min_tokens_per_s_per_gpu=4742.0, study_hash="1d4b04148965" * 5)
    (root / "launch/manifest.json").write_text(json.dumps(manifest))
    pdf = _render(root, tmp_path / "memo.pdf")
    text = subprocess.run(["pdftotext", "-layout", str(pdf), "-"], capture_output=True, text=True, check=True).stdout
    assert "--ntasks-per-node=8" in text and "TRAINPLAN_MODE=day1-throughput" in text  # not broken at a hyphen
    subprocess.run(["pdftoppm", "-r", str(DPI), "-png", str(pdf), str(tmp_path / "p")], check=True)
    edge = int(round(EDGE_MM / 25.4 * DPI))
    for p in sorted(tmp_path.glob("p-*.png")):
        ink = _ink(imread(p)[..., :3])
        assert not ink[:, :edge].any() and not ink[:, -edge:].any(), f"{p.name}: content reaches the side edge"
