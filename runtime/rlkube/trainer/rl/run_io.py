"""A run's connections to the world, as its trainer needs them: the orchestrator's client, the
policy publisher (rank 0), the checkpointer and the metrics sink. A solo trainer
(rlkube.trainer.rl.trainer.run) makes one; a pool's trainer one per member (rlkube.trainer.pool)."""

from dataclasses import dataclass

from rlkube.config import TrainerConfig


@dataclass
class RunIO:
    client: object
    publisher: object | None
    checkpointer: object | None
    metrics: object

    def close(self) -> None:
        try:
            self.client.close()
            self.metrics.close()
        finally:
            if self.publisher is not None:
                self.publisher.close()


def open_run_io(config: TrainerConfig, rank: int, credential: str | None = None,
                unavailable_s: float | None = None) -> RunIO:
    """`config`'s client (presenting `credential`, else this process's rollouts credential;
    giving up after `unavailable_s` of an unreachable orchestrator: `RolloutClient`),
    publisher (a PEFT adapter directory for a LoRA run), checkpointer (with `ckpt`) and metrics
    (rank 0 writes them)."""
    from rlkube.checkpoints import checkpoint_root
    from rlkube.metrics import MetricsSink
    from rlkube.trainer.lora import adapter_config
    from rlkube.trainer.rl.checkpoint import TrainerCheckpointer
    from rlkube.transport.client import RolloutClient
    from rlkube.transport.publishers import make_publisher

    main = rank == 0
    checkpointer = None
    if config.ckpt:
        checkpointer = TrainerCheckpointer(checkpoint_root(config.output_dir, config.ckpt), config.ckpt, rank)
    prometheus = config.metrics.prometheus_port
    metrics = MetricsSink(
        config.output_dir, "trainer", wandb=config.wandb, run_config=config.model_dump(mode="json"), enabled=main,
        prometheus=None if prometheus is None else (config.metrics.prometheus_host, prometheus),
    )
    publisher = None
    if main:
        adapter = adapter_config(config.lora, config.model.name) if config.lora else None
        publisher = make_publisher(config.weights, config.output_dir, config.model.name, adapter_config=adapter,
                                   final_step=config.max_steps)
    client = RolloutClient(f"{config.rollouts.host}:{config.rollouts.port}", timeout_s=config.rollouts.timeout_s,
                           credential=credential, unavailable_s=unavailable_s)
    return RunIO(client, publisher, checkpointer, metrics)
