"""A throwaway Slurm 22.05 cluster on localhost (root, no systemd), for the e2e tests.

One node by default (the machine itself). ``nodes=K`` emulates K nodes on this one machine: K slurmd
daemons (``slurmd -N tpnI``), each with its own port, spool, log and pid file, all at NodeAddr 127.0.0.1 and
with a share of the CPUs — real Slurm node boundaries (SLURM_NODEID, SLURMD_NODENAME, srun across nodes)
on one physical host.

slurm.conf lives in a temp dir (``SLURM_CONF``) and, because ``srun`` inside batch jobs only finds the
default path, is also copied to /etc/slurm/slurm.conf when none exists there — and removed afterwards (a
leftover slurm.conf makes every later ``snakemake`` call stall). Daemons are stopped by the PIDs started here.

Ports, /etc/slurm/slurm.conf and munged are per machine, so two clusters at once (two pytest processes)
would take each other's jobs: ``local_slurm`` holds an exclusive lock (``LOCK``) for its whole lifetime,
and a second one waits for the first to finish.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

PARTITION = "cpu"  # the test cluster's only partition: one node, CPUs only (no GPUs, no GresTypes)

CONF = """ClusterName=trainplan-test
SlurmctldHost={host}
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
SlurmctldPort=16817
SlurmdPort=16818
ReturnToService=2
MpiDefault=none
SlurmctldParameters=enable_configless
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
{node_lines}
PartitionName={partition} Nodes={node_list} Default=YES MaxTime=60 State=UP
"""
LOCK = Path("/tmp/trainplan-local-slurm.lock")
LOCK_WAIT_S = 1800
EMULATED_PREFIX = "tpn"  # emulated node names tpn1..tpnK
EMULATED_PORT0 = 16830


def _nodes(host: str, k: int, cpus: int, mem: int) -> tuple[list[str], str]:
    """The NodeName lines and the node names: the host itself, or K emulated nodes on 127.0.0.1."""
    if k == 1:
        return [host], f"NodeName={host} NodeHostname={host} CPUs={cpus} RealMemory={mem} State=UNKNOWN"
    names = [f"{EMULATED_PREFIX}{i}" for i in range(1, k + 1)]
    lines = [f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={EMULATED_PORT0 + i} "
             f"CPUs={max(1, cpus // k)} RealMemory={mem // k} State=UNKNOWN" for i, n in enumerate(names, 1)]
    return names, "\n".join(lines)


def available() -> str | None:
    """None if a local cluster can be started here, else why not."""
    if os.geteuid() != 0:
        return "needs root"
    for exe in ("slurmctld", "slurmd", "munged", "sbatch", "squeue"):
        if not shutil.which(exe):
            return f"{exe} not installed"
    return None


@contextmanager
def _machine_lock(timeout_s: float = LOCK_WAIT_S):
    """One local cluster per machine at a time (see the module docstring)."""
    with open(LOCK, "a") as f:
        deadline = time.time() + timeout_s
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.time() > deadline:
                    raise TimeoutError(f"another local Slurm test cluster held {LOCK} for {timeout_s:.0f} s") from None
                time.sleep(2)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextmanager
def local_slurm(tmp: Path, nodes: int = 1):
    with _machine_lock(), _local_slurm(tmp, nodes) as env:
        yield env


@contextmanager
def _local_slurm(tmp: Path, nodes: int = 1):
    d = tmp / "slurm"
    host = socket.gethostname()
    mem = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.8)
    names, node_lines = _nodes(host, nodes, os.cpu_count() or 2, mem)
    for sub in ("state", *(f"spool/{n}" for n in names)):
        (d / sub).mkdir(parents=True, exist_ok=True)
    conf = d / "slurm.conf"
    conf.write_text(CONF.format(host=host, d=d, node_lines=node_lines, node_list=",".join(names),
                                partition=PARTITION))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    procs: list[subprocess.Popen] = []
    system_conf = Path("/etc/slurm/slurm.conf")
    placed = False
    try:
        if not system_conf.exists():
            system_conf.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(conf, system_conf)
            placed = True
        key = Path("/etc/munge/munge.key")
        if not key.exists():
            key.parent.mkdir(parents=True, exist_ok=True)
            key.write_bytes(os.urandom(1024))
            key.chmod(0o400)
        for p in ("/run/munge", "/var/log/munge", "/var/lib/munge"):
            Path(p).mkdir(parents=True, exist_ok=True)
        procs.append(subprocess.Popen(["munged", "-F", "--force"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        time.sleep(1)
        procs.append(subprocess.Popen(["slurmctld", "-D", "-f", str(conf)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        time.sleep(2)
        for n in names:
            procs.append(subprocess.Popen(["slurmd", "-D", "-f", str(conf), *(["-N", n] if nodes > 1 else [])],
                                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        deadline = time.time() + 60
        while time.time() < deadline:
            r = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], env=env, capture_output=True, text=True)
            states = r.stdout.split()
            if r.returncode == 0 and len(states) == nodes and set(states) <= {"idle", "mix"}:
                break
            time.sleep(1)
        else:
            raise RuntimeError(f"Slurm did not come up: {(d / 'slurmctld.log').read_text()[-2000:]}")
        yield env
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        conf.unlink(missing_ok=True)
        if placed:
            system_conf.unlink(missing_ok=True)
