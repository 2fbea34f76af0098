"""`rlkube eval`: score a model on an environment's held-out split through vLLM."""

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from rlkube.config.base import Config
from rlkube.config.inference import InferenceServerConfig
from rlkube.config.orchestrator import HELD_OUT, EnvConfig, SamplingConfig, on_held_out_split
from rlkube.config.shared import LogConfig, ModelConfig


class EvalRunConfig(Config):
    """`rlkube eval @ eval.toml`: mean reward and pass rate of a model on an environment."""

    output_dir: Path = Path("outputs/eval")
    """Where the results and logs go."""

    model: ModelConfig = ModelConfig()
    """The model to evaluate."""

    env: EnvConfig = EnvConfig(args=HELD_OUT)
    """The environment, scored on its held-out split (`args.split = "test"`) unless `args` name
    a `split`: `--env.id X` scores X's test split, `--env.args.split train` the train split."""

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

    @model_validator(mode="before")
    @classmethod
    def _env_on_held_out_split(cls, data: Any) -> Any:
        if isinstance(data, dict) and "env" in data:
            data = {**data, "env": on_held_out_split(data["env"])}
        return data

    @model_validator(mode="after")
    def _min_reward_needs_samples(self):
        if self.samples_min_reward is not None and not self.save_samples:
            raise ValueError("samples_min_reward: filters the saved samples, but save_samples is off")
        return self
