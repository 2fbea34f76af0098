"""A pool: one trainer process (one frozen base model) training many member runs' LoRA
adapters, each pulled from its own orchestrator (rlkube.trainer.pool)."""

from pathlib import Path

from pydantic import Field, model_validator

from rlkube.config.base import Config
from rlkube.config.inference import InferenceConfig, InferenceSection
from rlkube.config.rl import RLTrainerSection, TrainerConfig
from rlkube.config.shared import LogConfig, ModelConfig

SLOT_FIELDS = ("model", "parallel", "device")
"""What a member's trainer config must share with the pool's, besides the adapter's shape."""

LORA_SHAPE = ("rank", "target_modules", "dropout")
"""The adapter's shape, which the pool's one slot has; `alpha` is each member's own."""


def slot_misfit(slot: TrainerConfig, config: TrainerConfig) -> str | None:
    """Why a member's trainer config does not fit the pool's `slot` (naming the field), or None."""
    if config.lora is None:
        return "trainer.lora: a pool member trains a LoRA adapter; set it (the pool's shape)"
    for field in SLOT_FIELDS:
        if getattr(config, field) != getattr(slot, field):
            return f"trainer.{field}: {getattr(config, field)!r} is not the pool's {getattr(slot, field)!r}"
    for field in LORA_SHAPE:
        if getattr(config.lora, field) != getattr(slot.lora, field):
            return f"trainer.lora.{field}: {getattr(config.lora, field)!r} is not the pool's {getattr(slot.lora, field)!r}"
    return None


class PoolSection(Config):
    """The `[pool]` section: membership, fair share and the trainer's Attach service."""

    name: str = "pool"
    """The pool's name (logs, metrics)."""

    max_runs: int = Field(default=4, ge=1)
    """Members trained at once (adapter and optimizer states held); an Attach beyond it is
    refused (RESOURCE_EXHAUSTED) until one leaves."""

    member_grace_s: float = Field(default=30.0, gt=0)
    """Seconds a member's orchestrator may stay unreachable before the member is evicted (its
    adapter and optimizer freed; re-attaching resumes it from its own last checkpoint)."""

    fetch_unavailable_s: float = Field(default=5.0, gt=0)
    """Seconds fetching a member's batch retries its orchestrator when it stops answering
    before the member fails (re-attaching resumes it from its checkpoint): the longest the
    other members' steps wait for one that is gone mid-fetch."""

    probe_interval_s: float = Field(default=0.5, gt=0)
    """How often rank 0 asks each member's orchestrator whether its next batch is ready."""

    host: str = "127.0.0.1"
    """Address the pool's Attach/Detach gRPC service binds (rank 0)."""

    port: int = Field(default=50070, ge=0, le=65535)
    """Port of the Attach/Detach service; 0 picks a free one (logged)."""

    inference_urls: list[str] = []
    """The pool's inference replicas: rank 0 unloads the adapter of a member that failed,
    detached or was evicted from each (freeing its `max_loras` slot). Empty: none unloaded."""


class PoolTrainerConfig(Config):
    """`rlkube pool-trainer @ pool.toml` (under `torchrun` for several ranks): the pool's
    trainer. The base model and the adapters' shape are the pool's; each member brings its own
    optimizer, schedule, loss, `alpha`, seed, steps and checkpoints when it attaches."""

    output_dir: Path = Path("outputs/pool")
    """Members' outputs go to `<output_dir>/members/<member>/` (metrics, checkpoints, weights)."""

    model: ModelConfig = ModelConfig()
    """The base model every member trains an adapter of."""

    trainer: RLTrainerSection = RLTrainerSection(lora={})
    """The slot every member must fit: `device`, `parallel`, `cpu_threads` and the shape of
    `lora` (rank, target modules, dropout; `pool.max_lora_rank` on the cluster). Its optimizer,
    schedule and loss are unused: those are each member's."""

    pool: PoolSection = PoolSection()
    """Membership and the Attach service."""

    log: LogConfig = LogConfig()
    """Logging."""

    @model_validator(mode="after")
    def _pool_trains_adapters(self):
        if self.trainer.lora is None:
            raise ValueError("trainer.lora: a pool trains one LoRA adapter per member; give the adapters' shape")
        return self

    def base_trainer_config(self) -> TrainerConfig:
        """What `MultiRunTrainer.build` needs: the base model, its sharding and the slot's shape."""
        return TrainerConfig(output_dir=self.output_dir, model=self.model, **self.trainer.model_dump(exclude_unset=True))

    def member_dir(self, member: str) -> Path:
        return self.output_dir / "members" / member


class PoolConfig(PoolTrainerConfig):
    """`rlkube pool @ pool.toml --run [NAME] @ run.toml ...`: a pool's trainer and inference on
    this machine, and each `--run` (an RL config as for `rlkube rl`, with `trainer.lora` of the
    pool's shape) as a member run on it (rlkube.launch.pool)."""

    clean_output_dir: bool = False
    """Delete the pool's output directory (every member's outputs with it) before starting."""

    inference: InferenceSection = InferenceSection()
    """The pool's inference servers: vLLM with LoRA, `pool.max_runs` adapters of the slot's rank
    at once, every member's under its member name."""

    def trainer_config(self) -> PoolTrainerConfig:
        """What `rlkube pool-trainer` reads (`configs/pool.toml`)."""
        config = PoolTrainerConfig.model_validate(self.model_dump(include=set(PoolTrainerConfig.model_fields)))
        config.pool.inference_urls = self.inference_urls()
        return config

    def inference_config(self) -> InferenceConfig:
        """One config for every replica (each is given its port). Unpaused from the start: no
        member pauses a shared server, each loads its own adapter in place."""
        return InferenceConfig.model_validate(
            self.inference.model_dump(exclude={"replicas", "gpus"})
            | {"model": self.model.model_dump(), "log": self.log.model_dump(), "start_paused": False,
               "max_lora_rank": self.trainer.lora.rank, "max_loras": self.pool.max_runs})

    def inference_urls(self) -> list[str]:
        """The replicas' URLs, `host:port+i`."""
        section = self.inference
        return [f"http://{section.host}:{port}" for port in range(section.port, section.port + section.replicas)]
