"""Provenance sidecars: ``<output>.provenance.json`` beside every result file.

A sidecar records what an output depends on: the hash of the config slice the rule used, the rule name,
each input file with its sha256, the package version, the git commit with a dirty flag, and where the
calibration came from. The config hash follows Snakemake's own idea (``caching/hash.py``): a sha256 over
a canonical (sorted-key, compact) JSON serialisation, prefixed by a scheme version so that a change of
serialisation never silently compares equal to an old hash.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from trainplan import __version__
from trainplan.io import read_json, to_jsonable, write_json

HASH_SCHEME = 1
SIDECAR_SUFFIX = ".provenance.json"

__all__ = ["HASH_SCHEME", "code_version", "config_hash", "file_sha256", "git_state", "read_sidecar", "sidecar_path",
           "study_hash", "write_sidecar"]


def canonical_json(obj: Any) -> str:
    """Sorted-key, compact, ASCII JSON: the same data gives the same string on every machine."""
    return json.dumps(to_jsonable(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def config_hash(config_slice: Any) -> str:
    """sha256 (hex) of ``trainplan-config-v{HASH_SCHEME}\\n`` + the canonical JSON of the slice."""
    payload = f"trainplan-config-v{HASH_SCHEME}\n{canonical_json(config_slice)}"
    return hashlib.sha256(payload.encode("ascii")).hexdigest()


def study_hash(config: Any) -> str:
    """THE study hash: ``config_hash`` of the whole resolved config (``StudyConfig.raw``, or a StudyConfig).

    The one definition behind every value printed as "study hash": the memo footer and PDF identifier, the
    header of every launch file (``trainplan launch`` and the ``launch_artifacts`` rule, which therefore
    receives the whole config), and the line Snakemake prints when a run starts. A rule's own
    ``config_hash`` (in its sidecar) covers only its slice and is a different number by design.
    """
    return config_hash(getattr(config, "raw", config))


# What code_version hashes: the package's source and data files (symlinked ones, the default config and the memo
# template, are inputs or config slices of the rules already).
CODE_SUFFIXES = (".py", ".json", ".csv", ".yaml", ".j2", ".mplstyle", ".css")


@lru_cache(maxsize=4)
def code_version(root: str | Path | None = None) -> str:
    """sha256 (first 16 hex digits) over the relative paths and bytes of the trainplan package's own files
    (``CODE_SUFFIXES``, symlinks skipped; ``root``: another tree): equal for equal code and data, whatever the
    checkout or the time."""
    root = Path(root or Path(__file__).resolve().parent)
    h = hashlib.sha256(f"trainplan-code-v{HASH_SCHEME}\n".encode("ascii"))
    for p in sorted(root.rglob("*")):
        if p.suffix in CODE_SUFFIXES and p.is_file() and not p.is_symlink() and "__pycache__" not in p.parts:
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + file_sha256(p).encode("ascii") + b"\n")
    return h.hexdigest()[:16]


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """sha256 (hex) of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@lru_cache(maxsize=8)
def _git_state(cwd: str) -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=20, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def git_state(cwd: str | Path | None = None) -> dict[str, Any]:
    """``{"commit": sha or None, "dirty": bool or None}`` of the repository at ``cwd`` (default: here).

    ``TRAINPLAN_GIT_COMMIT`` (and optionally ``TRAINPLAN_GIT_DIRTY=0/1``) override it, for copies of the
    repository without ``.git`` (e.g. a Slurm node's staging directory).
    """
    env = os.environ.get("TRAINPLAN_GIT_COMMIT")
    if env:
        dirty = os.environ.get("TRAINPLAN_GIT_DIRTY")
        return {"commit": env, "dirty": None if dirty is None else dirty not in ("0", "false", "")}
    return dict(_git_state(str(Path(cwd or os.getcwd()).resolve())))


def sidecar_path(output: str | Path) -> Path:
    """``results/x.csv`` → ``results/x.csv.provenance.json``."""
    p = Path(output)
    return p.with_name(p.name + SIDECAR_SUFFIX)


def write_sidecar(
    output: str | Path,
    *,
    rule: str,
    config_slice: Any,
    inputs: Iterable[str | Path] = (),
    calibration_source: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``<output>.provenance.json`` (atomically) and return its path. Inputs must exist."""
    ins = []
    for i in inputs:
        ip = Path(i)
        if ip.is_dir():
            files = sorted(q for q in ip.rglob("*") if q.is_file() and not q.name.endswith(SIDECAR_SUFFIX))
            ins += [{"path": str(q), "sha256": file_sha256(q)} for q in files]
        else:
            ins.append({"path": str(ip), "sha256": file_sha256(ip)})
    record = {
        "output": str(output),
        "output_sha256": file_sha256(output) if Path(output).is_file() else None,
        "rule": rule,
        "config_hash": config_hash(config_slice),
        "config_hash_scheme": HASH_SCHEME,
        "config_slice": to_jsonable(config_slice),
        "inputs": ins,
        "package": "trainplan",
        "package_version": __version__,
        "git": git_state(),
        "calibration_source": calibration_source,
        "extra": to_jsonable(dict(extra or {})),
    }
    return write_json(sidecar_path(output), record)


def read_sidecar(output: str | Path) -> dict[str, Any]:
    """The sidecar of ``output`` as a dict (FileNotFoundError if it has none)."""
    return read_json(sidecar_path(output))
