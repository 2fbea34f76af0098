"""The GPUs a config can name (`gpu`): their memory, for the memory check of `--dry-run`, and
the `nvidia.com/gpu.product` label NVIDIA's GPU feature discovery puts on their nodes."""

from typing import Literal, NamedTuple


class Gpu(NamedTuple):
    memory_gib: float
    """Total memory as `nvidia-smi` reports it (MiB / 1024)."""
    product: str
    """The node label `nvidia.com/gpu.product` of the common (SXM) part."""


GPUS = {
    "A100-40GB": Gpu(40.0, "NVIDIA-A100-SXM4-40GB"),
    "A100-80GB": Gpu(80.0, "NVIDIA-A100-SXM4-80GB"),
    "H100-80GB": Gpu(79.6, "NVIDIA-H100-80GB-HBM3"),
    "H200": Gpu(140.4, "NVIDIA-H200"),
    "B200": Gpu(179.1, "NVIDIA-B200"),
}
GpuName = Literal[tuple(GPUS)]
