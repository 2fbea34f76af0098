"""What the orchestrator hands the trainer's side: the rollouts of one step, as a batch."""

from dataclasses import dataclass, field

from rlkube.rollout_types import Rollout, Sample


@dataclass
class Batch:
    """The rollouts of one training step, after advantages, filtering and off-policy drops."""

    step: int
    rollouts: list[Rollout]
    metrics: dict[str, float] = field(default_factory=dict)

    def samples(self, filter_zero_advantage: bool) -> list[Sample]:
        return [
            s
            for r in self.rollouts
            if r.trainable
            for s in r.samples
            if not (filter_zero_advantage and s.advantage == 0.0)
        ]
