"""`rlkube rl` on one machine: per-process configs on disk, then the three processes as children.

The resolved configs are written to `<output_dir>/configs/{inference,orchestrator,trainer}.toml`
(what `--dry-run` stops after); the commands below are exactly what one would type by hand, so
any process can be restarted alone from its file. `ckpt.resume_step = "latest"` is passed
through as is: each process resolves it to the same step itself (rlkube.launch.checkpoints).
"""

import socket
import sys
from pathlib import Path

from rlkube.config import RLConfig, write_toml
from rlkube.launch.gpus import GpuPlacement
from rlkube.launch.supervisor import ChildSpec

PROCESSES = ("inference", "orchestrator", "trainer")
ENV_WORKER_RESTARTS = 5
"""An env worker that dies is started again (the orchestrator re-issues its rollouts), up to this
many times per worker before the run fails: a crash-looping worker is a bug to see, not hide."""


def check_inference_ports(config: RLConfig) -> None:
    """The local replicas' ports must be free (RuntimeError naming `inference.port` if not)."""
    from rlkube.inference.process import ensure_port_free

    if not uses_external_inference(config):
        for i in range(config.inference.replicas):
            ensure_port_free(config.inference.host, config.inference.port + i)


def write_process_configs(config: RLConfig) -> dict[str, Path]:
    """Resolve and write each process's config; returns their paths."""
    config_dir = config.output_dir / "configs"
    paths = {}
    for name, process_config in config.process_configs().items():
        paths[name] = config_dir / f"{name}.toml"
        write_toml(process_config, paths[name])
    return paths


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _module(name: str) -> list[str]:
    return [sys.executable, "-m", f"rlkube.entrypoints.{name}"]


def trainer_argv(nproc: int, config_path: Path) -> tuple[list[str], dict[str, str]]:
    """torchrun for several ranks; one plain process (with torchrun's env) for one rank."""
    if nproc == 1:
        env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        return [*_module("trainer"), "@", str(config_path)], env
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    return [*torchrun, "-m", "rlkube.entrypoints.trainer", "@", str(config_path)], {}


def uses_external_inference(config: RLConfig) -> bool:
    """`orchestrator.client.base_urls` given: attach to those servers instead of starting any."""
    return "base_urls" in config.orchestrator.client.model_fields_set


def child_stages(
    config: RLConfig, paths: dict[str, Path], gpus: GpuPlacement | None = None
) -> list[list[ChildSpec]]:
    """Inference replicas and the trainer start at once (model loading overlaps vLLM's start);
    the orchestrator starts once every replica is healthy, with its env workers (they dial it
    until it listens). `gpus`: the devices each replica and the trainer see."""
    logs = config.output_dir / "logs"
    inference = [] if uses_external_inference(config) else [
        ChildSpec(
            name=f"inference-{i}",
            argv=[*_module("inference"), "@", str(paths["inference"]), "--port", str(config.inference.port + i)],
            log_path=logs / f"inference-{i}.log",
            health_url=f"{url}/health",
            env=gpus.env(gpus.inference[i]) if gpus else {},
        )
        for i, url in enumerate(config.inference_urls()[: config.inference.replicas])
    ]
    trainer_cmd, trainer_env = trainer_argv(config.trainer.nproc_per_node, paths["trainer"])
    if gpus:
        trainer_env |= gpus.env(gpus.trainer)
    trainer = ChildSpec("trainer", trainer_cmd, logs / "trainer.log", env=trainer_env, must_finish=True)
    orchestrator = ChildSpec(
        "orchestrator",
        [*_module("orchestrator"), "@", str(paths["orchestrator"])],
        logs / "orchestrator.log",
        must_finish=True,
    )
    env_workers = [
        ChildSpec(f"env-worker-{i}", [*_module("env_worker"), "@", str(paths["orchestrator"])],
                  logs / f"env-worker-{i}.log", max_restarts=ENV_WORKER_RESTARTS)
        for i in range(config.orchestrator.env_workers)
    ]
    return [[*inference, trainer], [orchestrator, *env_workers]]

