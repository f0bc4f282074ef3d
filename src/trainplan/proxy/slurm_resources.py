"""Scheduler resources of one proxy job, derived from its RUN_SPEC (hence from the ``proxies`` config).

The proxy rule (``rules/proxies.smk``) asks for what its RUN_SPEC will use, so the Slurm profile holds only
site values (partition, account) and nothing has to be kept in step by hand:

* ``nodes``: the spec's ``nnodes``;
* GPUs (``device: cuda`` only): ``gres="gpu:<nproc_per_node>"``, i.e. ``sbatch --gres=gpu:N``, which Slurm
  reads *per node* (a 2-node proxy gets N GPUs on each node). ``device: cpu`` asks for no GPU at all;
* CPUs: one ``--cpus-per-task`` per node (the plugin submits one task per node for GPU jobs and
  ``--ntasks=tasks`` otherwise): ``nproc_per_node`` ranks x ``CPUS_PER_RANK[device]``;
* ``tasks``: one per node (``--ntasks``), so ``--nodes=2`` is not shrunk to one node by a single task;
  ``tasks_per_gpu=0`` keeps the plugin from turning ``tasks`` into ``--ntasks-per-gpu`` on GPU jobs;
* ``mpi``: always present, ``"srun"`` for a multi-node proxy and ``""`` otherwise. Its presence makes the
  jobstep plugin run the job in the batch step instead of inside its ``srun -n1`` wrapper (a one-task step
  on one node: a launcher started there sees a 1-node allocation and could not start a step on the other
  nodes). The proxy launcher places the ranks itself: torchrun on one node, ``srun --ntasks-per-node=1``
  + torchrun across nodes. A non-empty value also makes the plugin submit ``--ntasks=<tasks>`` (its MPI
  path), which is what a multi-node proxy needs;
* ``runtime`` (minutes): the harness kills a proxy after ``timeout_s`` and records ``status: timeout``,
  plus ``STARTUP_MIN`` for the interpreter, torch import, rendezvous and the record;
* ``mem_mb``: ``MEM_MB_PER_RANK[device]`` per rank on a node.

Everything stays overridable from the command line (``--set-resources proxy_run:mem_mb=...``).
"""

from __future__ import annotations

import math
from typing import Any

CPUS_PER_RANK = {"cuda": 8, "cpu": 1}  # cuda: torchrun worker + data loading per GPU rank; cpu: the rank itself
# host RAM per rank (a full 8-GPU node: 256 GB). cpu: a rank at the default widths peaks near 1 GB (977 MB max RSS
# measured for a 1-rank proxy's process tree), and the job's cgroup also holds the jobstep's and the job's Snakemake
# processes (~160 MB each) and torchrun's agent: a cgroup OOM kill is a failed job, not a recorded `oom`
MEM_MB_PER_RANK = {"cuda": 32000, "cpu": 2500}
STARTUP_MIN = 10

__all__ = ["CPUS_PER_RANK", "MEM_MB_PER_RANK", "STARTUP_MIN", "proxy_job_resources"]


def proxy_job_resources(spec: dict[str, Any]) -> dict[str, Any]:
    """``{nodes, tasks, tasks_per_gpu, cpus_per_task, mem_mb, runtime, gres, mpi}`` for one RUN_SPEC (see
    the module docstring). ``gres`` is ``""`` for CPU proxies: the plugin then adds no GPU flag."""
    device = spec.get("device", "cpu")
    if device not in CPUS_PER_RANK:
        raise ValueError(f"proxy {spec.get('id')}: device={device!r}, expected one of {sorted(CPUS_PER_RANK)}")
    nodes = int(spec.get("nnodes", 1))
    nproc = int(spec.get("nproc_per_node", 1))
    if nodes < 1 or nproc < 1:
        raise ValueError(f"proxy {spec.get('id')}: nnodes={nodes}, nproc_per_node={nproc} (both must be >= 1)")
    gpu = device == "cuda"
    return {
        "nodes": nodes,
        "cpus_per_task": nproc * CPUS_PER_RANK[device],
        "mem_mb": nproc * MEM_MB_PER_RANK[device],
        "runtime": math.ceil(int(spec.get("timeout_s", 600)) / 60) + STARTUP_MIN,
        "gres": f"gpu:{nproc}" if gpu else "",
        "tasks": nodes,
        "tasks_per_gpu": 0,
        "mpi": "srun" if nodes > 1 else "",
    }


def restore_allocation_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """Put the allocation's ``SLURM_JOB_NUM_NODES`` / ``SLURM_JOB_NODELIST`` back into ``env`` (default:
    ``os.environ``) when a Slurm job id is set but they are not; returns what was set.

    The jobstep plugin (snakemake-executor-plugin-slurm-jobstep >= 0.6.1) starts the job with every
    ``SLURM_*`` variable removed except the job's identity, and the proxy launcher reads those two to choose
    its multi-node path; the controller still knows them (``scontrol show job -o <id>``).
    """
    import os
    import subprocess

    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job or (env.get("SLURM_JOB_NUM_NODES") and env.get("SLURM_JOB_NODELIST")):
        return {}
    r = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, check=False)
    fields = dict(f.split("=", 1) for f in r.stdout.split() if "=" in f)
    got = {k: fields[f] for k, f in (("SLURM_JOB_NUM_NODES", "NumNodes"), ("SLURM_JOB_NODELIST", "NodeList"))
           if fields.get(f) and not fields[f].startswith("(")}
    env.update(got)
    return got
