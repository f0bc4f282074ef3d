"""scripts/diff_results.py's module renames: a base written before the restructure names modules where they lived
then; one written after it already names where they live now, and must not be renamed again."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
from diff_results import renamed  # noqa: E402


def test_old_names_move_where_they_live_now():
    assert renamed("python -m trainplan.trainers COST") == "python -m trainplan.launch.trainers COST"
    assert renamed("trainplan.memory.saved_activation_bytes_per_layer") == \
        "trainplan.model.memory.saved_activation_bytes_per_layer"
    assert renamed("trainplan.launch.write_artifacts") == "trainplan.launch.artifacts.write_artifacts"


def test_names_that_already_live_deeper_stay():
    """``trainplan.launch`` was a module and is a package now: ``trainplan.launch.trainers`` in a base written after
    the restructure is today's module, not an attribute of the old one (it was renamed to
    ``trainplan.launch.artifacts.trainers`` before, a false difference in every launch artifact)."""
    for name in ("python -m trainplan.launch.trainers COST", "trainplan.launch.preflight", "trainplan.model.memory"):
        assert renamed(name) == name
