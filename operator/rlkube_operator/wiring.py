"""The per-process TOML files of a run, wired for the cluster (pure functions).

The user's `spec.config` is the same config as on one machine; here the operator fills in
what only the cluster knows: the inference (and teacher, judge) pods' DNS names, the orchestrator
Service, the trainer master Service, the output directory on the PVC, and the object-store
URLs for weights and checkpoints. Addresses a process binds are `0.0.0.0`; addresses it
dials are Service DNS names that survive restarts.

The files carry what the user set in `spec.config` and what the operator sets, nothing else:
the runtime fills in its own defaults. An operator that knows a config field the run's image
does not therefore still starts it, as long as nobody sets that field (and if someone does,
the runtime names the field and both versions).

The files do not depend on the attempt: `ckpt.resume_step = "latest"` from the first start,
so any process that restarts (a gang restart, a killed orchestrator or inference pod, a resume
after suspend) rejoins the run's newest complete checkpoint, or starts fresh when there is none.
"""

from pathlib import PurePosixPath

from rlkube.config import InferenceConfig, PoolMemberConfig, RLConfig, TrainerConfig, to_toml
from rlkube.config.pool import PoolSection, PoolTrainerConfig

from rlkube_operator.names import CONFIG_MOUNT, SFT_STATUS_PORT, TRAINER_METRICS_PORT, RunRef
from rlkube_operator.poolspec import RLPoolSpec
from rlkube_operator.spec import SERVED_MODELS, RLRunSpec, RunSpecBase, SFTRunSpec

EMPTYDIR_OUTPUT = "/var/lib/rlkube"
INFERENCE_URLS = "inference_urls"
"""The ConfigMap key (and file in the orchestrator's and env workers' pods) listing the inference
replicas' URLs, one a line: `client.base_urls_file`, which the orchestrator reads again while it
runs, so a change of `spec.inference.replicas` reaches it without a restart."""
ANY_ADDRESS = "0.0.0.0"


def output_dir(run: RunRef, spec: RunSpecBase) -> str:
    """`<pvc mountPath>/<run>`, or an emptyDir path (lost with the pod) without a PVC."""
    base = spec.storage.pvc.mount_path if spec.storage.pvc else EMPTYDIR_OUTPUT
    return str(PurePosixPath(base) / run.name)


def _object_store_url(run: RunRef, spec: RunSpecBase, what: str) -> str | None:
    store = spec.storage.object_store
    return f"{store.url.rstrip('/')}/{run.namespace}/{run.name}/{what}" if store else None


def _shared(run: RunRef, spec: RunSpecBase, data: dict) -> dict:
    """What both kinds get: the output directory, and checkpoints that any restart resumes."""
    data["output_dir"] = output_dir(run, spec)
    if (ckpt := data.get("ckpt")) is not None:
        ckpt["resume_step"] = "latest"
        if ckpt.get("url") is None and (url := _object_store_url(run, spec, "checkpoints")):
            ckpt["url"] = url
    return data


ORCHESTRATOR_DIR = "orchestrator"
"""The orchestrator's own directory in a run's output directory on a claim (its metrics,
samples, W&B files): it may write there and in its checkpoint parts, nowhere else (`pods.volume_mounts`)."""


def _checkpoint_root(run: RunRef, spec: RunSpecBase) -> str | None:
    """Where the run's checkpoints go (`ckpt.url`, the store's, or the output directory's); None without."""
    ckpt = getattr(spec.config, "ckpt", None)
    if ckpt is None:
        return None
    return ckpt.url or _object_store_url(run, spec, "checkpoints") or f"{output_dir(run, spec)}/checkpoints"


def orchestrator_writes(run: RunRef, spec: RLRunSpec) -> list[str]:
    """The directories of the run's claim the orchestrator writes, relative to its mount: its own
    directory and its checkpoint parts (`<root>/orchestrator/`, when the root is on the claim)."""
    pvc = spec.storage.pvc
    if pvc is None:
        return []
    mount = PurePosixPath(pvc.mount_path)
    dirs = [str(PurePosixPath(run.name) / ORCHESTRATOR_DIR)]
    root = _checkpoint_root(run, spec)
    if root is not None and "://" not in root and PurePosixPath(root).is_relative_to(mount):
        dirs.append(str(PurePosixPath(root).relative_to(mount) / ORCHESTRATOR_DIR))
    return dirs


def _user_set(spec: RunSpecBase) -> dict:
    """`spec.config` as the user wrote it: only the fields they set."""
    return spec.config.model_dump(exclude_unset=True)


def _section(data: dict, *path: str) -> dict:
    """`data[path]`, made (empty) where the user left it out."""
    for key in path:
        data = data.setdefault(key, {})
    return data


def _served(server: dict, gpus_per_replica: int) -> dict:
    """A vLLM server's settings in its pod: every interface bound, the model sharded over the
    pod's GPUs."""
    server["host"] = ANY_ADDRESS
    if gpus_per_replica:
        server["tensor_parallel_size"] = gpus_per_replica
    return server


def server_urls(run: RunRef, component: str, replicas: int, port: int) -> list[str]:
    """Each server pod of `component` by its stable name (the headless Service's)."""
    return [f"http://{run.pod_host(component, i)}:{port}" for i in range(replicas)]


def trainer_metrics_port(spec: RunSpecBase) -> int | None:
    """Where an RLRun's trainer (rank 0) serves `/metrics` in its pod: the user's
    `trainer.metrics.prometheus_port`, else `TRAINER_METRICS_PORT` (0, any free port, could not
    be scraped). An SFTRun's trainer serves none."""
    if not isinstance(spec, RLRunSpec):
        return None
    return spec.config.trainer.metrics.prometheus_port or TRAINER_METRICS_PORT


def rl_config(run: RunRef, spec: RLRunSpec) -> RLConfig:
    """The RLRun's config with the cluster's addresses, before splitting per process. Its set
    fields are the user's and the operator's."""
    data = _shared(run, spec, _user_set(spec))
    inference = _served(_section(data, "inference"), spec.inference.gpus_per_replica)
    inference["replicas"] = spec.inference.replicas
    _section(data, "orchestrator", "client").update(
        base_urls=server_urls(run, "inference", spec.inference.replicas, spec.config.inference.port),
        base_urls_file=f"{CONFIG_MOUNT}/{INFERENCE_URLS}")
    for name, served in spec.served_models().items():
        _section(data, "orchestrator", name).update(
            model=served.model.name, base_urls=server_urls(run, name, served.replicas, served.server.port),
            served_by_run=True, **served.client_settings())
    for name in SERVED_MODELS:  # a user's servers are never sent the run's credential
        if name not in spec.served_models() and (client := data["orchestrator"].get(name)) is not None:
            client["served_by_run"] = False
    _section(data, "rollouts")["host"] = run.service_host("orchestrator")
    _section(data, "orchestrator")["env_workers"] = spec.env_workers.replicas  # the env-worker Deployment's
    if spec.tool_service is not None:
        _wire_tool_service(data, run, spec.tool_service.port)
    weights, transfer = _section(data, "weights"), spec.config.weights.type
    if transfer == "storage" and weights.get("url") is None:
        weights["url"] = _object_store_url(run, spec, "weights")
    if spec.storage.pvc is None and (url := _object_store_url(run, spec, "compile_cache")):
        _section(data, "trainer").setdefault("compile_cache_url", url)  # else the PVC keeps it
    # the scraper reaches rank 0's Prometheus endpoint from outside the pod, like the orchestrator's
    _section(data, "trainer", "metrics").update(prometheus_port=trainer_metrics_port(spec), prometheus_host=ANY_ADDRESS)
    if transfer in ("grpc", "nixl", "nccl"):
        # Inference dials (gRPC; NIXL for its descriptors) or rendezvous at (NCCL) the trainer's
        # rank 0 by its stable Service; the weight server binds every interface of its pod.
        weights |= {"grpc_host": run.trainer_master, "grpc_bind_host": ANY_ADDRESS}
    return type(spec.config).model_validate(data)


def served_config(spec: RLRunSpec, name: str) -> InferenceConfig:
    """What `rlkube inference` serves the teacher or the judge with: its model and server
    settings, unpaused (no orchestrator brings it to a policy version: its weights never change)."""
    served = getattr(spec, name)
    data = _served(served.server.model_dump(exclude_unset=True), served.gpus_per_replica)
    data |= {"model": served.model.model_dump(exclude_unset=True), "start_paused": False}
    return InferenceConfig.model_validate(data)


def rl_tomls(run: RunRef, spec: RLRunSpec) -> dict[str, str]:
    """`{inference,orchestrator,trainer}.toml` → text, and `teacher.toml`, `judge.toml` for a run
    that serves them."""
    return _rl_tomls(rl_config(run, spec), spec)


def _rl_tomls(rl: RLConfig, spec: RLRunSpec) -> dict[str, str]:
    configs = in_pods(rl.process_configs(exclude_unset=True), spec)
    configs |= {name: served_config(spec, name) for name in spec.served_models()}
    return {f"{name}.toml": to_toml(config, exclude_unset=True) for name, config in configs.items()}


def in_pods(configs: dict, spec: RLRunSpec) -> dict:
    """`configs` (`RLConfig.process_configs`) as their pods run them: the orchestrator serves
    batches on every interface and, on a claim, writes in its own directory (the rest of the
    claim is read-only to it: `orchestrator_writes`), its checkpoint parts beside the trainer's."""
    orchestrator = configs["orchestrator"]
    orchestrator.rollouts.host = ANY_ADDRESS
    if spec.storage.pvc is not None:
        if orchestrator.ckpt is not None and orchestrator.ckpt.url is None:
            orchestrator.ckpt.url = f"{orchestrator.output_dir}/checkpoints"  # the trainer's root
        orchestrator.output_dir = orchestrator.output_dir / ORCHESTRATOR_DIR
    return configs


def rl_files(run: RunRef, spec: RLRunSpec) -> dict[str, str]:
    """The RLRun's ConfigMap data: `rl_tomls` and `INFERENCE_URLS`, the replicas the
    orchestrator's `client.base_urls` lists (one source, so the two never disagree)."""
    rl = rl_config(run, spec)
    urls = rl.orchestrator.client.base_urls
    return _rl_tomls(rl, spec) | {INFERENCE_URLS: "".join(f"{url}\n" for url in urls)}


def sft_tomls(run: RunRef, spec: SFTRunSpec) -> dict[str, str]:
    data = _shared(run, spec, _user_set(spec))
    data |= {"status_port": SFT_STATUS_PORT, "status_host": ANY_ADDRESS}
    return {"sft.toml": to_toml(type(spec.config).model_validate(data), exclude_unset=True)}


# --- pools (`poolspec`): the pool's trainer and inference, and each member's orchestrator ---------
POOL_FILE = "pool.toml"
"""The pool trainer's config in the pool's ConfigMap (`rlkube.config.pool.PoolTrainerConfig`)."""
POOL_PORT = PoolSection.model_fields["port"].default
"""The pool trainer's Attach/Detach service (rank 0), where members attach."""


def pool_trainer_address(pool: RunRef) -> str:
    """Where members attach: rank 0's stable Service, on `POOL_PORT`."""
    return f"{pool.trainer_master}:{POOL_PORT}"


def pool_inference_urls(pool: RunRef, spec: RLPoolSpec) -> list[str]:
    return server_urls(pool, "inference", spec.inference.replicas, spec.config.inference.port)


def pool_files(pool: RunRef, spec: RLPoolSpec) -> dict[str, str]:
    """`pool.toml` (the pool trainer: the base model, the adapters' slot of rank `maxLoraRank`,
    `maxRuns` members, its Attach service on every interface, the inference replicas it unloads
    a departed member's adapter from) and `inference.toml` (vLLM with
    LoRA: `maxRuns` adapters at once, of rank `maxLoraRank`, serving from the start), wired as a
    run's are."""
    data = _shared(pool, spec, _user_set(spec))
    _served(_section(data, "inference"), spec.inference.gpus_per_replica)["replicas"] = spec.inference.replicas
    _section(data, "trainer", "lora")["rank"] = spec.max_lora_rank
    trainer = PoolTrainerConfig.model_validate({
        "output_dir": data["output_dir"], "trainer": data["trainer"],
        **{key: data[key] for key in ("model", "log") if key in data},
        "pool": {"name": pool.name, "max_runs": spec.max_runs, "host": ANY_ADDRESS, "port": POOL_PORT,
                 "inference_urls": pool_inference_urls(pool, spec)}})
    configs = RLConfig.model_validate(data).process_configs(exclude_unset=True)
    # Not started paused: no member may resume the shared server, and none pauses it (each loads
    # its own adapter in place); a member's first requests wait for its step-0 adapter instead.
    pooled = {"max_lora_rank": spec.max_lora_rank, "max_loras": spec.max_runs, "start_paused": False}
    inference = configs["inference"].model_copy(update=pooled)
    inference.model_fields_set.update(pooled)
    return {POOL_FILE: to_toml(trainer, exclude_unset=True), "inference.toml": to_toml(inference, exclude_unset=True)}


MEMBER_TRAINER_FILE = "trainer.toml"
"""A member's own trainer config in its ConfigMap, which its orchestrator sends the pool trainer
with Attach (`orchestrator.pool.trainer_config`)."""


TOOL_ENVS = ("tool_chain",)
"""Envs that call the tool service at their `tool_url` arg."""


def _wire_tool_service(data: dict, run: RunRef, port: int) -> None:
    """The run's tool service as the `tool_url` of each tool env that names none."""
    url = f"http://{run.service_host('tool-service')}:{port}"
    for env in _section(data, "orchestrator").get("envs") or []:
        if env.get("id") in TOOL_ENVS:
            env.setdefault("args", {}).setdefault("tool_url", url)


def member_files(run: RunRef, spec: RLRunSpec, pool: RunRef, pool_spec: RLPoolSpec, member: str) -> dict[str, str]:
    """A member's `orchestrator.toml` (and `INFERENCE_URLS`, `MEMBER_TRAINER_FILE`): its own
    config in member mode (`[pool]`: it attaches itself to the pool's trainer with its own
    trainer config), generating on the pool's inference with its adapter (`client.lora_adapter`
    = the member's name), the pool's base model. Its trainer config leaves where checkpoints and
    adapters go to the pool trainer: under the pool's storage, per member."""
    data = _shared(run, spec, _user_set(spec))
    data.setdefault("model", {})["name"] = pool_spec.config.model.name
    urls = pool_inference_urls(pool, pool_spec)
    _section(data, "orchestrator", "client").update(base_urls=urls, base_urls_file=f"{CONFIG_MOUNT}/{INFERENCE_URLS}")
    _section(data, "rollouts")["host"] = run.service_host("orchestrator")
    _section(data, "orchestrator")["env_workers"] = spec.env_workers.replicas
    rl = type(spec.config).model_validate(data)
    configs = in_pods(rl.process_configs(exclude_unset=True), spec)
    orchestrator = configs["orchestrator"]
    orchestrator.client.lora_adapter = member  # not a solo run's `rlkube-policy`
    orchestrator.pool = PoolMemberConfig(
        member=member, trainer=pool_trainer_address(pool), trainer_config=f"{CONFIG_MOUNT}/{MEMBER_TRAINER_FILE}",
        address=f"{run.service_host('orchestrator')}:{orchestrator.rollouts.port}")
    trainer = configs["trainer"].model_dump(mode="json", exclude_unset=True)
    for section in ("ckpt", "weights"):
        (trainer.get(section) or {}).pop("url", None)  # the pool's storage, `members/<member>/`
    return {"orchestrator.toml": to_toml(orchestrator, exclude_unset=True),
            MEMBER_TRAINER_FILE: to_toml(TrainerConfig.model_validate(trainer), exclude_unset=True),
            INFERENCE_URLS: "".join(f"{url}\n" for url in urls)}
