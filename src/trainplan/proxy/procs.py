"""The proxy launchers' processes, read from /proc, and the Snakefile's signal hook.

Standard library only: the Snakefile's ``onstart:`` installs :func:`forward_signals_to_proxies` in every
Snakemake process (each Slurm job parses it too), and the launcher (:mod:`trainplan.proxy.torchrun`) reads the same
/proc helpers. Neither imports torch; only the ranks (:mod:`trainplan.proxy.worker`) do.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Any

RANK_ENTRY = "trainplan.proxy.worker"  # the module every rank runs (``-m RANK_ENTRY SPEC RANK_DIR``): how launchers are found


def proc_stat(pid: int) -> tuple[int, str, int] | None:
    """(ppid, state, start time in clock ticks) of ``pid`` from /proc, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            rest = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(rest[1]), rest[0].decode(), int(rest[19])


def running(pid: int, start: int | None = None) -> bool:
    """``pid`` exists, is not a zombie, and (when ``start`` is given) is the same process as before."""
    st = proc_stat(pid)
    return st is not None and st[1] not in ("Z", "X") and (start is None or st[2] == start)


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (children, grandchildren, …), from one scan of /proc."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if d.isdigit() and (st := proc_stat(int(d))) is not None and st[1] not in ("Z", "X"):
            children.setdefault(st[0], []).append(int(d))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for c in children.get(todo.pop(), ()):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def cmdline(pid: int) -> list[str]:
    """The argv of ``pid`` from /proc (empty when it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def proxy_launchers(root: int) -> set[int]:
    """The proxy launchers below ``root``: the parents of the processes that start ranks with
    ``-m trainplan.proxy.worker`` (torchrun, or srun in a multi-node allocation)."""
    starters = {p for p in descendants(root)
                if RANK_ENTRY in (c := " ".join(cmdline(p))) and "torch.distributed.run" in c}
    return {st[0] for p in starters if (st := proc_stat(p))} - starters - {root}


def forward_signals_to_proxies(signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> None:
    """For the Snakefile's ``onstart:`` hook (the main Snakemake process). Snakemake answers SIGINT and
    SIGTERM by waiting for its running jobs to finish — for a GPU proxy, hours on held GPUs. This chains a
    handler in front of Snakemake's: it first sends the signal to every proxy launcher below this process
    (:func:`proxy_launchers`), which kills its ranks within seconds and writes no record; then Snakemake's
    own handling runs (the job fails, Snakemake exits, the next run reruns the proxy)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for s in signals:
        prev = signal.getsignal(s)

        def handler(signum: int, frame: Any, prev: Any = prev) -> None:
            for pid in proxy_launchers(os.getpid()):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signum)
            if callable(prev):
                prev(signum, frame)
            elif prev == signal.SIG_DFL:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)

        signal.signal(s, handler)
