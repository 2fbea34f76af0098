"""`rlkube eval`: score a model on an environment's held-out split through vLLM."""

from pathlib import Path

from pydantic import Field, model_validator

from rlkube.config.base import Config
from rlkube.config.inference import InferenceServerConfig
from rlkube.config.orchestrator import EnvConfig, SamplingConfig
from rlkube.config.shared import LogConfig, ModelConfig


class EvalRunConfig(Config):
    """`rlkube eval @ eval.toml`: mean reward and pass rate of a model on an environment."""

    output_dir: Path = Path("outputs/eval")
    """Where the results and logs go."""

    model: ModelConfig = ModelConfig()
    """The model to evaluate."""

    env: EnvConfig = EnvConfig(args={"split": "test"})
    """The environment and split."""

    num_examples: int | None = Field(default=None, ge=1)
    """Examples to evaluate; all when unset."""

    rollouts_per_example: int = Field(default=1, ge=1)
    """k for avg@k and pass@k."""

    pass_threshold: float = Field(default=1.0, ge=0)
    """A rollout passes when its reward is at least this."""

    sampling: SamplingConfig = SamplingConfig(temperature=0.0)
    """Sampling (greedy by default)."""

    save_samples: bool = False
    """Also write every finished rollout as a chat row to `<output_dir>/samples.jsonl`
    (`messages`, `tools`, `reward`, `example`): the file `rlkube sft --data.name` trains on,
    for SFT distillation from the served model (a teacher) on the env's prompts."""

    samples_min_reward: float | None = None
    """With `save_samples`: keep only rollouts whose reward reaches this (rejection sampling)."""

    base_url: str | None = None
    """Use this running server instead of starting one."""

    inference: InferenceServerConfig = InferenceServerConfig()
    """The server to start when `base_url` is unset."""

    seed: int = 0
    """Sampling seed."""

    log: LogConfig = LogConfig()
    """Logging."""

    @model_validator(mode="after")
    def _min_reward_needs_samples(self):
        if self.samples_min_reward is not None and not self.save_samples:
            raise ValueError("samples_min_reward: filters the saved samples, but save_samples is off")
        return self
