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
