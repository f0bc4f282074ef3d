"""The trainplan CLI: estimate/validate/plan via main(argv) and via a subprocess; one-line errors, exit 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainplan.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_estimate_json_schema(capsys):
    assert main(["estimate", "--model", "llama2-13b", "--gpus", "32", "--micro-batch", "1", "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    for k in ("feasible", "reason", "params", "flops_per_token", "memory_gib", "step_time_s", "tokens_per_s",
              "tokens_per_s_per_gpu", "mfu", "hfu", "breakdown", "headroom", "layout"):
        assert k in js
    assert set(js["memory_gib"]) >= {"weights", "gradients", "optimizer", "activations", "buffers", "overhead", "total"}
    assert js["params"] == 13_015_864_320 and js["layout"]["dp"] == 32


def test_estimate_arch_overrides(capsys):
    assert main(["estimate", "--arch", "layers=2,hidden=256,heads=4,vocab=1000", "--gpus", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "custom"


@pytest.mark.parametrize("argv, key", [
    (["--tp", "3"], "layout"),
    (["--tp", "16", "--gpus", "32"], "layout.tp"),
    (["--gpu", "b300"], "gpu"),
    (["--global-batch", "-1"], "global-batch"),
    (["--model", "/nonexistent/config.json"], "model"),
    (["--arch", "layers=x"], "arch.layers"),
    (["--arch", "depth=3"], "arch.depth"),
])
def test_bad_input_one_line_exit_2(capsys, argv, key):
    assert main(["estimate", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"trainplan: error: {key}="), err


def test_unreadable_config_json(tmp_path, capsys):
    p = tmp_path / "config.json"
    p.write_text("{broken")
    assert main(["estimate", "--model", str(p)]) == 2
    assert capsys.readouterr().err.startswith("trainplan: error: model=")


def test_subprocess_error_and_help():
    exe = [sys.executable, "-m", "trainplan.cli"]
    r = subprocess.run([*exe, "estimate", "--tp", "7"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    for sub in ("plan", "estimate", "validate"):
        h = subprocess.run([*exe, sub, "--help"], capture_output=True, text=True, timeout=60)
        assert h.returncode == 0 and "example:" in h.stdout


def test_estimate_imports_no_torch_or_snakemake():
    code = ("import sys; from trainplan.cli import main; main(['estimate','--json']); "
            "assert 'torch' not in sys.modules and 'snakemake' not in sys.modules and 'pandas' not in sys.modules")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_validate_prints_mape(capsys):
    assert main(["validate"]) == 0
    out = capsys.readouterr().out
    assert "MAPE" in out and "korthikanti2022_t3_5" in out


@pytest.mark.skipif(not (ROOT / "config" / "config.yaml").exists(), reason="config/config.yaml not written yet")
def test_plan_default_config(tmp_path, capsys):
    out_csv = tmp_path / "c.csv"
    assert main(["plan", str(ROOT / "config" / "config.yaml"), "--top", "3", "--csv", str(out_csv)]) == 0
    text = capsys.readouterr().out
    assert "tok/s/GPU" in text and "chosen" in text
    assert out_csv.exists()
