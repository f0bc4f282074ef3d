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
                source="NVIDIA H100 datasheet (PCIe: dense BF16 756 TFLOP/s, 2.0 TB/s)"),
        GPUSpec(name="h200-141gb", peak_bf16_flops=989e12, hbm_bytes=143771 * 1024**2, hbm_bw_Bps=4.8e12,
                source="NVIDIA H200 datasheet (H100 compute; 141 GB HBM3e, 4.8 TB/s)"),
        GPUSpec(name="a100-80gb", peak_bf16_flops=312e12, hbm_bytes=81251 * 1024**2, hbm_bw_Bps=2.039e12,
                source="NVIDIA A100 datasheet (312 TFLOP/s BF16, 2.0 TB/s; no FP8 tensor cores)", generation="a100",
                fp8=False),
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
@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """Nodes of identical GPUs. Bandwidths are NCCL *bus* bandwidths per GPU (nccl-tests convention)."""

    nodes: int
    gpus_per_node: int
    gpu: GPUSpec
    intra_busbw_Bps: float = 360e9  # NVLink4 ring all-gather/reduce-scatter, 8×H100 (nccl-tests #212, #290)
    inter_busbw_Bps: float = 46e9  # per GPU rail, 400G IB (nccl-tests #290, #309)
    intra_latency_s: float = 30e-6  # NCCL tuning.cc / nccl-tests #232
    inter_latency_s: float = 50e-6
    nics_per_node: int = 8
    host_to_device_Bps: float = 50e9  # PCIe 5 x16, each way
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
