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
    """memo.css keeps each table row on one page: a long table of two-line rows, rendered by WeasyPrint with the
    memo's stylesheet, has both lines of every row on the same page (pdftotext, one text per page). Without the
    rule WeasyPrint splits a wrapped row at the page end (seen on the memo's comparable-runs table)."""
    if shutil.which("pdftotext") is None:
        pytest.skip("pdftotext (poppler-utils) is not installed")
    from weasyprint import CSS, HTML

    css = Path(__file__).resolve().parents[3] / "report" / "templates" / "memo.css"
    rows = "".join(f"<tr><td>row{i:03d}top<br>row{i:03d}bottom</td><td>{i}</td></tr>" for i in range(160))
    pdfs = {}
    for name, sheets in (("memo", [CSS(filename=str(css))]), ("bare", [])):
        pdf = tmp_path / f"{name}.pdf"
        HTML(string=f"<table>{rows}</table>").write_pdf(pdf, stylesheets=sheets)
        text = subprocess.run(["pdftotext", str(pdf), "-"], check=True, capture_output=True, text=True).stdout
        pdfs[name] = [{w[3:6] for w in page.split() if w.startswith("row") and w.endswith("top")}
                      ^ {w[3:6] for w in page.split() if w.startswith("row") and w.endswith("bottom")}
                      for page in text.split("\f")]
    assert len(pdfs["memo"]) > 2 and not any(pdfs["memo"]), pdfs["memo"]
    assert any(pdfs["bare"]), "WeasyPrint no longer splits rows by itself: the check cannot fail"
