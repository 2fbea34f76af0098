"""Packed rows as the orchestrator sends them: who attends to whom, and which position's
output predicts each token (`rlkube/orchestrator/packing.py` describes the layout).

A row holds segments: samples, shared prompts and padding. A token sees the earlier tokens of
its own segment and, when its sample continues a shared prompt, that prompt's tokens; position
ids alone cannot express a prompt shared by several samples, so the model attends through
`rlkube.trainer.rl.attention`, which applies this rule tile by tile and never builds a
`seq_len x seq_len` mask. A token is predicted by the output of the nearest earlier token it
sees: the previous token of its sample, or the prompt's last token for a sample's first token
after a shared prompt.

Memory and time stay linear in the row length: besides attention, the log-probs run over
chunks of `LOGPROB_CHUNK` tokens, and each chunk's full-vocabulary logits are recomputed in
backward rather than kept, so at most one chunk of them exists at a time.
"""

from functools import partial

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from rlkube.trainer.rl.attention import SEGMENT_ATTENTION, Segments

LOGPROB_CHUNK = 1024


def _chunk_logprobs(head: torch.nn.Module, hidden: Tensor, token_ids: Tensor, temperatures: Tensor) -> tuple[Tensor, Tensor]:
    log_probs = torch.log_softmax(head(hidden).float() / temperatures.clamp(min=1e-6).unsqueeze(-1), dim=-1)
    with torch.no_grad():
        entropy = -(log_probs.exp() * log_probs).sum(-1)
    return log_probs.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1), entropy


def token_logprobs(
    hidden: Tensor,
    head: torch.nn.Module,
    input_ids: Tensor,
    temperatures: Tensor,
    predictors: Tensor,
    wanted: Tensor,
    chunk: int = LOGPROB_CHUNK,
) -> tuple[Tensor, Tensor]:
    """Float32 log-prob and entropy of each `wanted` token of `input_ids` under
    `head(hidden[its predictor]) / its temperature`, aligned with `input_ids` (like the
    inference log-probs); zero elsewhere and where no position predicts the token.

    Each token uses the temperature it was sampled with, even when one position predicts
    several tokens (a shared prompt's last one). `head` runs on `chunk` tokens at a time and
    again in backward, so no full-vocabulary tensor of all tokens exists at once.
    """
    rows, positions = torch.nonzero(wanted & (predictors >= 0), as_tuple=True)
    logprobs, entropies = [], []
    for start in range(0, len(rows), chunk):
        r, p = rows[start : start + chunk], positions[start : start + chunk]
        lp, ent = checkpoint(
            partial(_chunk_logprobs, head), hidden[r, predictors[r, p]], input_ids[r, p], temperatures[r, p],
            use_reentrant=False,
        )
        logprobs.append(lp)
        entropies.append(ent)
    zeros = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    if not logprobs:  # no loss tokens: still use the head, so every parameter gets a (zero) gradient
        return zeros + head(hidden[:1, :1]).float().sum() * 0, zeros
    return zeros.index_put((rows, positions), torch.cat(logprobs)), zeros.index_put((rows, positions), torch.cat(entropies))


class _TokenLogprobHead(torch.nn.Module):
    """Stands in for the LM head during one forward: maps the final hidden states to
    `[rows, seq_len, 2]` (log-prob, entropy) with `token_logprobs`. So the chunked head runs
    inside the model's own forward, where FSDP has gathered the head's weights and hooks the
    output to gather them again before backward (whose chunks recompute the logits)."""

    def __init__(self, head: torch.nn.Module, batch: dict, predictors: Tensor):
        super().__init__()
        self.head, self.batch, self.predictors = head, batch, predictors

    def forward(self, hidden: Tensor) -> Tensor:
        batch = self.batch
        logprobs, entropy = token_logprobs(
            hidden, self.head, batch["input_ids"], batch["temperatures"], self.predictors, batch["loss_mask"]
        )
        return torch.stack([logprobs, entropy], dim=-1)


def check_attention(model) -> None:
    implementation = model.config._attn_implementation
    if implementation != SEGMENT_ATTENTION:
        raise ValueError(
            f"{type(model).__name__} attends with '{implementation}', which cannot express packed rows with "
            f"shared prompts; load it with attn_implementation='{SEGMENT_ATTENTION}' "
            "(rlkube.trainer.model.build_model(..., packed_attention=True))"
        )


def policy_logprobs(model, batch: dict) -> tuple[Tensor, Tensor]:
    """The model's log-probs and entropies of a packed micro-batch's loss tokens (zero on the
    others)."""
    check_attention(model)
    segments = Segments(batch["sample_ids"], batch["prefix_ids"])
    head = model.get_output_embeddings()
    model.set_output_embeddings(_TokenLogprobHead(head, batch, segments.predictors()))
    try:
        out = model(
            input_ids=batch["input_ids"], position_ids=batch["position_ids"], segments=segments, logits_to_keep=0
        ).logits
    finally:
        model.set_output_embeddings(head)
    return out[..., 0], out[..., 1]
