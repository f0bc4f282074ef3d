"""Shared, read-only study searches for the launch tests: each search of a shipped study config runs once per test
session (plan_search takes 7–13 s on 2 cores, and a dozen tests judge the same four tables)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest

from trainplan.config import load_config
from trainplan.launch.artifacts import plan_search
from trainplan.search.layouts import search

CONFIG = Path(__file__).resolve().parents[3] / "config"


@cache
def _config(overlay: str) -> Any:
    return load_config([CONFIG / "config.yaml", CONFIG / overlay])


@cache
def _searched(overlay: str, launched: bool) -> Any:
    cfg = _config(overlay)
    run = plan_search if launched else search
    return run(cfg.model, cfg.cluster, cfg.training, cfg.efficiency)


@pytest.fixture(scope="session")
def study():
    """``study(overlay, launched=True) -> (cfg, df)``: the config (config.yaml + ``overlay``) and its search with
    default options: ``launch.artifacts.plan_search`` (what the study ranks), or with ``launched=False`` the plan's
    ``search.layouts.search``. A fresh copy of the table each call, so no test sees another's edits."""

    def get(overlay: str, launched: bool = True) -> tuple[Any, Any]:
        return _config(overlay), _searched(overlay, launched).copy()

    return get
