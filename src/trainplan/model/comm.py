"""α–β cost of NCCL collectives, per link class, with nccl-tests bus-bandwidth conventions.

``busbw`` is what nccl-tests reports; the bytes a rank must move follow from it (NVIDIA/nccl-tests
``doc/PERFORMANCE.md``): all-reduce algbw = busbw·n/(2(n−1)); all-gather, reduce-scatter and all-to-all
algbw = busbw·n/(n−1). Time = α + bytes/algbw, with ``bytes`` the full (unsharded) buffer size.

Group placement follows the torchtitan/Megatron rank order (TP innermost, then CP, then DP, PP outermost):
a group of ``size`` ranks spaced ``stride`` apart stays inside one node when size·stride ≤ GPUs per node
and then uses the NVLink bus bandwidth; otherwise it crosses nodes and each node's ranks of the group
drive their own NIC rails (inter-node bus bandwidth per rail × rails in use, capped by NVLink).
Every function broadcasts over numpy arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainplan.model.efficiency import Efficiency
from trainplan.model.hardware import ClusterSpec

__all__ = [
    "all_gather_s", "all_reduce_s", "all_to_all_s", "group_link", "p2p_s", "reduce_scatter_s",
]

Array = Any


def group_link(cluster: ClusterSpec, size: Array, stride: Array) -> tuple[Array, Array]:
    """(busbw_Bps, latency_s) of a group of ``size`` ranks ``stride`` apart (nccl-tests #290 rail model)."""
    size = np.asarray(size)
    stride = np.asarray(stride)
    gpn = cluster.gpus_per_node
    inside = size * stride <= gpn
    ranks_per_node = np.clip(gpn // np.maximum(stride, 1), 1, np.maximum(size, 1))
    rails = ranks_per_node * (cluster.nics_per_node / gpn)
    inter = np.minimum(cluster.intra_busbw_Bps, cluster.inter_busbw_Bps * rails)
    busbw = np.where(inside, cluster.intra_busbw_Bps, inter)
    lat = np.where(inside, cluster.intra_latency_s, cluster.inter_latency_s)
    return busbw, lat


def _time(nbytes: Array, size: Array, busbw: Array, lat: Array, eff: Efficiency, factor: Array) -> Array:
    size = np.asarray(size)
    moved = np.asarray(nbytes, dtype=float) * factor
    t = lat + moved / (busbw * eff.comm_bw_eff)
    return np.where(size > 1, t, 0.0)


def all_reduce_s(nbytes: Array, size: Array, busbw: Array, lat: Array, eff: Efficiency) -> Array:
    """All-reduce: algbw = busbw·n/(2(n−1)) (nccl-tests PERFORMANCE.md)."""
    n = np.maximum(np.asarray(size), 1)
    return _time(nbytes, size, busbw, lat, eff, 2.0 * (n - 1) / n)


def all_gather_s(nbytes: Array, size: Array, busbw: Array, lat: Array, eff: Efficiency) -> Array:
    """All-gather of an ``nbytes`` output buffer: algbw = busbw·n/(n−1) (nccl-tests PERFORMANCE.md)."""
    n = np.maximum(np.asarray(size), 1)
    return _time(nbytes, size, busbw, lat, eff, (n - 1) / n)


def reduce_scatter_s(nbytes: Array, size: Array, busbw: Array, lat: Array, eff: Efficiency) -> Array:
    """Reduce-scatter of an ``nbytes`` input buffer: algbw = busbw·n/(n−1) (nccl-tests PERFORMANCE.md)."""
    return all_gather_s(nbytes, size, busbw, lat, eff)


def all_to_all_s(nbytes: Array, size: Array, busbw: Array, lat: Array, eff: Efficiency) -> Array:
    """All-to-all of an ``nbytes`` buffer per rank: algbw = busbw·n/(n−1) (nccl-tests PERFORMANCE.md)."""
    return all_gather_s(nbytes, size, busbw, lat, eff)


def p2p_s(nbytes: Array, crosses_node: Array, cluster: ClusterSpec, eff: Efficiency) -> Array:
    """One send/recv between neighbouring pipeline stages: α + bytes/bw of the link it uses."""
    bw = np.where(crosses_node, cluster.inter_busbw_Bps, cluster.intra_busbw_Bps) * eff.comm_bw_eff
    lat = np.where(crosses_node, cluster.inter_latency_s, cluster.intra_latency_s)
    return lat + np.asarray(nbytes, dtype=float) / bw
