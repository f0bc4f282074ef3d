"""Hostile and careless input: every file the user hands trainplan (study config, config.json, summary.json)
and every output path ends in exit 2 with one line naming the key — no traceback, no hang, no unbounded
read — and no config value reaches a shell unquoted."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainplan.cli import main
from trainplan.config import load_config, read_yaml
from trainplan.io import InputFileError, read_json_checked, read_text_checked
from trainplan.model.arch import model_from_hf_config
from trainplan.model.base import ConfigError

ROOT = Path(__file__).resolve().parents[3]
DEFAULT = ROOT / "config" / "config.yaml"
pytestmark = pytest.mark.timeout(60)

ALIAS_BOMB = "\n".join(
    ["a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},"
       f"*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)}]" for i in range(8)]
    + ["study: {name: *i}", "model: llama2-13b", "cluster: {nodes: 4, gpus_per_node: 8, gpu: h100-sxm-80gb}",
       "training: {seq_len: 4096, global_batch: 256}", "cost: {price_per_gpu_hour_usd: 3}"])


def hostile_files(tmp: Path) -> dict[str, Path]:
    """name → path of a hostile input file (or non-file)."""
    out: dict[str, Path] = {}
    (tmp / "binary").write_bytes(bytes(range(256)) * 4)
    out["binary"] = tmp / "binary"
    (tmp / "latin1").write_bytes("model: caf\xe9\n".encode("latin-1"))
    out["not utf-8"] = tmp / "latin1"
    (tmp / "adir").mkdir()
    out["directory"] = tmp / "adir"
    os.mkfifo(tmp / "fifo")
    out["fifo"] = tmp / "fifo"
    out["/dev/zero"] = Path("/dev/zero")
    out["/dev/null"] = Path("/dev/null")
    with open(tmp / "huge", "wb") as f:  # sparse: 64 MiB of NULs without writing them
        f.truncate(64 * 1024**2)
    out["huge"] = tmp / "huge"
    (tmp / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    out["100k-deep"] = tmp / "deep.json"
    (tmp / "empty").write_text("")
    out["empty"] = tmp / "empty"
    return out


# ------------------------------------------------------------------------------------- study config
@pytest.mark.parametrize("name", ["binary", "not utf-8", "directory", "fifo", "/dev/zero", "/dev/null", "huge",
                                  "100k-deep"])
def test_hostile_config_file_is_one_config_error(tmp_path, name):
    p = hostile_files(tmp_path)[name]
    with pytest.raises(ConfigError) as e:
        read_yaml(p)
    assert e.value.key == "configfile" and "\n" not in str(e.value)


@pytest.mark.parametrize("text, why", [
    (ALIAS_BOMB, "alias"),
    ("model: llama2-13b\nmodel: llama2-7b\n", "duplicate key"),
    ("- a\n- b\n", "mapping"),
    ("a: [" * 20_000, "deep"),
    ("{" + "a: {" * 5000 + "}" * 5001, "deep"),
    ("!!python/object/apply:os.system ['touch /tmp/trainplan-pwned']", "YAML"),
    ("? [1, 2]\n: x\n", "YAML"),
])
def test_hostile_yaml_is_one_config_error(tmp_path, text, why):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert e.value.key == "configfile" and why in str(e.value) and "\n" not in str(e.value)
    assert not Path("/tmp/trainplan-pwned").exists()


def test_anchors_without_aliases_and_the_default_config_still_load():
    assert read_yaml(DEFAULT)["model"] == yaml.safe_load(DEFAULT.read_text())["model"]


def test_plan_cli_on_hostile_files_exits_2_one_line(tmp_path, capsys):
    for name, p in hostile_files(tmp_path).items():
        if name == "empty":  # an empty file is an empty config: "model ... required"
            continue
        rc = main(["plan", str(p)])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and err[0].startswith("trainplan: error: configfile="), (name, err)


# ------------------------------------------------------------------------------------- config.json
@pytest.mark.parametrize("name", ["binary", "not utf-8", "fifo", "/dev/zero", "/dev/null", "huge", "100k-deep",
                                  "empty"])
def test_hostile_config_json_is_one_config_error(tmp_path, name, capsys):
    p = hostile_files(tmp_path)[name]
    with pytest.raises(ConfigError) as e:
        model_from_hf_config(p)
    assert e.value.key == "model" and "\n" not in str(e.value)
    assert main(["estimate", "--model", str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trainplan: error: model="), err


@pytest.mark.parametrize("text", ['{"model_type": "llama", "hidden_size": NaN}', '{"a": Infinity}',
                                  '{"num_hidden_layers": 1' + "0" * 5000 + "}", "[" * 70 + "]" * 70, '"llama"'])
def test_json_edge_cases(tmp_path, text):
    p = tmp_path / "config.json"
    p.write_text(text)
    with pytest.raises(ConfigError):
        model_from_hf_config(p)


def test_checked_reads_refuse_non_files_before_opening(tmp_path):
    files = hostile_files(tmp_path)
    for name in ("directory", "fifo", "/dev/zero"):
        with pytest.raises(InputFileError):
            read_text_checked(files[name])
    with pytest.raises(InputFileError, match="at most 1000 bytes"):
        read_text_checked(files["binary"], max_bytes=1000)
    with pytest.raises(FileNotFoundError):
        read_text_checked(tmp_path / "missing")
    ok = tmp_path / "ok.json"
    ok.write_text('{"a": [1, {"b": 2}]}')
    assert read_json_checked(ok) == {"a": [1, {"b": 2}]}
    with pytest.raises(InputFileError, match="nested"):
        read_json_checked(ok, max_depth=2)


# ------------------------------------------------------------------------------------- output paths
def test_csv_to_a_directory_or_unwritable_path(tmp_path, capsys):
    assert main(["validate", "--csv", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("trainplan: error: csv=")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["plan", str(DEFAULT), "--csv", str(blocker / "out.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("trainplan: error: csv=") and "cannot write" in err[-1]


def test_estimate_into_a_closed_pipe_is_quiet():
    """`trainplan estimate | head -1`: the reader is gone before the output is written."""
    p = subprocess.Popen([sys.executable, "-m", "trainplan.cli", "estimate"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()  # the reader leaves at once
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 0 and err == "", err
    r = subprocess.run(["bash", "-c", f"set -o pipefail; {sys.executable} -m trainplan.cli estimate --json | head -1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "{" and "Error" not in r.stderr, r.stderr


# ------------------------------------------------------------------------------------- launch
def _summary(tmp: Path, layout: object) -> Path:
    p = tmp / "summary.json"
    p.write_text(json.dumps({"layout": layout}))
    return p


@pytest.mark.parametrize("argv_extra, summary", [
    (["--time-limit-h", "inf"], {"dp": 32, "sharding": "zero3"}),
    (["--time-limit-h", "nan"], {"dp": 32, "sharding": "zero3"}),
    (["--time-limit-h", "1e300"], {"dp": 32, "sharding": "zero3"}),
    ([], [1, 2, 3]),
    ([], "zero3"),
    ([], {"dp": "many"}),
    ([], {"dp": 32, "warp": 9}),
])
def test_launch_hostile_values_exit_2(tmp_path, capsys, argv_extra, summary):
    s = _summary(tmp_path, summary)
    rc = main(["launch", "--summary", str(s), "--config", str(DEFAULT), "--out", str(tmp_path / "out"), *argv_extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err


def test_launch_garbage_summary_files(tmp_path, capsys):
    for name, p in hostile_files(tmp_path).items():
        rc = main(["launch", "--summary", str(p), "--config", str(DEFAULT), "--out", str(tmp_path / "o")])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and "summary" in err[0], (name, err)


def test_launch_values_never_reach_a_shell_unquoted(tmp_path):
    """A hostile train script path runs as one argument of a stub torchrun; nothing it names executes."""
    from trainplan.launch.artifacts import write_artifacts

    c = load_config(DEFAULT)
    from trainplan.model.layout import Layout

    evil = f"train.py; touch {tmp_path}/PWNED1 $(touch {tmp_path}/PWNED2) `touch {tmp_path}/PWNED3`"
    write_artifacts(c.model, c.cluster, c.training, Layout(dp=32), tmp_path / "out", study_hash="abc123",
                    train_script=evil, options=c.launch)
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "torchrun").write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$@" > {tmp_path}/args\n')
    (stub / "torchrun").chmod(stat.S_IRWXU)
    env = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}", "HEAD_NODE": "node0"}
    r = subprocess.run(["bash", str(tmp_path / "out" / "torchrun.sh")], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert evil in (tmp_path / "args").read_text().splitlines()  # one argument, verbatim
    assert not any((tmp_path / f"PWNED{i}").exists() for i in (1, 2, 3))
    with pytest.raises(ConfigError):
        write_artifacts(c.model, c.cluster, c.training, Layout(dp=32), tmp_path / "o2", study_hash="abc123",
                        options={**c.launch, "partition": "gpu$(id)"})


def test_memo_templates_autoescape():
    """The memo's HTML escapes config text (a study name with markup stays text)."""
    src = (ROOT / "src" / "trainplan" / "report" / "memo.py").read_text()
    assert "select_autoescape" in src


@pytest.mark.parametrize("over", [{"nproc_per_node": 1_000_000, "layout": {"dp": 1_000_000}}, {"steps": 2**63},
                                  {"seq_len": 2**40}, {"timeout_s": 10**12}])
def test_proxy_run_spec_is_bounded(tmp_path, capsys, over):
    """A 1,000,000-rank (or 2⁶³-step) RUN_SPEC is refused before torchrun starts."""
    p = tmp_path / "spec.json"
    p.write_text(json.dumps({"id": "x", "model": "debug", "layout": {"dp": 1}, **over}))
    assert main(["proxy", str(p), "--out", str(tmp_path / "rec.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "must be an integer in" in err[0], err
    assert not (tmp_path / "rec.json").exists()


def test_proxy_run_spec_hostile_files(tmp_path, capsys):
    for name, p in hostile_files(tmp_path).items():
        assert main(["proxy", str(p), "--out", str(tmp_path / "rec.json")]) == 2, name
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "spec=" in err[0], (name, err)


def test_alias_bomb_as_a_dict_is_refused_quickly():
    """Snakemake loads --configfile with its own YAML loader (aliases allowed, shared nodes): the dict that
    reaches load_config is refused by size, without walking its 9⁹ leaves."""
    import time

    raw = yaml.safe_load(ALIAS_BOMB)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="alias bomb"):
        load_config(raw)
    assert time.perf_counter() - t0 < 2
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(ConfigError, match="nested"):
        load_config({"model": deep})


def test_rich_tables_into_a_closed_pipe_are_quiet():
    """`trainplan plan config.yaml | head -1` ends like estimate's: exit 0, nothing on stderr (rich exits 1)."""
    p = subprocess.Popen([sys.executable, "-m", "trainplan.cli", "plan", str(DEFAULT)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0 and err == "", err
