"""`rlkube pool` on one machine: the pool's trainer and inference once, each `--run` as a member.

A member is an RL config as `rlkube rl` reads it, run as the solo run it would be on the
pool's servers: its trainer config (what `rlkube rl` writes as `trainer.toml`) is sent with
its orchestrator's Attach, and its orchestrator (member mode, `OrchestratorConfig.pool`)
generates with its own adapter on the pool's inference. Its outputs are
`<pool output_dir>/members/<member>/`, where the pool trainer writes its checkpoints, weights
and metrics: `configs/`, `logs/`, the orchestrator's metrics and samples land there too, so
the directory reads as a solo run's (`rlkube plot`, `rlkube export`).

What the pool decides is refused in a member's config, naming the field: `output_dir`,
`clean_output_dir`, another `model`, a trainer that does not fit the slot (`device`, `parallel`,
`nproc_per_node`, the adapter's rank, target modules, dropout), `lora.serving = "merge"`,
another `weights.type` than `storage`, `[inference]` fields that differ from the pool's, its
own `orchestrator.client.base_urls`, a served `[teacher]` or `[judge]`.
"""

from dataclasses import dataclass
from pathlib import Path

from rlkube import auth
from rlkube.config import (
    ConfigError,
    OrchestratorConfig,
    RLConfig,
    TrainerConfig,
    load_config,
    write_toml,
)
from rlkube.config.cli import validate
from rlkube.config.pool import PoolConfig, slot_misfit
from rlkube.launch.local import ENV_WORKER_RESTARTS, module_argv, trainer_argv
from rlkube.launch.supervisor import ChildSpec
from rlkube.scopes import MEMBER_NAME, member_env
from rlkube.withheld import TOKEN_ENV

RUN_FLAG = "--run"


@dataclass
class RunArgs:
    """One `--run [NAME] @ run.toml [--field value ...]`."""

    name: str | None
    argv: list[str]


@dataclass
class Member:
    name: str
    config: RLConfig
    """The member's RL config as the solo run it would be on the pool's servers."""
    trainer: TrainerConfig
    orchestrator: OrchestratorConfig

    @property
    def output_dir(self) -> Path:
        return self.config.output_dir


def split_runs(argv: list[str]) -> tuple[list[str], list[RunArgs]]:
    """The pool's own arguments (before the first `--run`) and each run's: `--run` may be
    followed by the member's name, else it is the stem of the run's last config file (the one
    that tells it from the others: `--run @ member.toml @ lr_1e-3.toml` is `lr-1e-3`)."""
    pool, runs, current = [], [], None
    for i, arg in enumerate(argv):
        if arg == RUN_FLAG:
            current = RunArgs(None, [])
            runs.append(current)
        elif current is None:
            pool.append(arg)
        elif current.name is None and not current.argv and arg != "@" and not arg.startswith(("-", "@")):
            current.name = arg
        else:
            current.argv.append(arg)
        if arg == RUN_FLAG and i == len(argv) - 1:
            raise ConfigError(f"{RUN_FLAG}: give the run's config (`{RUN_FLAG} [NAME] @ run.toml`)")
    return pool, runs


def member_name(run: RunArgs) -> str:
    if run.name is not None:
        name = run.name
    else:
        files = [a[1:] or run.argv[i + 1] for i, a in enumerate(run.argv[:-1] + [""]) if a.startswith("@")]
        if not files:
            raise ConfigError(f"{RUN_FLAG}: a run needs a config file (`{RUN_FLAG} [NAME] @ run.toml`)")
        name = Path(files[-1]).stem.replace("_", "-").lower()
    if not MEMBER_NAME.fullmatch(name):
        raise ConfigError(f"{RUN_FLAG} {name}: a member's name is lower-case DNS-1123 (a-z, 0-9, '-', '.'); "
                          f"name it: `{RUN_FLAG} NAME @ run.toml`")
    return name


def members(pool: PoolConfig, runs: list[RunArgs]) -> list[Member]:
    """Each run as a member of `pool` (ConfigError naming the run and the field that does not
    fit). Ports a run leaves unset are its defaults plus its index: run i's orchestrator serves
    gRPC on `rollouts.port + i` and `/status` on `orchestrator.http_port + i`."""
    if not runs:
        raise ConfigError(f"{RUN_FLAG}: give at least one member run (`{RUN_FLAG} [NAME] @ run.toml`)")
    if pool.pool.port == 0:
        raise ConfigError("pool.port: 0 (a free port) cannot be given to the members; set a port")
    if len(runs) > pool.pool.max_runs:
        raise ConfigError(f"pool.max_runs: {len(runs)} runs, but the pool trains {pool.pool.max_runs} at most")
    out: list[Member] = []
    for index, run in enumerate(runs):
        name = member_name(run)
        if name in {m.name for m in out}:
            raise ConfigError(f"{RUN_FLAG} {name}: two runs are named {name}; name one (`{RUN_FLAG} NAME @ run.toml`)")
        try:
            out.append(member(pool, name, index, load_config(RLConfig, run.argv)))
        except ConfigError as e:
            raise ConfigError(f"{RUN_FLAG} {name}: {e}") from None
    check_ports(pool, out)
    return out


def member(pool: PoolConfig, name: str, index: int, run: RLConfig) -> Member:
    """Run `run` as member `name` of `pool`, the `index`-th (see `members`)."""
    refuse_what_the_pool_decides(pool, run)
    data = run.model_dump()
    data |= {"output_dir": pool.member_dir(name), "model": pool.model.model_dump(),
             "inference": pool.inference.model_dump()}
    data["orchestrator"]["client"]["base_urls"] = pool.inference_urls()
    if "port" not in run.rollouts.model_fields_set:
        data["rollouts"]["port"] = run.rollouts.port + index
    if "http_port" not in run.orchestrator.model_fields_set:
        data["orchestrator"]["http_port"] = run.orchestrator.http_port + index
    config = validate(RLConfig, data)  # the pool's inference with the run's own fields
    configs = config.process_configs()
    trainer = configs["trainer"]
    if reason := slot_misfit(pool.base_trainer_config(), trainer):
        raise ConfigError(reason)
    orchestrator = configs["orchestrator"].model_dump()
    orchestrator["client"]["lora_adapter"] = name
    orchestrator["pool"] = {"member": name, "trainer": f"{pool.pool.host}:{pool.pool.port}",
                            "trainer_config": str(config.output_dir / "configs" / "trainer.toml")}
    return Member(name, config, trainer, validate(OrchestratorConfig, orchestrator))


def refuse_what_the_pool_decides(pool: PoolConfig, run: RLConfig) -> None:
    """ConfigError naming a field of `run` that the pool sets for its members."""
    placed = f"a member's outputs are {pool.output_dir}/members/<member>/, beside what the pool trainer writes for it"
    for field, why in (("output_dir", placed),
                       ("clean_output_dir", "the pool's (`rlkube pool --clean-output-dir` cleans every member's)")):
        if field in run.model_fields_set:
            raise ConfigError(f"{field}: {why}; leave it unset")
    if "model" in run.model_fields_set and run.model != pool.model:
        raise ConfigError(f"model.name: {run.model.name!r} is not the pool's {pool.model.name!r} (every member "
                          "trains an adapter of the pool's base model; leave [model] unset)")
    lora = run.trainer.lora
    if lora is None:
        raise ConfigError("trainer.lora: a pool member trains a LoRA adapter; set it (the pool's shape: "
                          f"rank {pool.trainer.lora.rank})")
    if lora.serving != "adapter":
        raise ConfigError(f"trainer.lora.serving: {lora.serving!r}; the pool's inference serves every member's "
                          "adapter by name ('adapter')")
    if "nproc_per_node" in run.trainer.model_fields_set and run.trainer.nproc_per_node != pool.trainer.nproc_per_node:
        raise ConfigError(f"trainer.nproc_per_node: {run.trainer.nproc_per_node} is not the pool's "
                          f"{pool.trainer.nproc_per_node} (the pool trainer's ranks)")
    if run.weights.type != "storage":
        raise ConfigError(f"weights.type: {run.weights.type!r}; a pool's trainer publishes its members' adapters "
                          "through 'storage' only")
    for field in sorted(run.inference.model_fields_set):
        if (mine := getattr(run.inference, field)) != (pools := getattr(pool.inference, field)):
            raise ConfigError(f"inference.{field}: {mine!r} is not the pool's {pools!r} (a member generates on the "
                              "pool's inference; leave [inference] out or match pool.toml's)")
    if run.uses_external_inference:
        raise ConfigError("orchestrator.client.base_urls: a member generates on the pool's inference; leave it unset")
    for name in run.served_models():
        raise ConfigError(f"{name}: a member does not serve its own {name}; set orchestrator.{name} to servers "
                          "of your own")


def check_ports(pool: PoolConfig, members: list[Member]) -> None:
    """No two ports the same among the pool's servers and the members' orchestrators (ConfigError
    naming the run and field); whether each is free is checked before the start
    (`bound_ports`, `rlkube.launch.local.check_ports`'s way)."""
    seen: dict[int, str] = {}
    for field, _, port in bound_ports(pool, members):
        if port in seen:
            raise ConfigError(f"{field}: port {port} is also {seen[port]}'s; set it to another port")
        seen[port] = field


def bound_ports(pool: PoolConfig, members: list[Member]) -> list[tuple[str, str, int]]:
    """(field, host, port) of every port the pool's children bind."""
    ports = [("inference.port", pool.inference.host, int(url.rsplit(":", 1)[1])) for url in pool.inference_urls()]
    ports.append(("pool.port", pool.pool.host, pool.pool.port))
    for m in members:
        ports += [(f"{RUN_FLAG} {m.name}: rollouts.port", m.config.rollouts.host, m.config.rollouts.port),
                  (f"{RUN_FLAG} {m.name}: orchestrator.http_port", m.config.rollouts.host, m.config.orchestrator.http_port)]
    return ports


def check_free(pool: PoolConfig, members: list[Member]) -> None:
    """Every port the pool will bind must be free before anything starts (RuntimeError naming it)."""
    from rlkube.inference.process import ensure_port_free

    for field, host, port in bound_ports(pool, members):
        ensure_port_free(host, port, field)


def write_configs(pool: PoolConfig, members: list[Member]) -> dict[str, Path]:
    """`<pool>/configs/{pool,inference}.toml` and each member's `configs/{trainer,orchestrator}.toml`
    (keys `<member>/trainer`, `<member>/orchestrator`); returns their paths."""
    paths = {"pool": pool.output_dir / "configs" / "pool.toml", "inference": pool.output_dir / "configs" / "inference.toml"}
    write_toml(pool.trainer_config(), paths["pool"])
    write_toml(pool.inference_config(), paths["inference"])
    for m in members:
        for kind, config in (("trainer", m.trainer), ("orchestrator", m.orchestrator)):
            paths[f"{m.name}/{kind}"] = m.output_dir / "configs" / f"{kind}.toml"
            write_toml(config, paths[f"{m.name}/{kind}"])
    return paths


def child_stages(pool: PoolConfig, members: list[Member], paths: dict[str, Path]) -> list[list[ChildSpec]]:
    """The pool's inference replicas and trainer first (given the pool's token: they derive each
    member's credentials from it), then, once inference is healthy, each member's orchestrator
    and env workers with that member's credentials alone (`rlkube.scopes.member_env`); a
    member's children fail that member alone (`ChildSpec.member`)."""
    logs = pool.output_dir / "logs"
    token = auth.run_token() or auth.new_token()
    pool_env = {TOKEN_ENV: token}
    inference = [
        ChildSpec(f"inference-{i}", [*module_argv("inference"), "@", str(paths["inference"]), "--port", url.rsplit(":", 1)[1]],
                  logs / f"inference-{i}.log", env=pool_env, health_url=f"{url}/health")
        for i, url in enumerate(pool.inference_urls())
    ]
    argv, env = trainer_argv(pool.trainer.nproc_per_node, paths["pool"], "pool_trainer")
    trainer = ChildSpec("pool-trainer", argv, logs / "pool-trainer.log", env=env | pool_env)
    runs = []
    for m in members:
        config_path = str(paths[f"{m.name}/orchestrator"])
        runs.append(ChildSpec(f"{m.name}/orchestrator", [*module_argv("orchestrator"), "@", config_path],
                              m.output_dir / "logs" / "orchestrator.log", env=member_env(token, m.name, "orchestrator"),
                              must_finish=True, member=m.name))
        runs += [ChildSpec(f"{m.name}/env-worker-{i}", [*module_argv("env_worker"), "@", config_path],
                           m.output_dir / "logs" / f"env-worker-{i}.log", env=member_env(token, m.name, "env-worker"),
                           max_restarts=ENV_WORKER_RESTARTS, member=m.name)
                 for i in range(m.orchestrator.env_workers)]
    return [[*inference, trainer], runs]
