"""`rlkube rl`: one config for the whole loop, split into per-process configs.

Shared fields (model, output_dir, max_steps, checkpoints, W&B, weight transfer) are defined
once here; `RLConfig.process_configs` derives each process's view with a pure function, so
nothing is configured in two places and kept in sync by validators.
"""

from pydantic import Field, model_validator

from rlkube.config.base import Config
from rlkube.config.inference import (
    POLICY_ADAPTER,
    InferenceConfig,
    InferenceSection,
    InferenceServerConfig,
    JudgeServerSection,
    ServedModelSection,
    TeacherServerSection,
)
from rlkube.config.orchestrator import (
    ClientConfig,
    OrchestratorSection,
    PoolMemberConfig,
    RolloutServerConfig,
)
from rlkube.config.shared import PlannedGpuConfig, RunConfig
from rlkube.config.trainer import LossConfig, TrainerCommonConfig, TrainerMetricsConfig
from rlkube.config.weights import WeightTransferConfig


class RLTrainerSection(TrainerCommonConfig):
    """The `[trainer]` section of an RL config."""

    loss: LossConfig = LossConfig()
    """The policy-gradient loss."""

    nproc_per_node: int = Field(default=1, ge=1)
    """Trainer processes `rlkube rl` starts with `torchrun` on this machine."""

    gpus: list[int] | None = None
    """`rlkube rl` on a GPU machine: the GPU (index among the visible ones) of each trainer
    rank; the ones after the inference replicas' when unset (`rlkube.launch.gpus`)."""

    metrics: TrainerMetricsConfig = TrainerMetricsConfig()
    """Prometheus endpoint and MFU reference (`perf/*` metrics)."""

    compile_cache_url: str | None = None
    """A path or fsspec URL (`s3://bucket/run/compile_cache`) that keeps torch's compiled
    kernels for restarts on other machines (`rlkube.trainer.compile_cache`); the local cache is
    `<output_dir>/compile_cache/` either way."""


def nccl_needs_cuda(device: str, weights: WeightTransferConfig, field: str) -> None:
    """NCCL broadcasts from GPU memory: a trainer told to train on the CPU cannot start it."""
    if weights.type == "nccl" and device == "cpu":
        raise ValueError(f"weights.type 'nccl' broadcasts from GPU memory, but {field} is 'cpu': use "
                         "weights.type 'storage', 'grpc' or 'nixl' on CPUs, or train on 'cuda'")


class TrainerConfig(RunConfig, RLTrainerSection):
    """`rlkube trainer @ trainer.toml` (under `torchrun`): the RL trainer."""

    rollouts: RolloutServerConfig = RolloutServerConfig()
    """Where to fetch batches (the orchestrator's gRPC server)."""

    weights: WeightTransferConfig = WeightTransferConfig()
    """How to publish new weights."""

    @model_validator(mode="after")
    def _nccl_on_a_gpu(self):
        nccl_needs_cuda(self.device, self.weights, "device")
        return self


class OrchestratorConfig(RunConfig, OrchestratorSection):
    """`rlkube orchestrator @ orchestrator.toml`: environments, rollouts and batches."""

    rollouts: RolloutServerConfig = RolloutServerConfig()
    """The gRPC server the trainer fetches batches from."""

    weights: WeightTransferConfig = WeightTransferConfig()
    """Where inference loads new weights from."""

    pool: PoolMemberConfig | None = None
    """A member run of a pool (`rlkube pool-trainer` and the pool's inference); a solo run when unset."""

    @model_validator(mode="after")
    def _member_of_a_pool(self):
        """A member generates with its own adapter on the pool's inference, which the pool
        trainer publishes through storage: its orchestrator names the adapter and loads it by name."""
        if self.pool is None:
            return self
        member = self.pool.member
        if self.client.lora_adapter is None:
            self.client = self.client.model_copy(update={"lora_adapter": member})
        elif self.client.lora_adapter != member:
            raise ValueError(f"client.lora_adapter: {self.client.lora_adapter!r}; a pool member's adapter is served "
                             f"under its member name, pool.member {member!r} (leave lora_adapter unset)")
        if self.weights.type != "storage":
            raise ValueError(f"weights.type: {self.weights.type!r}; a pool's trainer publishes its members' adapters "
                             "through 'storage' only (a member has no weight server or NCCL group of its own)")
        return self


class RLConfig(RunConfig, PlannedGpuConfig):
    """`rlkube rl @ rl.toml`: inference, orchestrator and trainer from one file."""

    RENAMED = {"seq_len": "orchestrator.seq_len"}

    trainer: RLTrainerSection = RLTrainerSection()
    """The trainer."""

    orchestrator: OrchestratorSection = OrchestratorSection()
    """The orchestrator."""

    inference: InferenceSection = InferenceSection()
    """The inference servers."""

    rollouts: RolloutServerConfig = RolloutServerConfig()
    """The orchestrator-to-trainer gRPC endpoint."""

    weights: WeightTransferConfig = WeightTransferConfig()
    """Trainer-to-inference weight transfer."""

    teacher: TeacherServerSection | None = None
    """A teacher for on-policy distillation that `rlkube rl` serves itself (beside inference,
    never updated) and points `orchestrator.teacher` at; leave it out and set
    `orchestrator.teacher` to use servers of your own. Local runs only: an RLRun has its own
    `teacher` block."""

    judge: JudgeServerSection | None = None
    """A judge for environments scored by verifiers' judges that `rlkube rl` serves itself (beside
    inference, never updated) and points `orchestrator.judge` at; leave it out and set
    `orchestrator.judge` to use servers of your own. Local runs only: an RLRun has its own
    `judge` block."""

    @model_validator(mode="after")
    def _nccl_on_a_gpu(self):
        nccl_needs_cuda(self.trainer.device, self.weights, "trainer.device")
        return self

    @model_validator(mode="after")
    def _local_urls_match_replicas(self):
        urls = self.orchestrator.client.base_urls
        if "base_urls" in self.orchestrator.client.model_fields_set and len(urls) != self.inference.replicas:
            raise ValueError(
                f"orchestrator.client.base_urls has {len(urls)} entries but inference.replicas is "
                f"{self.inference.replicas}"
            )
        return self

    @model_validator(mode="after")
    def _distillation_has_a_teacher(self):
        loss = self.trainer.loss
        if loss.uses_teacher and self.orchestrator.teacher is None and self.teacher is None:
            raise ValueError(
                f"trainer.loss.type '{loss.type}' with trainer.loss.teacher_kl_coef {loss.teacher_kl_coef:g} "
                "distills from a teacher, but neither teacher (a server rlkube rl starts) nor "
                "orchestrator.teacher (servers of your own: model and base_urls) is set"
            )
        return self

    @model_validator(mode="after")
    def _served_models_are_ours(self):
        """A served `[teacher]` or `[judge]` is the orchestrator's only one of its kind, on ports
        of its own."""
        taken = {} if self.uses_external_inference else dict.fromkeys(self._ports(self.inference), "inference")
        for name, section in self.served_models().items():
            if getattr(self.orchestrator, name) is not None:
                raise ValueError(
                    f"orchestrator.{name}: rlkube rl points the orchestrator at the [{name}] it serves; "
                    f"set one of the two (orchestrator.{name} for servers of your own)"
                )
            for port in self._ports(section):
                if (other := taken.get(port)) is not None:
                    raise ValueError(f"{name}.port: port {port} is also {'an' if other == 'inference' else 'a'} {other} "
                                     f"replica's ({other}.port {getattr(self, other).port}, "
                                     f"{getattr(self, other).replicas} replicas)")
                taken[port] = name
        return self

    def served_models(self) -> dict[str, ServedModelSection]:
        """The models `rlkube rl` serves beside inference (`[teacher]`, `[judge]`), by name."""
        return {name: section for name in ("teacher", "judge") if (section := getattr(self, name)) is not None}

    @staticmethod
    def _ports(section: InferenceServerConfig) -> range:
        return range(section.port, section.port + section.replicas)

    @model_validator(mode="after")
    def _context_fits(self):
        """Only an explicit `inference.max_model_len` is known here (the model's own needs its
        config.json); the prompt is at least one token."""
        max_model_len, orchestrator = self.inference.max_model_len, self.orchestrator
        if max_model_len is None:
            return self
        if max_model_len < orchestrator.seq_len:
            raise ValueError(
                f"inference.max_model_len ({max_model_len}) is shorter than orchestrator.seq_len "
                f"({orchestrator.seq_len}): the trainer's rows would be longer than the longest "
                "sequence inference serves; raise max_model_len or lower seq_len"
            )
        samplings = {"orchestrator.sampling": orchestrator.sampling}
        if orchestrator.eval is not None:
            samplings["orchestrator.eval.sampling"] = orchestrator.eval.sampling
        for field, sampling in samplings.items():
            if sampling.max_tokens >= max_model_len:
                raise ValueError(
                    f"{field}.max_tokens ({sampling.max_tokens}) leaves no room for a prompt "
                    f"within inference.max_model_len ({max_model_len})"
                )
        return self

    @property
    def uses_external_inference(self) -> bool:
        """`orchestrator.client.base_urls` given: attach to those servers instead of starting any."""
        return "base_urls" in self.orchestrator.client.model_fields_set

    def inference_urls(self) -> list[str]:
        """The replicas' URLs: as given, or `host:port+i` for the local launcher."""
        if self.uses_external_inference:
            return list(self.orchestrator.client.base_urls)
        return self._urls(self.inference)

    def served_urls(self, name: str) -> list[str]:
        """The `[teacher]` or `[judge]` replicas' URLs, `host:port+i`; none when it is not set."""
        section = getattr(self, name)
        return self._urls(section) if section else []

    def _urls(self, section: InferenceServerConfig) -> list[str]:
        return [f"http://{section.host}:{port}" for port in self._ports(section)]

    def process_configs(self, exclude_unset: bool = False) -> dict[str, Config]:
        """Each process's resolved config: `trainer`, `orchestrator` and one `inference` for
        all replicas (the local launcher and the operator set each replica's port), and one
        `teacher` for the `[teacher]` replicas.
        and one `judge` for the `[judge]` replicas.
        `exclude_unset`: each carries only what was set here (and what is derived from it, the
        inference URLs), so its TOML leaves the rest to the defaults of the runtime reading it."""

        def dump(model: Config, **kwargs) -> dict:
            return model.model_dump(exclude_unset=exclude_unset, **kwargs)

        shared = dump(self, include=set(RunConfig.model_fields))
        weights = dump(self.weights)
        if self.weights.type == "nccl" and not self.weights.inference_urls:
            weights["inference_urls"] = self.inference_urls()  # the trainer drives the replicas
        sections = {"rollouts": dump(self.rollouts), "weights": weights}
        trainer = TrainerConfig.model_validate(shared | dump(self.trainer, exclude={"gpus"}) | sections)
        lora = self.trainer.lora
        serves_adapter = lora is not None and lora.serving == "adapter"
        client = ClientConfig.model_validate(
            dump(self.orchestrator.client) | {"base_urls": self.inference_urls()}
            | ({"lora_adapter": POLICY_ADAPTER} if serves_adapter else {})
        )
        served = {name: {"model": section.model.name, "base_urls": self.served_urls(name), "served_by_run": True}
                  | ({"sampling": section.sampling} if isinstance(section, JudgeServerSection) else {})
                  for name, section in self.served_models().items()}
        orchestrator = OrchestratorConfig.model_validate(
            shared | dump(self.orchestrator) | sections | {"client": dump(client)} | served
        )
        inference = InferenceConfig.model_validate(
            dump(self.inference, exclude={"replicas", "gpus"})
            | {key: shared[key] for key in ("model", "seed", "log") if key in shared}
            | ({"max_lora_rank": lora.rank} if serves_adapter else {})
            | ({"return_routed_experts": True} if self.trainer.loss.router_replay else {})
        )
        configs = {"inference": inference, "orchestrator": orchestrator, "trainer": trainer}
        for name, section in self.served_models().items():  # served as they are: no policy versions
            configs[name] = InferenceConfig.model_validate(
                dump(section, exclude={"replicas", "gpus", "sampling"})
                | {key: shared[key] for key in ("seed", "log") if key in shared}
                | {"port": section.port, "start_paused": False}
            )
        return configs
