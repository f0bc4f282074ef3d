"""Scheduler resources of one proxy job, derived from its RUN_SPEC (hence from the ``proxies`` config).

The proxy rule (``rules/proxies.smk``) asks for what its RUN_SPEC will use, so the Slurm profile holds only
site values (partition, account) and nothing has to be kept in step by hand:

* ``nodes``: the spec's ``nnodes``;
* GPUs (``device: cuda`` only): ``gres="gpu:<nproc_per_node>"``, i.e. ``sbatch --gres=gpu:N``, which Slurm
  reads *per node* (a 2-node proxy gets N GPUs on each node). ``device: cpu`` asks for no GPU at all;
* CPUs: one ``--cpus-per-task`` per node (the plugin submits one task per node for GPU jobs and
  ``--ntasks=tasks`` otherwise): ``nproc_per_node`` ranks x ``CPUS_PER_RANK[device]``;
* ``tasks`` (CPU jobs only; for GPU jobs the plugin would turn it into ``--ntasks-per-gpu``): one per node,
  so ``--nodes=2`` is not shrunk to one node by a single task;
* ``runtime`` (minutes): the harness kills a proxy after ``timeout_s`` and records ``status: timeout``,
  plus ``STARTUP_MIN`` for the interpreter, torch import, rendezvous and the record;
* ``mem_mb``: ``MEM_MB_PER_RANK[device]`` per rank on a node.

Everything stays overridable from the command line (``--set-resources proxy_run:mem_mb=...``).
"""

from __future__ import annotations

import math
from typing import Any

CPUS_PER_RANK = {"cuda": 8, "cpu": 1}  # cuda: torchrun worker + data loading per GPU rank; cpu: the rank itself
MEM_MB_PER_RANK = {"cuda": 32000, "cpu": 1500}  # host RAM per rank (a full 8-GPU node: 256 GB)
STARTUP_MIN = 10

__all__ = ["CPUS_PER_RANK", "MEM_MB_PER_RANK", "STARTUP_MIN", "proxy_job_resources"]


def proxy_job_resources(spec: dict[str, Any]) -> dict[str, Any]:
    """``{nodes, cpus_per_task, mem_mb, runtime, gres, tasks}`` for one RUN_SPEC (see the module docstring).

    ``gres`` is ``""`` for CPU proxies (the plugin then adds no GPU flag); ``tasks`` is 0 for GPU proxies
    (the plugin adds no ``--ntasks-per-gpu`` for a value below 1 and Slurm's default is one task per node).
    """
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
        "tasks": 0 if gpu else nodes,
    }
