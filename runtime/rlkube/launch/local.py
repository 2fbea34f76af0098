"""`rlkube rl` on one machine: per-process configs on disk, then the three processes as children.

The resolved configs are written to `<output_dir>/configs/{inference,orchestrator,trainer}.toml`
(and `teacher.toml`, `judge.toml` with a `[teacher]`, `[judge]`; what `--dry-run` stops after); the commands below are
exactly what one would type by hand, so any process can be restarted alone from its file.
`ckpt.resume_step = "latest"` is passed through as is: each process resolves it to the same step
itself (rlkube.checkpoints).
"""

import sys
from pathlib import Path

from rlkube import auth
from rlkube.config import RLConfig, write_toml
from rlkube.launch.gpus import GpuPlacement
from rlkube.launch.supervisor import ChildSpec
from rlkube.ports import free_port
from rlkube.scopes import component_env

PROCESSES = ("inference", "orchestrator", "trainer")
ENV_WORKER_RESTARTS = 5
"""An env worker that dies is started again (the orchestrator re-issues its rollouts), up to this
many times per worker before the run fails: a crash-looping worker is a bug to see, not hide."""
JUDGE_RESTARTS = 5
"""A judge replica that dies is started again, up to this many times before the run fails: its
rollouts wait for it and are re-issued meanwhile (`rlkube.orchestrator.judge`), as on Kubernetes,
where its StatefulSet brings the pod back."""


def bound_ports(config: RLConfig) -> list[tuple[str, str, int]]:
    """(config field, host, port) of every port the run's children bind: the inference,
    teacher and judge replicas, the orchestrator's gRPC (`rollouts.port`) and `/status` + `/metrics`
    (`orchestrator.http_port`), and the trainer's weight server or NCCL rendezvous. Env workers
    bind nothing (they dial the orchestrator); torchrun (`--standalone`) and a single trainer
    rank rendezvous on ports picked free at start."""
    servers = [] if config.uses_external_inference else [("inference", config.inference)]
    ports = [
        (f"{name}.port", section.host, port)
        for name, section in [*servers, *config.served_models().items()]
        for port in range(section.port, section.port + section.replicas)
    ]
    ports += [("rollouts.port", config.rollouts.host, config.rollouts.port),
              ("orchestrator.http_port", config.rollouts.host, config.orchestrator.http_port)]
    weights = config.weights
    if weights.type in ("grpc", "nixl"):
        ports.append(("weights.grpc_port", weights.grpc_bind_host or weights.grpc_host, weights.grpc_port))
    elif weights.type == "nccl":
        ports.append(("weights.nccl_port", weights.grpc_host, weights.nccl_port))
    return ports


def check_ports(config: RLConfig) -> None:
    """Every port the run will bind must be free, and no two the same, before anything starts
    (RuntimeError naming the field to change): a child that finds its port taken minutes into a
    run (after SFT, after vLLM's start) would only fail then, and a server of another program on
    an inference port would look like ours coming up."""
    from rlkube.inference.process import ensure_port_free

    seen: dict[int, str] = {}
    for field, host, port in bound_ports(config):
        flag = "--" + field.replace("_", "-")
        if port in seen:
            raise RuntimeError(f"{field}: port {port} is also {seen[port]}'s; set {flag} to another port")
        seen[port] = field
        try:
            ensure_port_free(host, port, field)
        except RuntimeError as e:
            raise RuntimeError(f"{e}; set {flag} to a free port") from None


def write_process_configs(config: RLConfig) -> dict[str, Path]:
    """Resolve and write each process's config; returns their paths."""
    config_dir = config.output_dir / "configs"
    paths = {}
    for name, process_config in config.process_configs().items():
        paths[name] = config_dir / f"{name}.toml"
        write_toml(process_config, paths[name])
    return paths



def module_argv(name: str) -> list[str]:
    return [sys.executable, "-m", f"rlkube.entrypoints.{name}"]


def trainer_argv(nproc: int, config_path: Path, entrypoint: str = "trainer") -> tuple[list[str], dict[str, str]]:
    """torchrun for several ranks; one plain process (with torchrun's env) for one rank.
    `entrypoint`: `rlkube.entrypoints.<entrypoint>` (`pool_trainer` for a pool's)."""
    if nproc == 1:
        env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        return [*module_argv(entrypoint), "@", str(config_path)], env
    torchrun = [*module_argv("torchrun"), "--standalone", f"--nproc-per-node={nproc}"]  # keeps a rank's exit code 2
    return [*torchrun, "-m", f"rlkube.entrypoints.{entrypoint}", "@", str(config_path)], {}


def child_stages(
    config: RLConfig, paths: dict[str, Path], gpus: GpuPlacement | None = None
) -> list[list[ChildSpec]]:
    """Inference, teacher and judge replicas and the trainer start at once (model loading overlaps
    vLLM's start); the orchestrator starts once every replica is healthy, with its env workers
    (they dial it until it listens). `gpus`: the devices each replica and the trainer see.
    Every child gets the run's credentials its component holds (`rlkube.scopes.HELD`), derived
    from the run's token: `RLKUBE_TOKEN` when it is set (so that servers started by hand with it
    can join), else a fresh one for this run. Inference sends the weights credential only to
    the trainer's weight server (`auth.WEIGHTS_PEERS_ENV`)."""
    logs = config.output_dir / "logs"
    token = auth.run_token() or auth.new_token()

    def run_env(component: str) -> dict[str, str]:
        return component_env(token, component)

    weights_peer = {auth.WEIGHTS_PEERS_ENV: f"{config.weights.grpc_host}:{config.weights.grpc_port}"}

    def servers(name: str, urls: list[str], devices: list[list[str]]) -> list[ChildSpec]:
        return [
            ChildSpec(
                name=f"{name}-{i}",
                argv=[*module_argv("inference"), "@", str(paths[name]), "--port", url.rsplit(":", 1)[1]],
                log_path=logs / f"{name}-{i}.log",
                health_url=f"{url}/health",
                env=run_env(name) | (weights_peer if name == "inference" else {}) | (gpus.env(devices[i]) if gpus else {}),
                max_restarts=JUDGE_RESTARTS if name == "judge" else 0,
            )
            for i, url in enumerate(urls)
        ]

    inference = [] if config.uses_external_inference else servers(
        "inference", config.inference_urls(), gpus.inference if gpus else [])
    served = [child for name in config.served_models()
              for child in servers(name, config.served_urls(name), gpus.served[name] if gpus else [])]
    trainer_cmd, trainer_env = trainer_argv(config.trainer.nproc_per_node, paths["trainer"])
    trainer_env |= run_env("trainer")
    if gpus:
        trainer_env |= gpus.env(gpus.trainer)
    trainer = ChildSpec("trainer", trainer_cmd, logs / "trainer.log", env=trainer_env, must_finish=True)
    orchestrator = ChildSpec(
        "orchestrator",
        [*module_argv("orchestrator"), "@", str(paths["orchestrator"])],
        logs / "orchestrator.log",
        env=run_env("orchestrator"),
        must_finish=True,
    )
    env_workers = [
        ChildSpec(f"env-worker-{i}", [*module_argv("env_worker"), "@", str(paths["orchestrator"])],
                  logs / f"env-worker-{i}.log", env=run_env("env-worker"), max_restarts=ENV_WORKER_RESTARTS)
        for i in range(config.orchestrator.env_workers)
    ]
    return [[*inference, *served, trainer], [orchestrator, *env_workers]]

