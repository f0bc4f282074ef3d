"""The declared inputs and outputs of each rule in rules/*.smk, read from the rule files themselves.

Used by ``scripts/diff_results.py`` (rerun the deterministic stages on another run's proxy measurements) and by
``tests/integration/test_stage_inputs.py`` (each stage runs with only its declared inputs present). A value is
one of: an f-string under the results dir (``f"{R}/analytic/summary.json"``), a plain path string, or one of the
input functions / lists of ``rules/common.smk`` (``proxy_records``, ``benchmark_files``, ``PUBLISHED``,
``GPU_RECORDS``, ``GPU_CHECK``), returned as that name in angle brackets (``"<proxy_records>"``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_RULE = re.compile(r"^(?:rule|checkpoint) (\w+):", re.M)
_SECTION = re.compile(r"^    (\w+):\s*$")
_KEY = re.compile(r"^        (\w+)=(.*)$")
_FSTR = re.compile(r'f"\{R\}/([^"]+)"')
_STR = re.compile(r'^"([^"]+)"')
_NAMES = ("proxy_records", "benchmark_files", "PUBLISHED", "GPU_RECORDS", "GPU_CHECK")


def _value(text: str) -> str | None:
    m = _FSTR.search(text)
    if m:
        return "{R}/" + m.group(1).replace("{{", "{").replace("}}", "}")
    m = _STR.match(text.strip())
    if m:
        return m.group(1)
    name = text.strip().rstrip(",")
    return f"<{name}>" if name in _NAMES else None


def smk_constant(name: str, root: Path = ROOT) -> object:
    """A literal constant of ``rules/common.smk`` (``BENCHMARKED = (...)``), read from the file, not retyped."""
    text = (root / "rules" / "common.smk").read_text()
    m = re.search(rf"^{name} = (\(.*?\)|\[.*?\]|\".*?\")$", text, re.M | re.S)
    if m is None:
        raise KeyError(f"rules/common.smk has no literal {name}")
    return ast.literal_eval(m.group(1))


def gpu_record_files(name: str, raw: dict, root: Path = ROOT) -> list[str]:
    """The files ``GPU_RECORDS`` or ``GPU_CHECK`` of rules/common.smk stand for under the resolved config ``raw``:
    ``calibration.gpu_records_dir`` (default ``data/calibration/gpu``) or ``calibration.gpu_check_dir`` (null: none),
    relative to ``root``; every ``*.json`` in it, sorted (GPU_CHECK: then those of its ``microbench/``)."""
    cal = raw.get("calibration", {})
    if name == "GPU_RECORDS":
        d = cal.get("gpu_records_dir") or "data/calibration/gpu"
    elif name == "GPU_CHECK":
        d = cal.get("gpu_check_dir")
    else:
        raise KeyError(f"rules/common.smk has no GPU record list {name}")
    if not d:
        return []
    p = Path(d) if Path(d).is_absolute() else root / d
    files = sorted(str(f) for f in p.glob("*.json"))
    return files + sorted(str(f) for f in p.glob("microbench/*.json")) if name == "GPU_CHECK" else files


def rule_io(root: Path = ROOT) -> dict[str, dict[str, dict[str, str]]]:
    """{rule: {"input": {key: value}, "output": {key: value}}} for every rule with a ``script:``."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    for smk in sorted((root / "rules").glob("*.smk")):
        text = smk.read_text()
        starts = [(m.start(), m.group(1)) for m in _RULE.finditer(text)] + [(len(text), "")]
        for (a, name), (b, _) in zip(starts, starts[1:], strict=False):
            body = text[a:b].splitlines()
            io: dict[str, dict[str, str]] = {"input": {}, "output": {}}
            section, key, buf = None, None, ""
            for line in body[1:] + ["    end:"]:
                sec = _SECTION.match(line)
                k = _KEY.match(line)
                if (sec or k) and key is not None and section in io:
                    v = _value(buf)
                    if v is not None:
                        io[section][key] = v
                    key, buf = None, ""
                if sec:
                    section = sec.group(1)
                elif k:
                    key, buf = k.group(1), k.group(2)
                elif key is not None:
                    buf += " " + line.strip()
            if "script:" in text[a:b]:
                out[name] = io
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(rule_io(), indent=1))
