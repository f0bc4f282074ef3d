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

__all__ = ["InputFileError", "atomic_writer", "check_depth", "read_json", "read_json_checked", "read_text_checked",
           "to_jsonable", "write_bytes", "write_csv", "write_json", "write_text"]

MAX_INPUT_BYTES = 16 * 1024**2  # default cap of a user-supplied input file (configs are kilobytes)
MAX_DEPTH = 64  # nesting depth of a user-supplied JSON/YAML document


class InputFileError(ValueError):
    """A user-supplied input file that is not a small regular UTF-8 file of the expected shape.

    ``str(e)`` is one line saying why; callers turn it into a ConfigError naming their key.
    """


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
    """Read a JSON file (one of ours; user-supplied input goes through :func:`read_json_checked`)."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_text_checked(path: str | Path, *, max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The text of a user-supplied file: a regular file (not a directory, FIFO or device), at most
    ``max_bytes``, UTF-8. Raises FileNotFoundError if it does not exist, InputFileError otherwise.

    The type is checked with ``stat`` before opening (opening a FIFO blocks; ``/dev/zero`` never ends), and
    the read is bounded even if the file grows in between.
    """
    import stat

    p = Path(path)
    if "\0" in str(p):
        raise InputFileError("a path with a NUL byte")
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise InputFileError(f"cannot stat: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputFileError("a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError("not a regular file (a FIFO, socket or device)")
    if st.st_size > max_bytes:
        raise InputFileError(f"{st.st_size} bytes; at most {max_bytes} bytes")
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # swapped between stat and open
                raise InputFileError("not a regular file")
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise InputFileError(f"cannot read: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise InputFileError(f"more than {max_bytes} bytes")
    if b"\0" in data:
        raise InputFileError("binary data (NUL bytes), not text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputFileError(f"not UTF-8 text (byte {e.start})") from None


MAX_NODES = 200_000  # values in one document; a YAML alias bomb loaded elsewhere shares nodes 9⁹ times


def check_depth(obj: Any, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> Any:
    """``obj`` unchanged if its lists/dicts nest at most ``max_depth`` deep and hold at most ``max_nodes``
    values (shared references counted each time they are reached); InputFileError otherwise. Iterative, so it
    is safe on any depth, and it stops at the limit, so it is fast on an alias bomb."""
    stack = [(obj, 1)]
    seen = 0
    while stack:
        node, d = stack.pop()
        seen += 1
        if seen > max_nodes:
            raise InputFileError(f"more than {max_nodes} values (a YAML alias bomb?)")
        if isinstance(node, dict | list):
            if d > max_depth:
                raise InputFileError(f"nested more than {max_depth} levels deep")
            stack.extend((v, d + 1) for v in (node.values() if isinstance(node, dict) else node))
    return obj


def read_json_checked(path: str | Path, *, max_bytes: int = MAX_INPUT_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """A user-supplied JSON file through :func:`read_text_checked`, parsed strictly (no NaN/Infinity
    literals) and at most ``max_depth`` deep. Raises FileNotFoundError or InputFileError."""
    text = read_text_checked(path, max_bytes=max_bytes)

    def no_constant(name: str) -> Any:
        raise InputFileError(f"{name} is not valid JSON (numbers must be finite)")

    try:
        obj = json.loads(text, parse_constant=no_constant)
    except RecursionError:
        raise InputFileError(f"nested more than {max_depth} levels deep") from None
    except json.JSONDecodeError as e:
        raise InputFileError(f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except ValueError as e:  # e.g. an integer literal with more than 4300 digits
        raise InputFileError(f"not valid JSON: {str(e).splitlines()[0][:120]}") from None
    return check_depth(obj, max_depth)
