"""Packed rows as the orchestrator sends them: who attends to whom, and which position's
logits predict each token (`rlkube/orchestrator/packing.py` describes the layout).

A row holds segments: samples, shared prompts and padding. A token sees the earlier tokens of
its own segment and, when its sample continues a shared prompt, that prompt's tokens. So the
model gets an explicit 4D mask rather than inferring sample boundaries from `position_ids`,
which cannot express a prompt shared by several samples. A token is predicted by the logits
of the nearest earlier token it sees: the previous token of its sample, or the prompt's last
token for a sample's first token after a shared prompt.
"""

import torch
from torch import Tensor


def attention_mask(sample_ids: Tensor, prefix_ids: Tensor) -> Tensor:
    """`[rows, 1, seq_len, seq_len]` bool, True where query token q may attend to key k."""
    seq_len = sample_ids.shape[-1]
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=sample_ids.device).tril()
    query_segment, key_segment = sample_ids.unsqueeze(-1), sample_ids.unsqueeze(-2)
    query_prefix = prefix_ids.unsqueeze(-1)
    visible = (key_segment == query_segment) | ((key_segment == query_prefix) & (query_prefix >= 0))
    return (visible & causal).unsqueeze(1)


def predictor_positions(mask: Tensor) -> Tensor:
    """`[rows, seq_len]`: the position whose logits predict each token, -1 where none does
    (a sequence's first token)."""
    seq_len = mask.shape[-1]
    earlier = mask[:, 0] & torch.ones(seq_len, seq_len, dtype=torch.bool, device=mask.device).tril(-1)
    positions = torch.arange(seq_len, device=mask.device)
    return torch.where(earlier, positions, -1).amax(-1)


def token_logprobs(logits: Tensor, input_ids: Tensor, temperatures: Tensor, predictors: Tensor) -> tuple[Tensor, Tensor]:
    """Log-prob and entropy of each token of `input_ids` under its predictor's
    `logits / temperature`, aligned with `input_ids` (like the inference log-probs); zero
    where no position predicts the token. Each token uses the temperature it was sampled with.

    The log-softmax runs once per position, not once per token, so no copy of the logits is
    made per token (that would double the largest tensor of a big-vocabulary model). A position
    that predicts several tokens (a shared prompt's last one) therefore needs them all sampled
    at one temperature, which the orchestrator guarantees by sharing prompts only then.
    """
    rows, seq_len = input_ids.shape
    predicted = predictors >= 0
    source = predictors.clamp(min=0)
    spill = torch.where(predicted, predictors, seq_len)  # tokens nothing predicts write past the end
    position_temps = temperatures.new_ones(rows, seq_len + 1).scatter(1, spill, temperatures)[:, :seq_len]
    if not torch.equal(position_temps.gather(1, source)[predicted], temperatures[predicted]):
        raise ValueError("tokens predicted by the same position must share one temperature")
    log_probs = torch.log_softmax(logits.float() / position_temps.clamp(min=1e-6).unsqueeze(-1), dim=-1)
    picked = log_probs[torch.arange(rows, device=logits.device).unsqueeze(-1), source, input_ids]
    with torch.no_grad():
        entropy = -(log_probs.exp() * log_probs).sum(-1).gather(1, source)
    return torch.where(predicted, picked, 0.0), torch.where(predicted, entropy, 0.0)


def policy_logprobs(model, batch: dict) -> tuple[Tensor, Tensor]:
    """The model's log-probs and entropies of a packed micro-batch's tokens."""
    mask = attention_mask(batch["sample_ids"], batch["prefix_ids"])
    logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=mask).logits
    return token_logprobs(logits, batch["input_ids"], batch["temperatures"], predictor_positions(mask))
