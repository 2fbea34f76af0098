"""How fast the trainer turns tokens into updates: tokens/s, model FLOPs, and MFU two ways.

`perf/mfu` counts the work the step really does:

    flops = 6 * matmul_params * tokens + 12 * layers * heads * head_dim * attention_pairs

- `6 * matmul_params * tokens`: every weight of a matrix multiply (each `nn.Linear`: the
  attention and MLP projections and the LM head; not the embedding lookup, not the norms) costs
  2 FLOPs per token forward and 4 backward. `tokens`: the samples' and shared prompts' tokens,
  not padding.
- `12 * layers * heads * head_dim * attention_pairs`: `QK^T` and `PV` (2 matmuls x 2 FLOPs x
  `heads * head_dim`) per query-key pair, x3 for forward + backward, over the pairs the packed
  rows' mask lets through (`rlkube.trainer.rl.attention.visible_pairs`): causal within each
  sample and its shared prompt, padding's queries not counted. A 16k row of sixteen 1k samples
  attends over ~1k keys per token, not the ~8k that full causal attention over the row would.

`perf/mfu_primerl` is prime-rl's figure (`prime_rl/trainer/perf.py`, `PerfCounter` with one
`seq_len`), the convention of its published tables, kept so they compare like for like:

    flops_per_token = 6 * matmul_params + 12 * layers * hidden_size * seq_len

Its attention term counts `12 * layers * heads * q` FLOPs per pair with `q = hidden_size /
heads` (not `head_dim`), over every pair of the row's `seq_len x seq_len` square (no causal
half): for Qwen3-0.6B (`q = head_dim / 2`) that is causal attention over the whole packed row,
for Qwen3-1.7B (`q = head_dim`) twice that. For rows of many short samples either counts far
more attention than is done.

Both are model FLOPs, not hardware FLOPs: the recompute of activation checkpointing and the
masked-out half of FlexAttention's diagonal blocks are not counted. MFU = FLOPs per second per
device / the device's peak FLOP/s: dense bf16 tensor-core peaks of the GPUs in `PEAK_FLOPS`
(matched by device name), or `trainer.metrics.peak_flops`. A device with neither (a CPU) has
no MFU.
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
        layers, heads, head_dim = attention_shape(model.config)
        self.flops_per_pair = 12 * layers * heads * head_dim
        self.primerl_flops_per_pair = 12 * layers * model.config.hidden_size
        self.world_size = world_size
        self.peak = peak

    def flops(self, tokens: int, attention_pairs: int) -> float:
        """Model FLOPs of training `tokens` whose queries see `attention_pairs` keys in all."""
        return 6 * self.matmul_params * tokens + self.flops_per_pair * attention_pairs

    def primerl_flops_per_token(self, seq_len: int) -> float:
        """prime-rl's FLOPs per token of rows of `seq_len` tokens, whatever they hold."""
        return 6 * self.matmul_params + self.primerl_flops_per_pair * seq_len

    def metrics(self, tokens: int, attention_pairs: int, seconds: float, seq_len: int) -> dict[str, float]:
        """`tokens` trained (all ranks) in `seconds`, in rows of `seq_len` tokens, their queries
        seeing `attention_pairs` keys in all (`visible_pairs`, all ranks)."""
        seconds = max(seconds, 1e-9)
        metrics = {"perf/tokens_per_s": tokens / seconds}
        if self.peak is not None:
            device_flops = seconds * self.world_size * self.peak
            metrics["perf/mfu"] = self.flops(tokens, attention_pairs) / device_flops
            metrics["perf/mfu_primerl"] = tokens * self.primerl_flops_per_token(seq_len) / device_flops
        return metrics
