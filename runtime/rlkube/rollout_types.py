"""A scored rollout and its samples: what env workers send and the orchestrator trains on.

Shared by the orchestrator, which builds, checkpoints and packs them, and the transport, which
carries them between env workers and the orchestrator (rlkube.transport.rollout): so they live
below both. Plain dataclasses of Python lists (no torch): they are built on the event loop,
checkpointed as JSON, and only become tensors when packed for the trainer. The one array, an
MoE sample's routing (a few hundred ids per token in a large model), stays a numpy array: as
lists it would cost tens of bytes per id; in JSON it is base64.
"""

import base64
from dataclasses import asdict, dataclass, field

import numpy as np


@dataclass
class Sample:
    """One training sequence: prompt and completion tokens of one trace branch. Multi-turn
    rollouts whose turns extend each other token-exactly are one sample; a turn that breaks
    the prefix starts a new one (verifiers' `Trace.branches`)."""

    token_ids: list[int]
    loss_mask: list[bool]
    """True on tokens the policy sampled (the completion), aligned to `token_ids`."""
    logprobs: list[float]
    """Inference logprob of each sampled token; 0.0 elsewhere."""
    temperature: float
    advantage: float = 0.0
    teacher_logprobs: list[float] | None = None
    """On-policy distillation: the teacher's logprob of each sampled token, 0.0 elsewhere
    (`rlkube.orchestrator.teacher`); None without a teacher."""
    policy_versions: list[int] | None = None
    """The policy that sampled each token, by the engine's own word (its weight-version tag;
    the base model is 0), aligned to `token_ids`, -1 on tokens not sampled. A rollout in
    flight across a weight update has tokens of both policies, and `logprobs` are each token's
    own policy's. None where the engine's answers are not seen (verifiers' full path): then
    every token counts as the rollout's `oldest_policy`."""
    routed_experts: np.ndarray | None = field(default=None, compare=False)
    """Mixture-of-experts models served with `inference.return_routed_experts`: int16
    [tokens, layers, top_k], the experts inference routed each token to, aligned to
    `token_ids` (the last token's row repeats the one before: no forward pass follows it);
    None otherwise. For the trainer's router metrics and router replay."""

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)

    def token_versions(self, default: int) -> list[int]:
        """The policy version of each sampled token (`default` where none was recorded)."""
        if self.policy_versions is None:
            return [default] * self.num_loss_tokens
        return [v for v, m in zip(self.policy_versions, self.loss_mask) if m]


@dataclass
class Rollout:
    """One episode of one task, scored."""

    env: str
    example_id: str
    reward: float
    samples: list[Sample]
    policy_min: int
    """Oldest policy version that generated any of its tokens (the version at its start)."""
    policy_max: int
    """Newest policy version that may have contributed (the version when it finished)."""
    num_turns: int = 1
    is_truncated: bool = False
    error: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    advantage: float = 0.0
    served_versions: list[str] = field(default_factory=list)
    """The weight versions the engine reported for its tokens (policy steps; "default" is the
    untagged base model). Empty where the engine's answers are not seen (verifiers' full path)."""

    def forget_engine_versions(self) -> None:
        """Drop what the engine said sampled its tokens (a pool member's: the server's version is
        none of its policies); its lag then counts from `policy_min`, the clock's."""
        self.served_versions = []
        for sample in self.samples:
            sample.policy_versions = None

    @property
    def served_min(self) -> int | None:
        """The oldest policy that, by the engine's own word, sampled any of its tokens."""
        if not self.served_versions:
            return None
        return min(int(v) if v.isdigit() else 0 for v in self.served_versions)

    @property
    def oldest_policy(self) -> int:
        """What its off-policy lag counts from: the clock's version at its start, or an older
        one where the engine reports it (a replica that lost its weights)."""
        served = self.served_min
        return self.policy_min if served is None else min(self.policy_min, served)

    @property
    def completion_tokens(self) -> int:
        return sum(s.num_loss_tokens for s in self.samples)

    @property
    def seq_len(self) -> int:
        return sum(len(s.token_ids) for s in self.samples)

    @property
    def is_empty(self) -> bool:
        return self.completion_tokens == 0

    @property
    def trainable(self) -> bool:
        """Errored and empty rollouts are counted in metrics but never trained on."""
        return self.error is None and not self.is_empty

    def to_dict(self) -> dict:
        data = asdict(self)
        for sample in data["samples"]:
            sample["routed_experts"] = _routing_to_json(sample["routed_experts"])
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Rollout":
        data = dict(data)
        data["samples"] = [
            Sample(**s | {"routed_experts": _routing_from_json(s.get("routed_experts"))}) for s in data["samples"]
        ]
        return cls(**data)


def _routing_to_json(routing: np.ndarray | None) -> dict | None:
    if routing is None:
        return None
    return {"shape": list(routing.shape), "data": base64.b64encode(routing.astype("<i2").tobytes()).decode()}


def _routing_from_json(routing: dict | None) -> np.ndarray | None:
    if routing is None:
        return None
    return np.frombuffer(base64.b64decode(routing["data"]), dtype="<i2").reshape(routing["shape"]).astype(np.int16)
