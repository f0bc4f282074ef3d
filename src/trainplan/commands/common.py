"""What the ``trainplan`` subcommands share: one-line errors and warnings, the rich console, output paths."""

from __future__ import annotations

import os
import sys
from typing import Any

from trainplan.io import write_csv
from trainplan.model.base import ConfigError


def clean(x: object, limit: int = 200) -> str:
    """One printable line: control characters escaped, long values cut."""
    s = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(x))
    return s if len(s) <= limit else s[:limit] + "…"


def fmt(e: ConfigError) -> str:
    return f"trainplan: error: {clean(e.key, 100)}={clean(e.value)}: {clean(e.valid, 600)}"


def warn(line: str) -> None:
    sys.stderr.write(f"trainplan: warning: {clean(line, 600)}\n")


def console() -> Any:
    """A rich Console whose broken pipe (``trainplan plan | head -1``) ends like estimate's: quietly, exit 0
    (rich's own default exits 1)."""
    from rich.console import Console

    con = Console(width=None if sys.stdout.isatty() else 200)

    def broken_pipe() -> None:
        con.quiet = True
        raise BrokenPipeError

    con.on_broken_pipe = broken_pipe
    return con


def check_out_path(key: str, path: str | None) -> None:
    """An output file path the command will write: refused before any work if it cannot be a file."""
    if path is None:
        return
    if not path or "\0" in path:
        raise ConfigError(key, path, "a file path")
    if os.path.isdir(path):
        raise ConfigError(key, path, "is a directory; give a file path")
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):  # the first existing ancestor must be a directory
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ConfigError(key, path, f"cannot write: {parent} is not a directory")


def write_csv_arg(key: str, df: Any, path: str) -> None:
    try:
        write_csv(df, path)
    except OSError as e:
        raise ConfigError(key, path, f"cannot write: {e.strerror or e}") from None
