"""The RLRun and SFTRun specs as pydantic models: the CRD schemas are generated from these.

`spec.config` embeds the runtime's own config model (`RLConfig` / `SFTConfig`, the same structure
as the TOML); the rest is what only Kubernetes needs. Each section has a module of its own: the
components' sizes (`components`), their pods (`podsettings`, `podsecurity`), `storage`; here are
the run-level knobs (image, suspend, queue, restart policy, deadlines) and the rules that span
sections, as CEL for admission and as validators for the operator. Kubernetes-facing fields are
camelCase (`schema.K8sModel`); the embedded config keeps the TOML's snake_case.
"""

import copy
import json
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from rlkube.config import OrchestratorSection, RLConfig, SFTConfig

from rlkube_operator.components import (
    EnvWorkersSpec,
    InferenceSpec,
    JudgeSpec,
    OrchestratorSpec,
    ServedModelSpec,
    TeacherSpec,
    ToolServiceSpec,
    TrainerSpec,
)
from rlkube_operator.credentials import URL_CREDENTIALS_RE, url_credentials, urls_in
from rlkube_operator.egress import NetworkSpec
from rlkube_operator.podsecurity import PodSecurityContext
from rlkube_operator.podsettings import SchedulingSpec
from rlkube_operator.schema import K8sModel, cel
from rlkube_operator.storage import (
    PVC_NODES_RULE,
    StorageSpec,
    check_claim_reaches,
    one_pod_claim_rule,
)


class QueueSpec(K8sModel):
    """A Kueue LocalQueue: the run is admitted, evicted and finished as one Kueue Workload."""

    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """The LocalQueue in the run's namespace (what `kueue.x-k8s.io/queue-name` names)."""

    priority_class_name: str | None = None
    """A Kueue WorkloadPriorityClass: the Workload's priority in its ClusterQueue."""


class PoolRef(K8sModel):
    """The RLPool a run attaches to (Gateway API's `parentRefs`): the pool's trainer trains the
    run's LoRA adapter and the pool's inference serves it; the run has only its orchestrator and
    env workers."""

    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    """The RLPool's name."""

    namespace: str | None = Field(default=None, min_length=1, max_length=63,
                                  pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """Its namespace; unset: the run's own. The pool's `allowedRuns` says whether the run's
    namespace may attach."""


class RestartPolicy(K8sModel):
    backoff_limit: int = Field(default=3, ge=0, le=100)
    """Gang restarts of the trainer (from the latest checkpoint) before the run is Failed."""


def _or_default(model: type[BaseModel], field: str) -> str:
    """A config field in CEL, or the runtime's default where the user left it out: the CRD
    carries no defaults inside `spec.config` (the stored object says only what the user wrote)."""
    return f"(has(self.{field}) ? self.{field} : {json.dumps(model.model_fields[field].default)})"


def _config_rule(rule: str, message: str, field: str) -> dict:
    """A CEL rule on a node inside `spec.config`; the API server's error names `field`."""
    return {"message": message, "rule": rule, "fieldPath": f".{field}"}


class ExportSpec(K8sModel):
    """Export the final policy when the run Succeeds: a Job from the run's image runs `rlkube
    export` on its newest checkpoint (checked against its signed manifest first), the run's claim
    mounted read-only, and writes a Hugging Face model directory (transformers and vLLM load it)
    to `<path>/model` of a claim (only `path` writable) or `<url>/model` in the run's object
    store; `status.export` names it, condition `Exported` says how it went."""

    model_config = ConfigDict(json_schema_extra=cel(
        ("has(self.path) != has(self.url)", ("spec.export needs exactly one of path (a claim's directory) "
                                            "and url (an object-store URL)")),
        ("!has(self.url) || !has(self.claimName)", "spec.export.claimName names a claim for path, not for url"),
        (f"!has(self.url) || !self.url.matches('{URL_CREDENTIALS_RE}')",
         "spec.export.url must not hold credentials: put them in the Secret named by storage.objectStore.secretName"),
    ))

    claim_name: str | None = Field(default=None, max_length=253)
    """The claim to write to with `path` (one the run owns or the admin allows:
    `guardrails.allowedClaims`); the run's own storage claim when unset."""

    path: str | None = Field(default=None, max_length=512,
                             pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*$")
    """The directory in that claim, relative (`exports/reverse-text`: no `..`, no leading `/`)."""

    url: str | None = Field(default=None, max_length=1024, pattern=r"^[a-z][a-z0-9+.-]*://.+")
    """Instead of `path`: an fsspec URL (`s3://bucket/exports/reverse-text`) reached with the
    run's `storage.objectStore` (its `secretName` and `endpointUrl`, which the export pod gets);
    refused for a run without one. No credentials in it."""

    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    """The exported weights' dtype (`rlkube export --dtype`); `auto` keeps the base model's."""

    lora: Literal["merge", "adapter"] | None = None
    """A LoRA run's export: the adapters merged into the base model (`merge`, the default) or
    the PEFT adapter directory (`adapter`); refused for a run that trained every weight."""

    @model_validator(mode="after")
    def _one_target(self):
        """A claim's directory or an object-store URL; the error does not echo the URL."""
        if (self.path is None) == (self.url is None):
            raise ValueError("spec.export needs exactly one of path (a claim's directory) and url (an object-store URL)")
        if self.url is not None and self.claim_name is not None:
            raise ValueError("spec.export.claimName names a claim for path, not for url")
        if self.url is not None and (found := url_credentials(self.url)):
            raise ValueError(f"spec.export.url holds a credential ({found}); put credentials in the Secret named by "
                             "storage.objectStore.secretName, never in a URL")
        return self


class RunSpecBase(K8sModel):
    """What RLRun and SFTRun share."""

    image: str = Field(min_length=1)
    """The rlkube runtime image (`rlkube-runtime-cpu` or `rlkube-runtime-gpu`)."""

    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """Image pull policy of every container."""

    image_pull_secrets: list[str] = Field(default_factory=list, max_length=16)
    """Names of Secrets for pulling the image."""

    service_account_name: str | None = None
    """ServiceAccount of the run's pods (for example one with object-store access)."""

    trainer: TrainerSpec = TrainerSpec()
    """The trainer pods."""

    storage: StorageSpec = StorageSpec()
    """Checkpoints and weights."""

    suspend: bool = False
    """True scales every compute child to zero and keeps storage; false again resumes from the
    latest checkpoint."""

    restart_policy: RestartPolicy = RestartPolicy()
    """What happens when a trainer pod fails."""

    active_deadline_seconds: int | None = Field(default=None, ge=1)
    """The longest the whole run may take, in seconds of wall time from `status.startTime` (its
    first start; a run created suspended, waiting in a queue, starts its clock when released;
    time suspended after that counts). Past it the run is Failed with reason
    `DeadlineExceeded`: inference, the orchestrator and the env workers are deleted, and the
    trainer stops, since
    each trainer Job is created with the time left as its own `activeDeadlineSeconds` (so
    Kubernetes stops it even while the operator is down). Checkpoints stay. Unset: no limit.
    Fixed once the run has started."""

    ttl_seconds_after_finished: int | None = Field(default=None, ge=0)
    """Seconds after the run finished (Succeeded or Failed: `status.completionTime`) when the
    operator deletes the run itself, and with it every child: the trainer Job and its logs, the
    ConfigMap, and a PVC the operator created (a `storage.pvc.claimName` claim and object-store
    data stay). 0 deletes it as soon as it finishes; unset keeps it until deleted. Like a Job's
    `ttlSecondsAfterFinished`, but for the whole run. Applies live, also to a finished run."""

    scheduling: SchedulingSpec = SchedulingSpec()
    """Scheduling knobs for every pod."""

    queue: QueueSpec | None = None
    """Queue the run in Kueue: until its Workload is admitted the run has no pods (phase
    Pending, reason `Queued`) and its `activeDeadlineSeconds` does not run; evicted, it scales
    to zero without spending `backoffLimit` and resumes from the latest checkpoint when
    admitted again. Unset: the run starts at once."""

    security_context: PodSecurityContext = PodSecurityContext()
    """Security context of every pod; the `restricted` Pod Security Standard by default."""

    network: NetworkSpec = NetworkSpec()
    """Where the run's pods may connect, beyond what every run may (`egress.py`)."""

    export: ExportSpec | None = None
    """Export the final policy as a model directory once the run Succeeds; none when unset."""

    @field_validator("security_context", mode="before")
    @classmethod
    def _restricted_when_null(cls, value):
        """A spec stored before the restricted defaults (`securityContext: null`) gets them."""
        return PodSecurityContext() if value is None else value

    @model_validator(mode="after")
    def _no_credentials_in_config_urls(self):
        """The config becomes the run's ConfigMap: a URL in it (`ckpt.url`, `weights.url`, …)
        must not carry credentials either (the error does not echo them)."""
        for path, url in urls_in(self.config.model_dump(exclude_unset=True), "config"):
            if found := url_credentials(url):
                raise ValueError(f"{path} holds a credential ({found}); put credentials in the Secret named "
                                 "by storage.objectStore.secretName, never in a URL")
        return self

    @model_validator(mode="after")
    def _storage_reaches_every_pod(self):
        """Every pod of the run mounts the claim: one the operator creates must allow that."""
        check_claim_reaches(self.storage.pvc, self.trainer.nodes, self._pods())
        if self.export is not None and self.storage.pvc is None:
            raise ValueError("spec.export reads the run's checkpoints from its claim: it needs spec.storage.pvc")
        if self.export is not None and self.export.url is not None and self.storage.object_store is None:
            raise ValueError("spec.export.url writes to the run's object store: it needs spec.storage.objectStore "
                             "(its secretName and endpointUrl reach the URL), or export to a claim with spec.export.path")
        ckpt = getattr(self.config, "ckpt", None)
        if ckpt is not None and isinstance(ckpt.resume_step, int):
            raise ValueError(
                "config.ckpt.resume_step: on Kubernetes every start resumes from the newest complete "
                "checkpoint ('latest'), or starts fresh when there is none; leave it unset"
            )
        return self

    def _pods(self) -> int:
        return self.trainer.nodes


SERVED_MODELS = ("teacher", "judge")
"""The models a run may serve beside the policy, each `spec.<name>` and
`config.orchestrator.<name>` (what the orchestrator asks)."""


def _served_on_one_machine(name: str) -> tuple[str, str]:
    """The CEL rule (and its message) that refuses `config.<name>`, `rlkube rl`'s own server."""
    message = (f"config.{name} is the {name} server `rlkube rl` starts on one machine; in an RLRun use "
               f"spec.{name} (the operator runs its servers)")
    return f"!has(self.config) || !has(self.config.{name})", message


def _get(obj, key: str):
    """A key of a raw dict, or a field of a model, or None."""
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


class RLRunSpec(RunSpecBase):
    """An asynchronous RL run: inference servers, an orchestrator and a trainer."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            PVC_NODES_RULE,
            one_pod_claim_rule(),  # inference, orchestrator and trainer: 3 pods at least
            (
                (
                    "!has(self.config) || !has(self.config.inference)"
                    " || !has(self.config.inference.replicas)"
                    " || self.config.inference.replicas == self.inference.replicas"
                ),
                "config.inference.replicas must equal inference.replicas (or be left out)",
            ),
            (
                (
                    "!has(self.config) || !has(self.config.orchestrator)"
                    " || !has(self.config.orchestrator.env_workers)"
                    " || self.config.orchestrator.env_workers == self.envWorkers.replicas"
                ),
                "config.orchestrator.env_workers must equal envWorkers.replicas (or be left out)",
            ),
            *(_served_on_one_machine(name) for name in SERVED_MODELS),
            (
                (
                    "has(self.poolRef)"
                    " || (has(self.config) && has(self.config.weights) && has(self.config.weights.type)"
                    " && self.config.weights.type != 'storage')"
                    " || has(self.storage.pvc) || has(self.storage.objectStore)"
                ),
                (
                    "config.weights.type 'storage' (the default) needs storage.pvc or"
                    " storage.objectStore; or set config.weights.type to 'grpc'"
                ),
            ),
        )
    )

    CONFIG_RULES: ClassVar[dict[tuple[str, ...], list[dict]]] = {
        # What the runtime's validators check across fields, checked at admission too. Each
        # rule sits on its own node of `spec.config`, so it runs only when the user set it.
        ("orchestrator",): [
            _config_rule(
                f"{_or_default(OrchestratorSection, 'batch_size')} % {_or_default(OrchestratorSection, 'group_size')}"
                " == 0",
                "batch_size must be a multiple of group_size: a batch is whole groups of rollouts"
                f" (defaults {OrchestratorSection.model_fields['batch_size'].default} and"
                f" {OrchestratorSection.model_fields['group_size'].default})",
                "batch_size",
            ),
        ],
        ("orchestrator", "sampling"): [
            _config_rule(
                # double(): a `number` written as an integer (`temperature: 0`) compares as one.
                "!has(self.temperature) || double(self.temperature) > 0.0",
                "temperature must be > 0 for training: the trainer divides the logits by it to"
                " recompute the sampled tokens' log-probs (greedy decoding is for eval.sampling)",
                "temperature",
            ),
            _config_rule(
                "!has(self.top_p) || double(self.top_p) == 1.0",
                "top_p must be 1 for training: vLLM's log-probs would come from the truncated"
                " distribution and the trainer's from the full one (eval.sampling may use top_p)",
                "top_p",
            ),
        ],
    }
    """CEL rules inside `spec.config`, by path (the CRD generator places them)."""

    config: RLConfig = RLConfig()
    """The runtime config, as in `rl.toml`. The operator sets what the cluster decides:
    inference URLs, service addresses, output directory, replicas."""

    inference: InferenceSpec = InferenceSpec()
    """The inference servers."""

    orchestrator: OrchestratorSpec = OrchestratorSpec()
    """The orchestrator."""

    env_workers: EnvWorkersSpec = EnvWorkersSpec()
    """Env workers that run the rollouts beside the orchestrator; none by default."""

    tool_service: ToolServiceSpec | None = None
    """The tool service of `tool_chain` envs as the run's own Deployment (their `tool_url`);
    none by default. `kubectl scale` of its Deployment holds until `replicas` changes here."""

    teacher: TeacherSpec | None = None
    """A teacher for on-policy distillation; none by default. A suspended run may add, change or
    drop it: the teacher keeps nothing of the run."""

    judge: JudgeSpec | None = None
    """A judge for environments scored by verifiers' judges; none by default (their judges keep
    their own endpoints). A suspended run may add, change or drop it: the judge keeps nothing of
    the run."""

    pool_ref: PoolRef | None = None
    """Attach to an RLPool instead of running a trainer and inference of the run's own: the run
    creates only its orchestrator and env workers, and stays Pending (condition `Accepted`,
    naming the field and the limit) until the pool admits it. `spec.trainer` and
    `spec.inference` are then the pool's, and `spec.config.trainer.lora` is required."""

    @property
    def member(self) -> bool:
        """A pool's member (`poolRef`): orchestrator and env workers only."""
        return self.pool_ref is not None

    def served_models(self) -> dict[str, ServedModelSpec]:
        """The models the run serves beside the policy (`SERVED_MODELS` that are set), by name."""
        return {name: served for name in SERVED_MODELS if (served := getattr(self, name)) is not None}

    def _pods(self) -> int:
        if self.pool_ref is not None:
            return 1 + self.env_workers.replicas
        served = sum(s.replicas for s in self.served_models().values())
        return self.trainer.nodes + self.inference.replicas + 1 + self.env_workers.replicas + served

    @model_validator(mode="wrap")
    @classmethod
    def _config_knows_its_served_models(cls, data, handler):
        """`config.orchestrator.teacher.model` is `teacher.model.name`, and the judge's alike (and
        the operator points their `base_urls` at the servers). The runtime config refuses a
        distilling loss without a teacher, so its checks are given the model; but that is the
        operator's, not the user's: it stays out of the set fields (the spec the ConfigMap
        stores, the TOML), so a served model may still change while the run is suspended."""
        for name in SERVED_MODELS:
            if _get(_get(data, "config"), name) is not None:
                raise ValueError(_served_on_one_machine(name)[1])
        names = {name: model for name in SERVED_MODELS
                 if (model := _get(_get(_get(data, name), "model"), "name")) is not None}
        if not isinstance(data, dict) or not names:
            return handler(data)
        data, created, user_set = copy.deepcopy(data), {}, {}
        for name, model in names.items():
            given, created[name] = data, []
            for key in ("config", "orchestrator", name):
                if key not in given:
                    created[name].append(key)
                given = given.setdefault(key, {})
            if given.get("model", model) != model:
                raise ValueError(f"config.orchestrator.{name}.model ({given['model']!r}) must equal "
                                 f"{name}.model.name ({model!r}) or be left out")
            if "base_urls" in given:
                raise ValueError(f"config.orchestrator.{name}.base_urls: the operator points them at the {name}'s "
                                 f"servers; leave them out (or drop spec.{name} to use servers of your own)")
            user_set[name] = "model" in given
            given["model"] = model
        spec = handler(data)
        for name in names:
            holders = (spec, spec.config, spec.config.orchestrator)
            for holder, key in zip(holders, ("config", "orchestrator", name), strict=True):
                if key in created[name]:
                    holder.model_fields_set.discard(key)
            if not user_set[name]:
                getattr(spec.config.orchestrator, name).model_fields_set.discard("model")
        return spec

    @model_validator(mode="after")
    def _consistent(self):
        cfg = self.config.inference
        if "replicas" in cfg.model_fields_set and cfg.replicas != self.inference.replicas:
            raise ValueError(
                f"config.inference.replicas ({cfg.replicas}) must equal inference.replicas "
                f"({self.inference.replicas}) or be left out"
            )
        workers = self.config.orchestrator
        if "env_workers" in workers.model_fields_set and workers.env_workers != self.env_workers.replicas:
            raise ValueError(
                f"config.orchestrator.env_workers ({workers.env_workers}) must equal envWorkers.replicas "
                f"({self.env_workers.replicas}) or be left out"
            )
        if self.config.weights.type == "storage" and not (self.storage.pvc or self.storage.object_store) \
                and self.pool_ref is None:
            raise ValueError(
                "config.weights.type 'storage' needs storage.pvc or storage.objectStore "
                "(or use weights.type 'grpc')"
            )
        return self


class SFTRunSpec(RunSpecBase):
    """Supervised fine-tuning: the trainer alone."""

    model_config = ConfigDict(
        json_schema_extra=cel(PVC_NODES_RULE, one_pod_claim_rule(" || self.trainer.nodes <= 1"))
    )

    config: SFTConfig = SFTConfig()
    """The runtime config, as in `sft.toml`. The operator sets the output directory."""



KINDS = {"RLRun": RLRunSpec, "SFTRun": SFTRunSpec}
