"""Trainer configs: what the SFT and RL trainers share, and the RL loss."""

from typing import Literal

from pydantic import Field, model_validator

from rlkube.config.base import Config


class OptimizerConfig(Config):
    lr: float = Field(default=1e-6, gt=0)
    """Peak learning rate of AdamW."""

    weight_decay: float = Field(default=0.01, ge=0)
    """AdamW weight decay."""

    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""

    max_grad_norm: float | None = Field(default=1.0, gt=0)
    """Clip the global gradient norm to this; None disables clipping."""


class SchedulerConfig(Config):
    type: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate schedule after warm-up."""

    warmup_steps: int = Field(default=0, ge=0)
    """Linear warm-up from 0 to `optim.lr` over this many steps."""

    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)
    """For `linear` and `cosine`: the final learning rate as a fraction of the peak."""

    decay_steps: int | None = Field(default=None, ge=1)
    """For `linear` and `cosine`: decay over only the last this-many steps and hold the peak
    until then (warm-up-stable-decay). None decays over every step after warm-up."""

    @model_validator(mode="after")
    def _decay_needs_a_decaying_type(self):
        if self.decay_steps is not None and self.type == "constant":
            raise ValueError("decay_steps: a 'constant' schedule does not decay; use 'linear' or 'cosine'")
        return self


class ParallelConfig(Config):
    """FSDP2 data parallelism over all ranks of the `torchrun` job (the world size)."""

    reshard_after_forward: bool = True
    """Free gathered parameters after forward (ZeRO-3); False keeps them until backward (ZeRO-2)."""

    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward to save memory."""


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
"""The attention and MLP projections of Qwen3/Llama-style models."""


class LoraConfig(Config):
    """Train low-rank adapters on frozen base weights (LoRA): only the adapters are optimized,
    checkpointed and published to inference (`serving`)."""

    rank: int = Field(default=16, ge=1)
    """Rank r of each adapter (`B @ A` with A: r x in, B: out x r)."""

    alpha: float = Field(default=32.0, gt=0)
    """Scale numerator: the adapter adds `(alpha / rank) * B @ A` to the base weight."""

    dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout on the adapter's input while training (the base path has none)."""

    target_modules: list[str] = Field(default_factory=lambda: list(LORA_TARGETS), min_length=1)
    """Names of the linear layers to adapt (the last part of the module name, as in PEFT);
    each must name a linear layer of the model."""

    serving: Literal["adapter", "merge"] = "adapter"
    """RL: how inference serves the published adapters. `adapter`: with vLLM's LoRA support,
    loaded in place as the model `rlkube-policy`, the base weights untouched (the choice for
    large models). `merge`: added into the base weights, of which every inference worker keeps a
    host copy of each targeted tensor to merge into; no LoRA kernels on the decode path, which
    on CPU serves about twice as fast."""

    export_merged: bool = False
    """SFT export: also write the merged full weights (`weights/step_N_merged/`, what
    `weights/final` then points at) next to the adapter directory."""

    @property
    def scaling(self) -> float:
        """The factor `alpha / rank` on every adapter's output."""
        return self.alpha / self.rank

    @model_validator(mode="after")
    def _targets_are_unique(self):
        if len(set(self.target_modules)) != len(self.target_modules):
            raise ValueError(f"target_modules: {self.target_modules} names a module twice")
        return self


class TrainerMetricsConfig(Config):
    """Where the trainer's metrics go besides the console, `<output_dir>/metrics/` and W&B, and
    what its MFU is measured against (`rlkube.trainer.perf`)."""

    peak_flops: float | None = Field(default=None, gt=0)
    """Peak FLOP/s of one device, for `perf/mfu`. Unset: the dense bf16 peak of a known GPU
    (H100, H200, A100), and no `perf/mfu` on other devices (CPUs)."""

    prometheus_port: int | None = Field(default=None, ge=0, le=65535)
    """Serve every logged metric as a Prometheus gauge `rlkube_trainer_<name>` at
    `http://<prometheus_host>:<port>/metrics` (rank 0); None serves none."""

    prometheus_host: str = "127.0.0.1"
    """The address the Prometheus endpoint binds; `0.0.0.0` to be scraped from other machines."""


class TrainerCommonConfig(Config):
    """What the SFT trainer and the RL trainer share."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to train. `auto` picks CUDA when available."""

    cpu_threads: int | None = Field(default=None, ge=1)
    """Intra-op threads per rank when training on CPU (`torch.set_num_threads`); torch's
    default, one per core, when unset. Set it below the core count when other busy processes
    share the cores (the RL trainer beside vLLM on one machine): each op waits for its
    slowest thread, and a thread on a busy core is slow."""

    peer_timeout_s: float = Field(default=10.0, gt=0)
    """Seconds without a peer rank's heartbeat (or an answer from torchrun's store) before a
    rank exits 75 so the gang restarts, instead of blocking in a collective until the process
    group's timeout (30 minutes for gloo). Ranks heartbeat every fifth of it; applies only to a
    world of more than one rank."""

    optim: OptimizerConfig = OptimizerConfig()
    """Optimizer."""

    scheduler: SchedulerConfig = SchedulerConfig()
    """Learning-rate schedule."""

    parallel: ParallelConfig = ParallelConfig()
    """Data parallelism (FSDP2)."""

    micro_batch_size: int = Field(default=1, ge=1)
    """Packed rows of `seq_len` tokens per forward/backward pass on each rank."""

    lora: LoraConfig | None = None
    """LoRA adapters on the frozen base model; None trains every weight (full fine-tuning)."""


class LossConfig(Config):
    """The RL policy-gradient loss, per token, normalized by the global loss-token count."""

    type: Literal["default", "grpo", "gspo", "cispo", "opd", "custom"] = "default"
    """`default`: importance ratio with probability-difference masking and a KL term;
    `grpo`: PPO-style ratio clipping; `gspo`: sequence-level ratio clipping;
    `cispo`: clipped, stop-gradient importance weight; `opd`: on-policy distillation alone
    (the reverse KL to `orchestrator.teacher`, rewards ignored); `custom`: `custom_loss` import
    path."""

    mask_high: float = Field(default=0.2, ge=0)
    """`default`: mask a token with positive advantage whose probability rose by more than this."""

    mask_low: float = Field(default=0.2, ge=0)
    """`default`: mask a token with negative advantage whose probability fell by more than this."""

    kl_tau: float = Field(default=1e-3, ge=0)
    """Weight of the `(log ratio)^2` penalty against the inference policy."""

    clip_low: float = Field(default=0.2, ge=0)
    """`grpo`/`gspo`/`cispo`: lower clip of the ratio at `1 - clip_low`."""

    clip_high: float = Field(default=0.2, ge=0)
    """`grpo`/`gspo`/`cispo`: upper clip of the ratio at `1 + clip_high`."""

    custom_loss: str | None = None
    """`custom`: import path `package.module:function` of a loss function."""

    teacher_kl_coef: float = Field(default=0.0, ge=0)
    """Weight of the per-token reverse KL to the teacher (`orchestrator.teacher`), estimated on
    the student's own samples; 0 is off. With `opd` it is the whole loss (besides `kl_tau`);
    with the other types it is added to theirs (RL mixed with distillation)."""

    router_replay: bool = False
    """Mixture-of-experts models: the trainer routes each token to the experts inference chose
    for it (their gate weights recomputed by the trainer's router), instead of its own top-k;
    removes the mismatch that near-tied router logits cause. `rlkube rl` (and the operator) then
    start inference with `return_routed_experts`; with servers of your own
    (`orchestrator.client.base_urls`), start them with it. See rlkube.trainer.rl.router."""

    @property
    def uses_teacher(self) -> bool:
        """Whether the loss needs the teacher's log-probs of the sampled tokens."""
        return self.type == "opd" or self.teacher_kl_coef > 0

    @model_validator(mode="after")
    def _custom_needs_path(self):
        if self.type == "custom" and not self.custom_loss:
            raise ValueError("type 'custom' needs custom_loss ('package.module:function')")
        return self

    @model_validator(mode="after")
    def _opd_needs_a_weight(self):
        if self.type == "opd" and self.teacher_kl_coef == 0:
            raise ValueError("type 'opd' trains on the teacher term alone: teacher_kl_coef must be > 0 (e.g. 1.0)")
        return self
