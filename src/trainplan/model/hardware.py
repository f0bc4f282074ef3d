"""The hardware: :class:`GPUSpec` (each with its datasheet citation), the GPU table, :class:`ClusterSpec`."""

from __future__ import annotations

from dataclasses import dataclass

from trainplan.model.base import ConfigError, one_of, positive_int, positive_num

# ----------------------------------------------------------------------------------------------- gpu
GENERATIONS = ("a100", "h100")


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    name: str
    peak_bf16_flops: float  # dense
    hbm_bytes: int  # usable by the framework
    hbm_bw_Bps: float
    source: str = ""
    # Compute generation: selects the Efficiency fitted on that generation's published runs (efficiency.py).
    # H200 has H100 compute (NVIDIA spec), so it shares the H100 fit; its larger HBM enters through hbm_*.
    generation: str = "h100"
    # FP8 tensor cores (Hopper: dense FP8 = 2 × dense BF16, NVIDIA H100 datasheet 1,979 vs 989 TFLOP/s).
    fp8: bool = True
    # NVLink bandwidth per GPU, GB/s both directions (datasheet). The cluster's busbw defaults were measured on
    # NVLink4 nodes (DGX_LINKS_NVLINK_GBps); on another fabric they overstate its links (link_default_notes).
    nvlink_GBps: float = 900.0
    # PCIe host link per GPU, GB/s both directions (datasheet: Gen5 x16 128, Gen4 x16 64). ClusterSpec's
    # host_to_device default was set for Gen5 (DGX_HOST_PCIE_GBps); on Gen4 it overstates the link (link_default_notes).
    pcie_GBps: float = 128.0

    def __post_init__(self) -> None:
        positive_num(self, "peak_bf16_flops", "hbm_bytes", "hbm_bw_Bps")
        one_of(self, "generation", GENERATIONS)


# Sources: ../data/SOURCES.md (NVIDIA spec sheets; usable HBM from MLPerf v4.0 eos system file).
GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in [
        GPUSpec(name="h100-sxm-80gb", peak_bf16_flops=989e12, hbm_bytes=81559 * 1024**2, hbm_bw_Bps=3.35e12,
                source="NVIDIA H100 datasheet (dense BF16 989 TFLOP/s); 81,559 MiB usable (MLPerf v4.0 eos)"),
        GPUSpec(name="h100-pcie-80gb", peak_bf16_flops=756e12, hbm_bytes=81559 * 1024**2, hbm_bw_Bps=2.0e12,
                source="NVIDIA H100 datasheet (PCIe: dense BF16 756 TFLOP/s, 2.0 TB/s; NVLink bridge 600 GB/s, "
                       "pairs of GPUs only)", nvlink_GBps=600.0),
        GPUSpec(name="h200-141gb", peak_bf16_flops=989e12, hbm_bytes=143771 * 1024**2, hbm_bw_Bps=4.8e12,
                source="NVIDIA H200 datasheet (H100 compute; 141 GB HBM3e, 4.8 TB/s); 143,771 MiB: nvidia-smi's "
                       "memory.total on the H200 this project measured (data/calibration/h200-2026-12-04/"
                       "environment.json)"),
        GPUSpec(name="a100-80gb", peak_bf16_flops=312e12, hbm_bytes=81251 * 1024**2, hbm_bw_Bps=2.039e12,
                source="NVIDIA A100 datasheet (312 TFLOP/s BF16, 2.0 TB/s; NVLink3 600 GB/s; PCIe Gen4 64 GB/s; no "
                       "FP8 tensor cores); 81,251 MiB usable [I]: 80 GiB less a driver reserve like H100's, not "
                       "measured here",
                generation="a100", fp8=False, nvlink_GBps=600.0, pcie_GBps=64.0),
    ]
}


def resolve_gpu(name: str | GPUSpec) -> GPUSpec:
    if isinstance(name, GPUSpec):
        return name
    if name not in GPUS:
        key = str(name).strip().lower()
        near = [g for g in GPUS if key and (g.startswith(key) or key.startswith(g.split("-")[0]))]
        hint = f" (did you mean {' or '.join(near)}?)" if near else ""
        raise ConfigError("gpu", name, "must be one of " + ", ".join(GPUS) + hint)
    return GPUS[name]


# ------------------------------------------------------------------------------------------- cluster
# The fabric ClusterSpec's link defaults were measured on: DGX H100 (NVLink4, 900 GB/s per GPU; 8 × 400G NICs).
DGX_LINKS_NVLINK_GBps = 900.0
# ClusterSpec's defaults: nccl-tests #212, #290 measure 365–370 GB/s for the ring in a node and #290, #309 46–48 per
# rail across nodes (SOURCES.md); each taken at its low end, rounded down [I]
DGX_INTRA_BUSBW_GBps, DGX_INTER_BUSBW_GBps = 360.0, 46.0
# ClusterSpec's host link default: PCIe Gen5 x16 (128 GB/s both directions, 64 each way; H100 and H200 datasheets)
# at ~80% of its line rate each way [I], not measured here.
DGX_HOST_PCIE_GBps, HOST_TO_DEVICE_GBps = 128.0, 50.0


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """Nodes of identical GPUs. Bandwidths are NCCL *bus* bandwidths per GPU (nccl-tests convention)."""

    nodes: int
    gpus_per_node: int
    gpu: GPUSpec
    intra_busbw_Bps: float = DGX_INTRA_BUSBW_GBps * 1e9  # NVLink4 ring all-gather/reduce-scatter, 8×H100 (nccl-tests #212, #290)
    inter_busbw_Bps: float = DGX_INTER_BUSBW_GBps * 1e9  # per GPU rail, 400G IB (nccl-tests #290, #309)
    intra_latency_s: float = 30e-6  # NCCL tuning.cc / nccl-tests #232
    inter_latency_s: float = 50e-6
    nics_per_node: int = 8
    host_to_device_Bps: float = HOST_TO_DEVICE_GBps * 1e9  # PCIe 5 x16 each way, ~80% of line rate [I]
    host_mem_bytes: int = 2 * 1000**4  # DGX H100: 2 TB

    def __post_init__(self) -> None:
        positive_int(self, "nodes", "gpus_per_node", "nics_per_node")
        positive_num(self, "intra_busbw_Bps", "inter_busbw_Bps", "intra_latency_s", "inter_latency_s",
                      "host_to_device_Bps", "host_mem_bytes")
        if not isinstance(self.gpu, GPUSpec):
            object.__setattr__(self, "gpu", resolve_gpu(self.gpu))

    @property
    def n_gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def link_default_notes(cluster: ClusterSpec, intra_name: str, inter_name: str, host_name: str) -> list[str]:
    """A warning when the links the cluster uses (intra with > 1 GPU per node, inter with > 1 node; named as the
    caller's key or flag) are at DGX H100's measured busbw (the defaults, and the default study's values) on a GPU
    with another NVLink fabric (A100 NVLink3, H100 PCIe bridges): they then likely overstate its links. H200 shares
    NVLink4. Likewise the host link (``host_name``: CPU offload, checkpoint staging) left at the PCIe Gen5 default on
    a GPU with another PCIe generation (A100: Gen4)."""
    gpu = cluster.gpu
    notes = []
    if gpu.nvlink_GBps != DGX_LINKS_NVLINK_GBps:
        links = ((intra_name, cluster.gpus_per_node > 1, cluster.intra_busbw_Bps / 1e9, DGX_INTRA_BUSBW_GBps),
                 (inter_name, cluster.nodes > 1, cluster.inter_busbw_Bps / 1e9, DGX_INTER_BUSBW_GBps))
        same = [f"{name}={v:g}" for name, used, v, dgx in links if used and v == dgx]
        if same:
            notes.append(f"{' and '.join(same)} GB/s: the busbw nccl-tests measures on DGX H100 (NVLink4, "
                         f"{DGX_LINKS_NVLINK_GBps:.0f} GB/s per GPU; 400G NICs); {gpu.name} has "
                         f"{gpu.nvlink_GBps:.0f} GB/s of NVLink per GPU, so this likely overstates its links: set "
                         "your nodes' nccl-tests busbw")
    if gpu.pcie_GBps != DGX_HOST_PCIE_GBps and cluster.host_to_device_Bps == HOST_TO_DEVICE_GBps * 1e9:
        notes.append(f"{host_name}={HOST_TO_DEVICE_GBps:g} GB/s: the default for PCIe Gen5 x16 "
                     f"({DGX_HOST_PCIE_GBps:.0f} GB/s both directions); {gpu.name}'s PCIe is {gpu.pcie_GBps:.0f} "
                     "GB/s, so this likely overstates its host link (CPU offload, checkpoint staging): set your "
                     "nodes' figure (the same fraction of its line rate: "
                     f"{HOST_TO_DEVICE_GBps * gpu.pcie_GBps / DGX_HOST_PCIE_GBps:g})")
    return notes
