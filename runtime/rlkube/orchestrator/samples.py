"""A batch as text, for reading what the policy does (`orchestrator.samples_interval`).

The metrics say that the reward fell; the samples say why: an answer cut off, a format token
the policy started to repeat, an environment that errors. Each sample's tokens are decoded as
they were trained on, special tokens included, split where the completion starts.
"""

from collections.abc import Callable

from rlkube.config import ModelConfig
from rlkube.orchestrator.packing import prompt_len
from rlkube.orchestrator.types import Batch


def sample_rows(batch: Batch, tokenizer) -> list[dict]:
    """One row per sample of every rollout in `batch`, in the order the batch holds them; a
    rollout without samples (errored before its first token) is one row with its error."""
    rows = []
    for rollout in batch.rollouts:
        head = {"step": batch.step, "env": rollout.env, "example_id": rollout.example_id, "reward": rollout.reward,
                "policy": f"{rollout.policy_min}-{rollout.policy_max}", "error": rollout.error or ""}
        if not rollout.samples:
            rows.append(head | {"advantage": rollout.advantage, "prompt": "", "completion": ""})
        for sample in rollout.samples:
            start = prompt_len(sample)
            rows.append(head | {
                "advantage": sample.advantage,
                "prompt": tokenizer.decode(sample.token_ids[:start], skip_special_tokens=False),
                "completion": tokenizer.decode(sample.token_ids[start:], skip_special_tokens=False),
            })
    return rows


def sample_logger(model: ModelConfig, interval: int, log_rows: Callable[[int, str, list[dict]], object]):
    """`log(batch)`: every `interval` steps, the batch's `sample_rows` to `log_rows(step,
    "samples", rows)` (`MetricsSink.log_rows`), decoded with the model's tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model.name, trust_remote_code=model.trust_remote_code)

    def log(batch: Batch) -> None:
        if batch.step % interval == 0:
            log_rows(batch.step, "samples", sample_rows(batch, tokenizer))

    return log
