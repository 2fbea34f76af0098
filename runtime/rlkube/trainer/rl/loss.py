"""RL policy-gradient losses, per token, normalized by the step's GLOBAL loss-token count.

Every rank divides its token sum by the same `global_loss_tokens` (all ranks, all micro-batches
of the step), so the gradients FSDP averages across ranks, summed over micro-batches, equal the
gradient of the mean over every loss token of the step, however unevenly tokens fall on ranks.

A loss function maps `LossInputs` to a per-token loss (same shape as the log-probs) plus boolean
masks of the tokens it dropped; `compute_loss` applies the loss mask, normalizes and gathers
statistics. `custom` losses follow the same signature:

    def my_loss(inputs: LossInputs, config: LossConfig) -> torch.Tensor | tuple[Tensor, dict]

Statistics come back already divided by `global_loss_tokens` (fractions and means), so summing
them over micro-batches and ranks gives the step's value; `*_max` entries are maxima.

On-policy distillation adds, per token, `teacher_kl_coef * sg(log pi - log pi_T) * r` with
r = pi / pi_inference (`teacher_kl_term`): `opd` is that term alone, the other types add it to
their own loss when `teacher_kl_coef > 0`.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from rlkube.config import LossConfig
from rlkube.plugins import import_callable


@dataclass
class LossInputs:
    """Per-token tensors of one micro-batch, all of shape [rows, seq_len]."""

    logprobs: Tensor
    """Log-probability of each token under the policy being trained (carries the gradient)."""
    inference_logprobs: Tensor
    """Log-probability of each token under the policy that sampled it (inference)."""
    advantages: Tensor
    loss_mask: Tensor
    """True on completion tokens to train on."""
    sample_ids: Tensor
    """Sample index of each token within the step; -1 on padding."""
    teacher_logprobs: Tensor | None = None
    """Log-probability of each loss token under the teacher (0 elsewhere); None without one."""


LossFn = Callable[[LossInputs, LossConfig], "Tensor | tuple[Tensor, dict[str, Tensor]]"]


def default_loss(inputs: LossInputs, config: LossConfig) -> tuple[Tensor, dict[str, Tensor]]:
    """Importance-weighted policy gradient with DPPO-style masking and a KL penalty.

    A token is masked when its probability already moved too far in the direction its advantage
    pushes: up by more than `mask_high` with A > 0, or down by more than `mask_low` with A < 0.
    The thresholds apply to probability differences, which (unlike log-ratios) stay bounded for
    rare tokens, so rare tokens are not masked for tiny absolute moves.
    """
    log_ratio = inputs.logprobs - inputs.inference_logprobs
    ratio = torch.exp(log_ratio)
    with torch.no_grad():
        prob_diff = torch.exp(inputs.logprobs) - torch.exp(inputs.inference_logprobs)
        masked_high = (inputs.advantages > 0) & (prob_diff > config.mask_high)
        masked_low = (inputs.advantages < 0) & (prob_diff < -config.mask_low)
        keep = ~(masked_high | masked_low)
    per_token = -(keep * inputs.advantages * ratio) + config.kl_tau * log_ratio**2
    return per_token, {"masked_high": masked_high, "masked_low": masked_low}


def _clipped_objective(ratio: Tensor, advantages: Tensor, config: LossConfig) -> tuple[Tensor, dict]:
    """PPO's pessimistic clipped surrogate, negated; reports where the clip is active."""
    clipped = ratio.clamp(1 - config.clip_low, 1 + config.clip_high)
    unclipped_obj, clipped_obj = ratio * advantages, clipped * advantages
    with torch.no_grad():
        active = clipped_obj < unclipped_obj
        masked_high = active & (advantages > 0)
        masked_low = active & (advantages < 0)
    return -torch.minimum(unclipped_obj, clipped_obj), {"masked_high": masked_high, "masked_low": masked_low}


def _kl_penalty(inputs: LossInputs, config: LossConfig) -> Tensor:
    return config.kl_tau * (inputs.logprobs - inputs.inference_logprobs) ** 2


def grpo_loss(inputs: LossInputs, config: LossConfig) -> tuple[Tensor, dict[str, Tensor]]:
    """GRPO/PPO: token-level ratio clipped to [1 - clip_low, 1 + clip_high]."""
    ratio = torch.exp(inputs.logprobs - inputs.inference_logprobs)
    per_token, masks = _clipped_objective(ratio, inputs.advantages, config)
    return per_token + _kl_penalty(inputs, config), masks


def sequence_mean(values: Tensor, sample_ids: Tensor, mask: Tensor) -> Tensor:
    """Each token gets the mean of `values` over the loss tokens of its sample."""
    _, index = torch.unique(sample_ids.flatten(), return_inverse=True)
    num = int(index.max()) + 1 if index.numel() else 0
    weights = mask.flatten().to(values.dtype)
    sums = torch.zeros(num, dtype=values.dtype, device=values.device).index_add(0, index, values.flatten() * weights)
    counts = torch.zeros(num, dtype=values.dtype, device=values.device).index_add(0, index, weights)
    return (sums / counts.clamp(min=1))[index].view_as(values)


def gspo_loss(inputs: LossInputs, config: LossConfig) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO: one ratio per sample, the geometric mean of its token ratios, clipped like PPO.

    Written in GSPO-token form, sg(s_i) * exp(logp_t - sg(logp_t)): its value is the sequence
    ratio s_i and its gradient is s_i times each token's log-prob gradient.
    """
    log_ratio = inputs.logprobs - inputs.inference_logprobs
    seq_log_ratio = sequence_mean(log_ratio.detach(), inputs.sample_ids, inputs.loss_mask)
    ratio = torch.exp(seq_log_ratio + inputs.logprobs - inputs.logprobs.detach())
    per_token, masks = _clipped_objective(ratio, inputs.advantages, config)
    return per_token + _kl_penalty(inputs, config), masks


def cispo_loss(inputs: LossInputs, config: LossConfig) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO: REINFORCE weighted by the clipped importance ratio, with the weight's gradient
    stopped, so clipped tokens still contribute a (bounded) gradient instead of none."""
    with torch.no_grad():
        ratio = torch.exp(inputs.logprobs - inputs.inference_logprobs)
        weight = ratio.clamp(1 - config.clip_low, 1 + config.clip_high)
        masks = {"masked_high": ratio > 1 + config.clip_high, "masked_low": ratio < 1 - config.clip_low}
    per_token = -weight * inputs.advantages * inputs.logprobs
    return per_token + _kl_penalty(inputs, config), masks


def teacher_kl_term(inputs: LossInputs, config: LossConfig) -> Tensor:
    """Per-token reverse KL(pi || pi_T) to the teacher on the student's own samples.

    Its gradient is E_pi[(log pi - log pi_T) grad log pi]; the samples come from the
    inference policy, so each token is weighted by r = exp(logprobs - inference_logprobs):
    coef * sg(log pi - log pi_T) * r has exactly the gradient coef * sg(.) * r * grad log pi,
    which pushes up the tokens the teacher finds likelier than the student does."""
    if inputs.teacher_logprobs is None:
        if inputs.loss_mask.any():
            raise ValueError(
                f"loss.type '{config.type}' with loss.teacher_kl_coef {config.teacher_kl_coef:g} needs the "
                "teacher's log-probs, and this batch has none: set orchestrator.teacher"
            )
        return torch.zeros_like(inputs.logprobs)
    gap = (inputs.logprobs - inputs.teacher_logprobs).detach()
    ratio = torch.exp(inputs.logprobs - inputs.inference_logprobs)
    return config.teacher_kl_coef * gap * ratio


def opd_loss(inputs: LossInputs, config: LossConfig) -> Tensor:
    """On-policy distillation alone: the teacher KL term and the KL penalty, rewards ignored."""
    return teacher_kl_term(inputs, config) + _kl_penalty(inputs, config)


BUILTIN_LOSSES: dict[str, LossFn] = {
    "default": default_loss,
    "grpo": grpo_loss,
    "gspo": gspo_loss,
    "cispo": cispo_loss,
    "opd": opd_loss,
}


def resolve_loss_fn(config: LossConfig) -> LossFn:
    """The configured loss function (done once at setup, not per step)."""
    if config.type == "custom":
        return import_callable(config.custom_loss, "loss.custom_loss")
    return BUILTIN_LOSSES[config.type]


def mismatch_kl(logprobs: Tensor, inference_logprobs: Tensor) -> Tensor:
    """Per-token estimate of KL(inference || trainer) from samples of the inference policy:
    r - 1 - log r with r = p_trainer / p_inference (non-negative, low variance)."""
    log_ratio = (logprobs - inference_logprobs).detach()
    return torch.exp(log_ratio) - 1 - log_ratio


def compute_loss(
    inputs: LossInputs,
    config: LossConfig,
    global_loss_tokens: int,
    loss_fn: LossFn | None = None,
    entropy: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The micro-batch's share of the step's loss, and its share of the statistics."""
    loss_fn = loss_fn or resolve_loss_fn(config)
    result = loss_fn(inputs, config)
    per_token, masks = result if isinstance(result, tuple) else (result, {})
    if per_token.shape != inputs.logprobs.shape:
        raise ValueError(f"loss function returned shape {tuple(per_token.shape)}, expected {tuple(inputs.logprobs.shape)}")
    if config.type != "opd" and config.teacher_kl_coef > 0:
        per_token = per_token + teacher_kl_term(inputs, config)
    mask = inputs.loss_mask.to(per_token.dtype)
    denom = max(int(global_loss_tokens), 1)
    loss = (per_token * mask).sum() / denom

    with torch.no_grad():
        kl = mismatch_kl(inputs.logprobs, inputs.inference_logprobs)
        any_tokens = bool(inputs.loss_mask.any())
        stats = {
            "loss/mean": loss.detach(),
            "mismatch_kl/mean": (kl * mask).sum() / denom,
            "mismatch_kl/max": kl[inputs.loss_mask].max() if any_tokens else kl.new_zeros(()),
        }
        for name, dropped in masks.items():
            stats[f"{name}/fraction"] = (dropped & inputs.loss_mask).sum().to(per_token.dtype) / denom
        if entropy is not None:
            stats["entropy/mean"] = (entropy.detach() * mask).sum() / denom
        if inputs.teacher_logprobs is not None:
            stats["teacher_kl/mean"] = ((inputs.logprobs - inputs.teacher_logprobs) * mask).sum() / denom
    return loss, stats

