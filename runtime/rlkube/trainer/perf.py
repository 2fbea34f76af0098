"""How fast the trainer turns tokens into updates: tokens/s, model FLOPs per token, and MFU.

The FLOPs convention is prime-rl's (and torchtitan's, with attention halved for causality), so
`perf/mfu` compares like for like with their published tables:

    flops_per_token = 6 * matmul_params + 6 * layers * heads * head_dim * seq_len

- `6 * matmul_params`: every weight of a matrix multiply (each `nn.Linear`: the attention and
  MLP projections and the LM head; not the embedding lookup, not the norms) costs 2 FLOPs per
  token forward and 4 backward.
- `6 * layers * heads * head_dim * seq_len`: `QK^T` and `PV` (2 matmuls x 2 FLOPs x
  `heads * head_dim`) per pair of query and key, x3 for forward + backward, over HALF the
  `seq_len x seq_len` pairs: full causal attention over the packed row, as if it held one
  sequence. Packed rows attend only within each sample (and its shared prompt), so this
  over-counts attention for rows of many short samples, exactly as prime-rl's figure does.
- Model FLOPs, not hardware FLOPs: the recompute of activation checkpointing is not counted.

MFU = tokens/s per device x flops_per_token / the device's peak FLOP/s: dense bf16 tensor-core
peaks of the GPUs in `PEAK_FLOPS` (matched by device name), or `trainer.perf.peak_flops`. A
device with neither (a CPU) has no MFU.
"""

import torch
from torch import nn

PEAK_FLOPS = (
    ("H200", 989.5e12),
    ("H100 PCIe", 756.0e12),
    ("H100", 989.5e12),
    ("A100", 312.0e12),
)
"""Dense bf16 peak FLOP/s per device, by a part of `torch.cuda.get_device_name()` (first
match wins: the PCIe H100 before the SXM/NVL one). Sources: NVIDIA's data sheets."""


def matmul_params(model: nn.Module) -> int:
    """Weights of every `nn.Linear` (global sizes under FSDP2): the parameters each token
    multiplies through. A tied LM head is counted (it is a matmul), the embedding lookup is not."""
    return sum(module.weight.numel() for module in model.modules() if isinstance(module, nn.Linear))


def attention_shape(config) -> tuple[int, int, int]:
    """(layers, query heads, head dim) of a Hugging Face decoder config."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return config.num_hidden_layers, heads, head_dim


def peak_flops(device: torch.device, override: float | None = None) -> float | None:
    """Peak FLOP/s of one `device`: `override` when given, the table's for a known GPU, else None."""
    if override is not None:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for part, flops in PEAK_FLOPS if part in name), None)


class Throughput:
    """`perf/*` metrics of one step of `model` over `world_size` devices of `peak` FLOP/s each
    (None: no MFU)."""

    def __init__(self, model: nn.Module, world_size: int, peak: float | None):
        self.matmul_params = matmul_params(model)
        self.attention_shape = attention_shape(model.config)
        self.world_size = world_size
        self.peak = peak

    def flops_per_token(self, seq_len: int) -> float:
        layers, heads, head_dim = self.attention_shape
        return 6 * self.matmul_params + 6 * layers * heads * head_dim * seq_len

    def metrics(self, tokens: int, seconds: float, seq_len: int) -> dict[str, float]:
        """`tokens` trained (all ranks) in `seconds`, in rows of `seq_len` tokens."""
        tokens_per_s = tokens / max(seconds, 1e-9)
        metrics = {"perf/tokens_per_s": tokens_per_s}
        if self.peak is not None:
            metrics["perf/mfu"] = tokens_per_s / self.world_size * self.flops_per_token(seq_len) / self.peak
        return metrics
