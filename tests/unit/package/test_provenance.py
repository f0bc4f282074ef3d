"""Atomic writes and provenance sidecars."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from trainplan.io import read_json, write_csv, write_json, write_text
from trainplan.provenance import (
    HASH_SCHEME,
    code_version,
    config_hash,
    file_sha256,
    read_sidecar,
    sidecar_path,
    study_hash,
    write_sidecar,
)


def test_config_hash_ignores_key_order_but_not_values():
    a = {"cost": {"price": 3.0, "range": [2.0, 6.88]}, "targets": {"window_h": 72}}
    b = {"targets": {"window_h": 72}, "cost": {"range": [2.0, 6.88], "price": 3.0}}
    assert config_hash(a) == config_hash(b)
    assert config_hash(a) != config_hash({**a, "cost": {"price": 3.01, "range": [2.0, 6.88]}})
    assert len(config_hash(a)) == 64 and HASH_SCHEME >= 1


def test_write_json_is_atomic_and_leaves_no_temp_files(tmp_path):
    p = write_json(tmp_path / "sub" / "x.json", {"b": np.float64(1.5), "a": np.arange(2), "n": float("nan")})
    assert read_json(p) == {"a": [0, 1], "b": 1.5, "n": None}
    assert [q.name for q in p.parent.iterdir()] == ["x.json"]


def test_failed_write_keeps_the_old_file(tmp_path):
    p = write_text(tmp_path / "x.txt", "old")
    with pytest.raises(TypeError):
        write_json(p, {"bad": object()})
    assert p.read_text() == "old" and len(list(tmp_path.iterdir())) == 1


def test_write_csv_round_trips(tmp_path):
    df = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    p = write_csv(df, tmp_path / "t.csv")
    pd.testing.assert_frame_equal(pd.read_csv(p), df)


def test_sidecar_records_hash_inputs_and_git(tmp_path):
    inp = write_text(tmp_path / "in.txt", "input")
    out = write_text(tmp_path / "out.txt", "output")
    sl = {"cost": {"price_per_gpu_hour_usd": 3.0}}
    sc = write_sidecar(out, rule="cost_and_risk", config_slice=sl, inputs=[inp], calibration_source="defaults")
    assert sc == sidecar_path(out) and sc.name == "out.txt.provenance.json"
    d = read_sidecar(out)
    assert d["config_hash"] == config_hash(sl) and d["rule"] == "cost_and_risk"
    assert d["inputs"] == [{"path": str(inp), "sha256": file_sha256(inp)}]
    assert d["calibration_source"] == "defaults" and d["package_version"]
    assert set(d["git"]) == {"commit", "dirty"}
    json.dumps(d)


def test_sidecar_git_override(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINPLAN_GIT_COMMIT", "abc123")
    monkeypatch.setenv("TRAINPLAN_GIT_DIRTY", "0")
    out = write_text(tmp_path / "o.txt", "x")
    write_sidecar(out, rule="r", config_slice={})
    assert read_sidecar(out)["git"] == {"commit": "abc123", "dirty": False}


def test_one_study_hash_for_the_memo_the_launch_files_and_the_cli():
    """provenance.study_hash is the one definition: the memo and launch_artifacts rules both receive the
    whole config (config_slice(raw, "memo")), hash it with config_hash, and `trainplan launch` calls it."""
    from trainplan.config import config_slice, load_config
    from trainplan.launch.artifacts import study_hash_of

    conf = Path(__file__).resolve().parents[3] / "config"
    cfg = load_config([conf / "config.yaml", conf / "tiny.yaml"])
    h = study_hash(cfg)
    assert h == study_hash(cfg.raw) == study_hash_of(cfg) == config_hash(config_slice(cfg.raw, "memo"))
    assert h == config_hash(config_slice(cfg.raw, "launch_artifacts"))  # launch files print the study hash
    assert h != config_hash(config_slice(cfg.raw, "analytic_model"))  # a slice hash is a different number
    assert study_hash(load_config([conf / "config.yaml", conf / "lora.yaml"])) != h


def test_code_version_follows_code_and_data_not_caches_or_symlinks(tmp_path):
    """The param every rule carries (rules/common.smk CODE_VERSION): a changed model file or fit reruns the study;
    bytecode caches, symlinked files (inputs of their own rules) and other suffixes do not count."""
    pkg = tmp_path / "pkg"
    (pkg / "model").mkdir(parents=True)
    (pkg / "model" / "timing.py").write_text("A = 1\n")
    (pkg / "fits.json").write_text("{}")
    base = code_version(pkg)
    assert len(base) == 16 and code_version() != base  # the real package has its own
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "x.py").write_text("junk")
    (pkg / "notes.txt").write_text("junk")
    (tmp_path / "elsewhere.yaml").write_text("a: 1")
    (pkg / "default.yaml").symlink_to(tmp_path / "elsewhere.yaml")
    code_version.cache_clear()
    assert code_version(pkg) == base
    (pkg / "model" / "timing.py").write_text("A = 2\n")
    code_version.cache_clear()
    changed = code_version(pkg)
    assert changed != base
    (pkg / "model" / "timing.py").rename(pkg / "model" / "timing2.py")  # same bytes, other path
    code_version.cache_clear()
    assert code_version(pkg) not in (base, changed)
