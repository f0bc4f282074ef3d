"""Atomic file writes: a temporary file in the same directory, then ``os.replace``.

A reader (or Snakemake, after a crash) never sees a half-written result. Parent directories are created.
JSON is written with sorted keys and a trailing newline so that equal content gives equal bytes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["atomic_writer", "read_json", "to_jsonable", "write_bytes", "write_csv", "write_json", "write_text"]


def _atomic(path: str | Path, write: Callable[[Any], None], mode: str) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8", "newline": ""})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return p


def atomic_writer(path: str | Path, write: Callable[[Any], None], *, binary: bool = False) -> Path:
    """Call ``write(f)`` on a temporary file handle, then move it onto ``path``."""
    return _atomic(path, write, "wb" if binary else "w")


def to_jsonable(obj: Any) -> Any:
    """Plain JSON types from numpy scalars/arrays, dataclasses, tuples, Paths; NaN/inf become None."""
    import dataclasses

    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_jsonable(dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        seq = sorted(obj, key=str) if isinstance(obj, set | frozenset) else obj
        return [to_jsonable(v) for v in seq]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, bool | int | str) or obj is None:
        return obj
    if hasattr(obj, "tolist"):  # numpy scalar or array
        return to_jsonable(obj.tolist())
    if hasattr(obj, "to_dict"):
        return to_jsonable(obj.to_dict())
    raise TypeError(f"cannot write {type(obj).__name__} as JSON")


def write_json(path: str | Path, obj: Any) -> Path:
    """Write ``obj`` as indented, sorted-key JSON (numpy and dataclasses converted), atomically."""
    text = json.dumps(to_jsonable(obj), indent=2, sort_keys=True, allow_nan=False) + "\n"
    return _atomic(path, lambda f: f.write(text), "w")


def write_text(path: str | Path, s: str) -> Path:
    """Write a string, atomically."""
    return _atomic(path, lambda f: f.write(s), "w")


def write_bytes(path: str | Path, b: bytes) -> Path:
    """Write bytes, atomically."""
    return _atomic(path, lambda f: f.write(b), "wb")


def write_csv(df: Any, path: str | Path, **kw: Any) -> Path:
    """Write a pandas DataFrame as CSV without the index (unless ``index=True``), atomically."""
    kw.setdefault("index", False)
    kw.setdefault("lineterminator", "\n")
    return _atomic(path, lambda f: df.to_csv(f, **kw), "w")


def read_json(path: str | Path) -> Any:
    """Read a JSON file."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)
