"""Memory per GPU of a run, estimated from the model's shape before anything starts.

`rlkube rl --dry-run` and `rlkube sft --dry-run` print it; with `gpu` set, a config that does
not fit is refused with these numbers. The model is built on the meta device from its
`config.json` (`rlkube.models.architectures`: no weights, no network for the models `configs/`
names), and the trainer's memory is what its FSDP2 setup (`rlkube.trainer.model`) holds:

- per rank, a 1/world shard of the float32 weights, of their gradients and of AdamW's two
  moments (4 + 4 + 8 bytes a trainable parameter; a LoRA run's frozen base has weights only);
- while computing, compute-dtype copies of the root (embeddings, LM head) and of two decoder
  layers (the one running and the one prefetched; every layer with `reshard_after_forward`
  off), and the activations of one micro-batch (`micro_batch_size` rows of `seq_len` tokens):
  with activation checkpointing each layer's input, then the larger of one layer's recompute
  (with its gradient on the way to the reduce-scatter) and the log-probs' logits (the RL
  trainer's chunks of `LOGPROB_CHUNK` tokens; SFT's loss takes the whole micro-batch's);
- at the optimizer step, `torch.optim.AdamW`'s temporaries (its multi-tensor step holds one
  float32 copy of the shard's moments).

The peak is the states plus the larger of the last two. Checked against the H200 runs of
`benchmarks/trainer_throughput.py` (benchmarks/RESULTS.md: Qwen3-0.6B 12.3 GiB and Qwen3-1.7B
32.1 GiB peak allocated at 16k-token rows) in `tests/trainer/test_memory.py`. A config fits when
the peak times `ALLOCATOR_HEADROOM` (the caching allocator reserves more than is allocated:
1.19-1.27x in those runs) is within its share of the GPU. Inference is checked as vLLM starts:
its bf16 weights per tensor-parallel GPU and room in `gpu_memory_utilization` for the KV cache
of at least one `max_model_len` sequence.
"""

from dataclasses import dataclass

from torch import nn

from rlkube.config import LoraConfig, ModelConfig, RLConfig, SFTConfig, TrainerCommonConfig
from rlkube.config.gpus import GPUS
from rlkube.trainer.model import build_meta_model, decoder_layers
from rlkube.trainer.rl.packed import LOGPROB_CHUNK

GIB = 1024**3
ALLOCATOR_HEADROOM = 1.25
"""Reserved over allocated memory of the caching allocator (measured 1.19-1.27 on the H200)."""
RL_LOGITS_BYTES = 16
"""Bytes per (token, vocabulary entry) of one log-prob chunk: bf16 logits, their float32 copy
over temperature, log-softmax, and their gradients when the chunk is recomputed in backward."""
SFT_LOGITS_BYTES = 14
"""Bytes per (token, vocabulary entry) of SFT's cross entropy over the whole micro-batch."""


@dataclass(frozen=True)
class ModelShape:
    """What memory depends on, read off the meta-device model."""

    params: int
    trainable: int
    root_params: int
    """Parameters outside the decoder layers (embeddings, LM head, final norm)."""
    layer_params: int
    """Parameters of the largest decoder layer."""
    layers: int
    hidden: int
    vocab: int
    activation_bytes_per_token: int
    """Activations one decoder layer keeps per token in bf16 (float32 norms) during backward."""
    kv_bytes_per_token: int
    """KV cache per token over all layers, bf16 (vLLM)."""
    kv_heads: int
    max_position_embeddings: int


def _params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def model_shape(model: ModelConfig, lora: LoraConfig | None = None) -> ModelShape:
    """`model`'s shape, with `lora`'s adapters added (then only they train)."""
    meta = build_meta_model(model)
    if lora is not None:
        from rlkube.trainer.lora import apply_lora

        apply_lora(meta, lora)
    cfg = meta.config.get_text_config()
    layers = decoder_layers(meta)
    hidden, heads, kv_heads = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    attention = 4 * hidden + 2 * (hidden + (q_dim + 2 * kv_dim) + (q_dim + kv_dim) + q_dim + 2 * hidden)
    experts = getattr(cfg, "num_experts", None)
    if experts:  # each token's copy in each of its top-k experts, and the float32 router logits
        top_k, width = cfg.num_experts_per_tok, cfg.moe_intermediate_size
        mlp = 4 * hidden + 2 * hidden + 4 * experts + top_k * 2 * (2 * hidden + 4 * width) + 4 * hidden
    else:
        mlp = 4 * hidden + 2 * (hidden + 4 * cfg.intermediate_size + hidden)
    total = _params(meta)
    return ModelShape(
        params=total,
        trainable=sum(p.numel() for p in meta.parameters() if p.requires_grad),
        root_params=total - sum(_params(layer) for layer in layers),
        layer_params=max(_params(layer) for layer in layers),
        layers=len(layers),
        hidden=hidden,
        vocab=cfg.vocab_size,
        activation_bytes_per_token=attention + mlp,
        kv_bytes_per_token=2 * len(layers) * kv_dim * 2,
        kv_heads=kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
    )


@dataclass(frozen=True)
class TrainerMemory:
    """Bytes per trainer GPU."""

    weights: float
    gradients: float
    optimizer: float
    compute_copies: float
    activations: float
    optimizer_step: float

    @property
    def peak(self) -> float:
        states = self.weights + self.gradients + self.optimizer
        return states + max(self.compute_copies + self.activations, self.optimizer_step)

    def parts(self) -> str:
        named = (("weights", self.weights), ("gradients", self.gradients), ("optimizer state", self.optimizer),
                 ("compute copies", self.compute_copies), ("activations", self.activations),
                 ("optimizer step", self.optimizer_step))
        return ", ".join(f"{name} {gib(value)}" for name, value in named)


def trainer_memory(shape: ModelShape, trainer: TrainerCommonConfig, dtype_bytes: int, seq_len: int, world: int,
                   logits_bytes: int, logits_tokens: int | None) -> TrainerMemory:
    """One rank's memory among `world` FSDP2 ranks, at micro-batches of `trainer.micro_batch_size`
    rows of `seq_len` tokens; the logits of `logits_tokens` tokens at a time (None: all of them)."""
    tokens = trainer.micro_batch_size * seq_len
    parallel = trainer.parallel
    gathered_layers = 2 if parallel.reshard_after_forward else shape.layers
    copies = dtype_bytes * (shape.root_params + gathered_layers * shape.layer_params)
    layer_grad = (dtype_bytes + 4) * shape.layer_params * shape.trainable / shape.params
    logits = logits_bytes * min(tokens, logits_tokens or tokens) * shape.vocab
    if parallel.activation_checkpointing:
        saved = shape.layers * tokens * shape.hidden * dtype_bytes
        recompute = tokens * shape.activation_bytes_per_token * dtype_bytes / 2
        activations = saved + max(logits, recompute + layer_grad)
    else:
        activations = shape.layers * tokens * shape.activation_bytes_per_token * dtype_bytes / 2 + logits + layer_grad
    return TrainerMemory(
        weights=4 * shape.params / world,
        gradients=4 * shape.trainable / world,
        optimizer=8 * shape.trainable / world,
        compute_copies=copies,
        activations=activations,
        optimizer_step=4 * shape.trainable / world,
    )


def gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


@dataclass
class MemoryReport:
    lines: list[str]
    """What `--dry-run` prints."""
    problems: list[str]
    """Why a process does not fit the config's `gpu`, with the numbers (empty: it fits, or no
    `gpu` is named)."""


def _dtype_bytes(model: ModelConfig, device: str) -> int:
    if model.dtype == "float32" or (model.dtype == "auto" and device == "cpu"):
        return 4
    return 2


def _remedies(trainer: TrainerCommonConfig) -> str:
    remedies = ["add trainer GPUs (FSDP2 shards the states over them)", "lower micro_batch_size or the sequence length"]
    if not trainer.parallel.activation_checkpointing:
        remedies.append("turn on parallel.activation_checkpointing")
    if trainer.lora is None:
        remedies.append("train LoRA adapters (lora)")
    return ", ".join(remedies[:-1]) + " or " + remedies[-1]


def _trainer_lines(config: RLConfig | SFTConfig, trainer: TrainerCommonConfig, shape: ModelShape, seq_len: int,
                   world: int, share: float, rl: bool, report: MemoryReport) -> None:
    memory = trainer_memory(shape, trainer, _dtype_bytes(config.model, trainer.device), seq_len, world,
                            RL_LOGITS_BYTES if rl else SFT_LOGITS_BYTES, LOGPROB_CHUNK if rl else None)
    trains = (f"LoRA, {shape.trainable / 1e6:.1f}M of {shape.params / 1e9:.2f}B parameters train" if trainer.lora
              else f"{shape.params / 1e9:.2f}B parameters")
    checkpointing = "with" if trainer.parallel.activation_checkpointing else "without"
    needed = memory.peak * ALLOCATOR_HEADROOM
    report.lines += [
        (f"trainer memory per GPU, estimated ({config.model.name}: {trains}; {world} rank{'s' * (world > 1)}; "
         f"micro-batches of {trainer.micro_batch_size} x {seq_len} tokens {checkpointing} activation checkpointing):"),
        f"  {memory.parts()}",
        f"  peak {gib(memory.peak)}; x{ALLOCATOR_HEADROOM} for the allocator's headroom: {gib(needed)}",
    ]
    if config.gpu is None:
        return
    total = GPUS[config.gpu].memory_gib * GIB
    has = f"{config.gpu}'s {gib(total)}" + (f" x {share:.2f} (vLLM has the rest) = {gib(total * share)}"
                                            if share < 1 else "")
    if needed <= total * share:
        report.lines.append(f"  fits {has}")
        return
    report.lines.append(f"  does NOT fit {has}")
    report.problems.append(f"trainer: needs {gib(needed)} per GPU ({memory.parts()}; peak {gib(memory.peak)} x "
                           f"{ALLOCATOR_HEADROOM}) but has {has}: {_remedies(trainer)}")


def _inference_lines(config: RLConfig, shape: ModelShape, report: MemoryReport) -> None:
    """vLLM per GPU: the bf16 weights over the tensor-parallel GPUs, and KV cache in what
    `gpu_memory_utilization` leaves (before vLLM's activations and CUDA graphs)."""
    section = config.inference
    tp = section.tensor_parallel_size
    weights = 2 * shape.params / tp
    kv_per_token = shape.kv_bytes_per_token / min(tp, shape.kv_heads)
    max_len = section.max_model_len or shape.max_position_embeddings
    report.lines += [
        (f"inference memory per GPU, estimated ({section.replicas} replica{'s' * (section.replicas > 1)} of {tp} "
         f"GPU{'s' * (tp > 1)}):"),
        (f"  weights {gib(weights)}, KV cache {kv_per_token / 1024:.0f} KiB a token "
         f"({gib(kv_per_token * max_len)} for one {max_len}-token sequence)"),
    ]
    if config.gpu is None:
        return
    budget = GPUS[config.gpu].memory_gib * GIB * section.gpu_memory_utilization
    room = budget - weights
    has = f"gpu_memory_utilization {section.gpu_memory_utilization:g} of {config.gpu} = {gib(budget)}"
    report.lines.append(f"  {has}: {gib(room)} left for about {max(room, 0) / kv_per_token:,.0f} tokens of KV cache")
    if room < kv_per_token * max_len:
        report.problems.append(
            f"inference: {has} holds the weights ({gib(weights)}) but not the KV cache of one {max_len}-token "
            f"sequence ({gib(kv_per_token * max_len)}): raise inference.tensor_parallel_size or "
            "gpu_memory_utilization, or lower inference.max_model_len")


def rl_memory(config: RLConfig, world: int, trainer_share: float = 1.0) -> MemoryReport:
    """The memory report of an RL run whose trainer has `world` ranks, each on a GPU of which it
    gets `trainer_share` (less where an inference replica shares it: `rlkube rl` on one GPU)."""
    report = MemoryReport([], [])
    shape = model_shape(config.model, config.trainer.lora)
    _trainer_lines(config, config.trainer, shape, config.orchestrator.seq_len, world, trainer_share, True, report)
    _inference_lines(config, shape if config.trainer.lora is None else model_shape(config.model), report)
    return report


def sft_memory(config: SFTConfig, world: int) -> MemoryReport:
    """The memory report of an SFT run over `world` ranks."""
    report = MemoryReport([], [])
    shape = model_shape(config.model, config.lora)
    _trainer_lines(config, config, shape, config.data.seq_len, world, 1.0, False, report)
    return report
