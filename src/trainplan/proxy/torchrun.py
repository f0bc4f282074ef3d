"""Start a proxy run under torchrun (or srun + torchrun inside a multi-node Slurm allocation) and
turn what the ranks left behind into one RECORD.

Locally: ``python -m torch.distributed.run --standalone --nproc-per-node N -m trainplan.proxy.worker``.
Inside Slurm with ``SLURM_JOB_NUM_NODES > 1``: ``srun --nodes=K --ntasks-per-node=1`` starting one torchrun
per node with a c10d rendezvous on the allocation's first host. The whole process group is killed after
``timeout_s`` (a hung collective → status ``timeout``). Arguments are passed as a list, never a shell string.

Interrupts. torchrun runs in its own session and starts every worker in a session of its own, so neither a
Ctrl-C in the terminal nor a signal to the launcher reaches them. The launcher therefore owns their
lifetime: while it waits it handles SIGINT, SIGTERM and SIGHUP, and it polls the process that started it
(the outermost ``snakemake`` among its ancestors, when there is one). On a signal, or when that process is
gone, it kills the whole tree (every descendant of torchrun, snapshotted before anything dies: SIGTERM,
then SIGKILL after :data:`GRACE_S`), removes its hidden ``.{id}.*`` work folder, writes **no record** (so
Snakemake reruns the proxy) and exits ``128 + signal`` (130 for SIGINT, 143 for SIGTERM or a lost parent).
On Linux torchrun also gets SIGTERM if the launcher dies without cleaning up (SIGKILL), and every worker
SIGKILL if torchrun dies (``PR_SET_PDEATHSIG``), so no rank outlives its launcher.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainplan.io import read_json, write_json
from trainplan.model.base import ConfigError
from trainplan.proxy.procs import RANK_ENTRY, cmdline, descendants, proc_stat, running
from trainplan.proxy.record import assemble_record
from trainplan.proxy.slurm_resources import proxy_job_resources

RDZV_PORT = 29517  # the c10d rendezvous port of a multi-node proxy outside a numbered job; in one: rdzv_port()
GRACE_S = 3.0  # SIGTERM → SIGKILL for the process tree of an interrupted or timed-out run
POLL_S = 0.2  # how often the launcher checks its caller while torchrun runs
PROGRESS_ENV = "TRAINPLAN_PROXY_PROGRESS"  # a steps log rank 0 appends to (set by the proxy_run stage, inherited by the ranks)
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1

# The CUDA caching allocator of every launch path (the sbatch and torchrun scripts, the preflight's slice): expandable
# segments grow one mapped range per stream instead of cudaMalloc'ing fixed blocks, so memory freed at one tensor size
# serves the next rather than staying reserved (fragmentation). torchtitan's launcher (run_train.sh) sets the same.
# PYTORCH_ALLOC_CONF is torch's device-generic name (torch 2.13 also reads the older PYTORCH_CUDA_ALLOC_CONF); an
# operator's own setting under either name is kept.
ALLOC_CONF = "expandable_segments:True"
ALLOC_CONF_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


def alloc_conf(environ: Mapping[str, str]) -> str | None:
    """The allocator settings ``environ`` gives torch (the first non-empty of ALLOC_CONF_VARS), None: its defaults."""
    return next((environ[k] for k in ALLOC_CONF_VARS if environ.get(k)), None)


def allocator_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with ``PYTORCH_ALLOC_CONF=ALLOC_CONF`` added, unless either allocator variable is already set
    (non-empty): what the generated scripts export, for a process the preflight starts itself."""
    env = dict(environ)
    if alloc_conf(env) is None:
        env[ALLOC_CONF_VARS[0]] = ALLOC_CONF
    return env


def first_slurm_host() -> str:
    """The address of the allocation's first node: its ``NodeAddr`` (``scontrol show node``), which is what
    Slurm itself connects to and may differ from the NodeName (an IB interface, an IP); the name if unset."""
    name = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                          check=True, capture_output=True, text=True).stdout.split()[0]
    info = subprocess.run(["scontrol", "show", "node", "-o", name], capture_output=True, text=True).stdout
    addr = next((f.split("=", 1)[1] for f in info.split() if f.startswith("NodeAddr=")), "")
    return addr or name


def rdzv_port(env: Mapping[str, str]) -> int:
    """The rendezvous port of a multi-node proxy: one per Slurm job (20000 + job id mod 10000, below Linux's
    ephemeral range), so two proxies whose allocations start on the same node (CPU jobs share nodes) do not
    both bind one port; :data:`RDZV_PORT` without a job id."""
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
    return 20000 + int(job) % 10000 if job.isdigit() else RDZV_PORT


def torchrun_command(spec: dict[str, Any], spec_path: str, rank_dir: str, env: dict[str, str] | None = None) -> list[str]:
    """The argv that starts every rank of ``spec``. Across nodes, ``srun`` gives its one task per node the CPUs
    the job asked for per node (``proxy_job_resources``): since Slurm 22.05 a step does not inherit the job's
    ``--cpus-per-task``, and the jobstep plugin strips the variables that would pass it on, so without it every
    rank of a node would share one CPU wherever Slurm binds tasks to cores."""
    env = os.environ if env is None else env
    entry = ["-m", RANK_ENTRY, spec_path, rank_dir]  # proxy.run's main, dying with torchrun
    nproc = str(spec["nproc_per_node"])
    nodes = int(env.get("SLURM_JOB_NUM_NODES", "1"))
    if spec["nnodes"] > 1 or nodes > 1:
        if nodes < spec["nnodes"]:
            where = f"the Slurm allocation has {nodes} node(s)" if env.get("SLURM_JOB_ID") else \
                "this is not a Slurm job: a multi-node proxy runs under `snakemake --profile slurm`, or set proxies.nnodes: 1"
            raise ConfigError("nnodes", spec["nnodes"], where)
        host = first_slurm_host()
        cpus = proxy_job_resources(spec)["cpus_per_task"]
        return ["srun", f"--nodes={spec['nnodes']}", "--ntasks-per-node=1", f"--cpus-per-task={cpus}",
                "--kill-on-bad-exit=1", sys.executable, "-m", "torch.distributed.run", f"--nnodes={spec['nnodes']}",
                f"--nproc-per-node={nproc}", "--rdzv-backend=c10d", f"--rdzv-endpoint={host}:{rdzv_port(env)}",
                f"--rdzv-id=trainplan-{spec['id']}", *entry]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *entry]


# ----------------------------------------------------------------------------------- processes (/proc)
def watched_parent() -> tuple[int, int, str] | None:
    """(pid, start time, name) of the outermost ``snakemake`` process among this process's ancestors: the run
    this proxy belongs to. Its jobs wait on their children, so it is gone only if it was killed or
    interrupted; then the proxy must stop too. None outside Snakemake (a plain ``trainplan proxy`` keeps
    running under ``nohup``)."""
    found, pid, seen = None, os.getppid(), 0
    while pid > 1 and seen < 64:
        st = proc_stat(pid)
        if st is None:
            break
        argv = cmdline(pid)
        if any(os.path.basename(a) == "snakemake" or a == "snakemake" for a in argv[:3]):
            found = (pid, st[2], "snakemake")
        pid, seen = st[0], seen + 1
    return found


def _prctl() -> Any:
    """libc's ``prctl`` (Linux), looked up once and before any fork: a child of a threaded process must not
    run the dynamic loader between fork and exec. None elsewhere."""
    global _PRCTL
    if _PRCTL is None and sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
    return _PRCTL


_PRCTL: Any = None


def set_pdeathsig(sig: int) -> None:
    """Linux: deliver ``sig`` to this process when its parent (thread) exits. No-op elsewhere."""
    fn = _prctl()
    if fn is not None:
        with contextlib.suppress(Exception):
            fn(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


def _torchrun_preexec() -> None:  # runs in the child between fork and exec: no imports, no lookups
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)  # torchrun's handler then stops its workers
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)  # blocked by the launcher around the fork


def kill_tree(proc: subprocess.Popen, *, grace_s: float = GRACE_S) -> float:
    """SIGTERM torchrun's process group and every descendant (each worker leads a session of its own), SIGKILL
    whatever is left after ``grace_s``, reap torchrun. Returns the seconds until nothing was left."""
    t0 = time.monotonic()
    tree = descendants(proc.pid)  # snapshot first: a worker whose torchrun died is reparented out of reach
    starts = {p: st[2] for p in tree if (st := proc_stat(p))}

    def alive() -> set[int]:
        live = {p for p in starts if running(p, starts[p])}
        if proc.poll() is None:
            for p in descendants(proc.pid) - set(starts):  # spawned since the snapshot
                if st := proc_stat(p):
                    starts[p] = st[2]
                    live.add(p)
        return live

    def send(sig: int, pids: set[int]) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        for p in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p, sig) if os.getpgid(p) == p else os.kill(p, sig)

    send(signal.SIGTERM, alive())
    deadline = time.monotonic() + grace_s
    while (left := alive()) or proc.poll() is None:
        if time.monotonic() >= deadline:
            send(signal.SIGKILL, left)
            break
        time.sleep(0.05)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    end = time.monotonic() + 5  # after SIGKILL: until the kernel has taken them all
    while alive() and time.monotonic() < end:
        time.sleep(0.05)
    return time.monotonic() - t0


class Interrupted(Exception):
    """A signal, or the loss of the Snakemake run this proxy belongs to, while torchrun was running."""

    def __init__(self, signum: int, why: str):
        super().__init__(why)
        self.signum, self.why = signum, why


@contextlib.contextmanager
def _signals_raise() -> Any:
    """While the block runs (main thread only), SIGINT/SIGTERM/SIGHUP raise :class:`Interrupted`."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: Any) -> None:
        for s in SIGNALS:  # one interrupt is enough: later signals must not break the cleanup
            signal.signal(s, signal.SIG_IGN)
        raise Interrupted(signum, f"{signal.Signals(signum).name} received")

    old = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _stale_work_dirs(out: Path, run_id: str) -> None:
    """Remove ``.{id}.*`` work folders a killed (SIGKILL) launcher of this id left beside its record."""
    if out.parent.exists():
        for d in out.parent.glob(f".{run_id}.*"):
            if d.is_dir() and (d / "spec.json").exists():
                shutil.rmtree(d, ignore_errors=True)


CGROUP_ROOT = Path("/sys/fs/cgroup")


def oom_kills(proc_cgroup: str | Path = "/proc/self/cgroup", root: str | Path = CGROUP_ROOT) -> int | None:
    """How many processes the kernel's OOM killer has killed in this process's memory cgroup (and the cgroups below
    it): cgroup v2 ``memory.events`` or v1 ``memory.oom_control``, field ``oom_kill``. A rank killed for host memory
    (a Slurm job's memory limit, a container's) leaves no result file and torchrun exits 1: this counter is what
    says it was memory. None where no memory cgroup is readable (the run is then judged without it).

    The path /proc/self/cgroup names may include a prefix this namespace's mount does not show (a container whose
    own cgroup is the mount's root): leading components are dropped until the file exists."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    root = Path(root)
    tries: list[tuple[Path, str, str]] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            tries.append((root / "memory", path, "memory.oom_control"))  # v1
        elif controllers == "":
            tries.append((root, path, "memory.events"))  # v2 (unified)
    for base, path, name in tries:
        parts = [p for p in path.split("/") if p]
        for i in range(len(parts) + 1):
            f = base.joinpath(*parts[i:], name)
            try:
                text = f.read_text()
            except OSError:
                continue
            for field in text.splitlines():
                key, _, val = field.partition(" ")
                if key == "oom_kill" and val.strip().isdigit():
                    return int(val)
            break  # the file is there but counts no kills (an old kernel): this hierarchy cannot say
    return None


def launch(spec: dict[str, Any], out: str | Path, *, log=None) -> tuple[dict[str, Any], int]:
    """Run the proxy, write the RECORD to ``out`` atomically; returns (record, exit code). ``log``: where torchrun's
    output goes (a file with a descriptor), the process's stderr at call time by default (a default bound at import
    would keep whatever stream was current then, e.g. a test's capture buffer)."""
    log = sys.stderr if log is None else log
    out = Path(out)
    _stale_work_dirs(out, spec["id"])
    parent = watched_parent()
    proc: subprocess.Popen | None = None
    work = Path(tempfile.mkdtemp(prefix=f".{spec['id']}.", dir=out.parent if out.parent.exists() else None))
    try:
        with _signals_raise():
            try:
                spec_path = work / "spec.json"
                write_json(spec_path, spec)
                rank_dir = work / "ranks"
                rank_dir.mkdir()
                cmd = torchrun_command(spec, str(spec_path), str(rank_dir))
                env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
                t0 = time.monotonic()
                kills0 = oom_kills()
                _prctl()  # resolved here, in the parent
                # no signal between fork and ``proc = ``: the handler must always know what to kill
                blocked = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
                try:
                    proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env, start_new_session=True,
                                            preexec_fn=_torchrun_preexec)
                finally:
                    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
                rc, timed_out = _wait(proc, t0 + spec["timeout_s"], parent)
            except Interrupted as e:
                took = kill_tree(proc) if proc is not None else 0.0
                print(f"proxy {spec['id']}: interrupted ({e.why}); process tree killed in {took:.1f} s, "
                      "no record written", file=log, flush=True)
                raise SystemExit(128 + e.signum) from None
        wall = time.monotonic() - t0
        kills = oom_kills()
        ranks = [_rank_result(p) for p in sorted(rank_dir.glob("rank*.json"))]
        record = assemble_record(spec, ranks, timed_out=timed_out, returncode=rc, wall_s=wall,
                                 host_oom_kills=kills - kills0 if kills is not None and kills0 is not None else 0)
        write_json(out, record)
        return record, (1 if record["status"] == "error" else 0)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _wait(proc: subprocess.Popen, deadline: float, parent: tuple[int, int, str] | None) -> tuple[int, bool]:
    """Wait for torchrun: (exit code, timed out). Past ``deadline`` the tree is killed (status ``timeout``);
    if ``parent`` (the Snakemake run) is gone, :class:`Interrupted` is raised."""
    while True:
        try:
            return proc.wait(timeout=max(0.0, min(POLL_S, deadline - time.monotonic()))), False
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() >= deadline:
            kill_tree(proc)
            return proc.wait(), True
        if parent is not None and not running(parent[0], parent[1]):
            raise Interrupted(signal.SIGTERM, f"its {parent[2]} (pid {parent[0]}) exited")


def _rank_result(path: Path) -> dict[str, Any]:
    """One rank's result file; an unreadable one (a rank killed mid-write) is an error result, not a crash."""
    try:
        res = read_json(path)
        if isinstance(res, dict):
            return res
        why = f"not a JSON object ({type(res).__name__})"
    except (OSError, ValueError) as e:
        why = f"{type(e).__name__}: {e}"
    return {"rank": int(path.stem.removeprefix("rank") or -1), "status": "error",
            "message": f"unreadable rank result {path.name}: {why}"}
