"""The RLPool spec and status: one trainer and one inference fleet on which many RLRuns (its
members, `spec.poolRef`) each train their own LoRA adapter of one frozen base model.

Who may attach is said as Gateway API's `allowedRoutes` says which routes may attach to a
listener (`from: Same | All | Selector`, plus names); how many runs, and each namespace's share
of the trainer, in the spirit of Kueue's fair sharing (`quotas`: runs and weight per namespace).
The pool's trainer and inference are the same components as an RLRun's (`components`), so
they are sized, scheduled and fenced the same way.
"""

from typing import Literal

from pydantic import Field, model_validator
from rlkube.config import RLConfig

from rlkube_operator.components import InferenceSpec
from rlkube_operator.schema import K8sModel
from rlkube_operator.spec import RunSpecBase
from rlkube_operator.status import RunStatus

MEMBER_CONFIG_SECTIONS = ("orchestrator",)
"""Sections of an RLConfig that belong to each member, never to the pool."""


class LabelSelectorRequirement(K8sModel):
    """One requirement of a label selector (metav1.LabelSelectorRequirement)."""

    key: str = Field(min_length=1, max_length=317)
    """The label's key."""

    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    """How the key's value relates to `values`."""

    values: list[str] = Field(default_factory=list, max_length=64)
    """For In and NotIn; empty for Exists and DoesNotExist."""


class LabelSelector(K8sModel):
    """A label selector (metav1.LabelSelector): every term must hold."""

    match_labels: dict[str, str] = Field(default_factory=dict, max_length=64)
    """Labels the namespace must carry, with these values."""

    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list, max_length=64)
    """Requirements on the namespace's labels."""

    def matches(self, labels: dict[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        for term in self.match_expressions:
            present = term.key in labels
            ok = {"In": present and labels.get(term.key) in term.values,
                  "NotIn": not present or labels.get(term.key) not in term.values,
                  "Exists": present, "DoesNotExist": not present}[term.operator]
            if not ok:
                return False
        return True


class RunNamespaces(K8sModel):
    """The namespaces whose RLRuns may attach (Gateway API's `allowedRoutes.namespaces`)."""

    from_: Literal["Same", "All", "Selector"] = Field(default="Same", alias="from")
    """`Same`: the pool's namespace only; `All`: every namespace; `Selector`: the namespaces
    `selector` matches (and the pool's own). `names` are admitted besides, whatever this says."""

    selector: LabelSelector | None = None
    """With `from: Selector`: the namespaces' labels (a cluster admin labels a team's namespace
    to admit it, and the runs waiting there attach)."""

    names: list[str] = Field(default_factory=list, max_length=256)
    """Namespaces admitted by name, besides `from`."""

    @model_validator(mode="after")
    def _selector_with_selector(self):
        if (self.from_ == "Selector") != (self.selector is not None):
            raise ValueError("allowedRuns.namespaces.selector is set exactly when allowedRuns.namespaces.from is "
                             f"'Selector' (from is {self.from_!r})")
        return self

    def admits(self, pool_namespace: str, namespace: str, labels: dict[str, str]) -> bool:
        if namespace == pool_namespace or namespace in self.names or self.from_ == "All":
            return True
        return self.from_ == "Selector" and self.selector.matches(labels)

    def describe(self) -> str:
        said = {"Same": "the pool's own namespace", "All": "every namespace",
                "Selector": f"namespaces labelled {self.selector.model_dump(by_alias=True, exclude_defaults=True)}"
                if self.selector else ""}[self.from_]
        return said + (f" and {', '.join(self.names)}" if self.names else "")


class AllowedRuns(K8sModel):
    """Which RLRuns may attach (their `spec.poolRef` names this pool)."""

    namespaces: RunNamespaces = RunNamespaces()
    """Their namespaces."""


class NamespaceQuota(K8sModel):
    """One namespace's part of the pool (Kueue's fair sharing: a weight, and a cap)."""

    namespace: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """The namespace."""

    max_runs: int | None = Field(default=None, ge=0, le=64)
    """At most this many of its runs are members at once; unset: up to the pool's `maxRuns`."""

    weight: float = Field(default=1.0, gt=0, le=1000)
    """Its share of the trainer's tokens against the other namespaces' weights (a namespace
    not listed weighs 1), split evenly between its members."""


class RLPoolSpec(RunSpecBase):
    """A pool: one trainer (`rlkube pool-trainer`) holding a frozen base model and one LoRA
    adapter per member run, and one inference fleet serving every member's adapter by name."""

    config: RLConfig = RLConfig()
    """The pool's runtime config, as in `rl.toml`: the base model (`config.model`), the trainer's
    settings (`device`, `parallel`, the adapters' `lora` shape, of rank `maxLoraRank`) and
    inference's. Each member's orchestrator, sampling, optimizer and loss are its own."""

    inference: InferenceSpec = InferenceSpec()
    """The inference servers every member generates on (vLLM with LoRA, `maxRuns` adapters
    loaded at once)."""

    max_runs: int = Field(default=4, ge=1, le=64)
    """Members at once: the trainer's adapter slots and inference's loaded adapters."""

    max_lora_rank: int = Field(default=16, ge=1, le=512)
    """The LoRA rank of the pool's adapters: inference serves adapters up to it, and the pool
    trainer's slots have this rank, so a member's `config.trainer.lora.rank` must equal it."""

    allowed_runs: AllowedRuns = AllowedRuns()
    """Which namespaces' runs may attach. Applies live: a namespace admitted later lets its
    waiting runs attach, with no restart of the pool's pods."""

    quotas: list[NamespaceQuota] = Field(default_factory=list, max_length=256)
    """Per-namespace caps and weights. Applies live."""

    @model_validator(mode="after")
    def _pool_shape(self):
        for section in MEMBER_CONFIG_SECTIONS:
            if section in self.config.model_fields_set:
                raise ValueError(f"config.{section} belongs to each member: set it in the RLRun's spec.config")
        lora = self.config.trainer.lora
        if lora is not None and "rank" in lora.model_fields_set and lora.rank != self.max_lora_rank:
            raise ValueError(f"config.trainer.lora.rank ({lora.rank}) must equal maxLoraRank ({self.max_lora_rank}) "
                             "or be left out: the pool trainer's adapter slots are of that rank")
        namespaces = [q.namespace for q in self.quotas]
        if len(set(namespaces)) != len(namespaces):
            raise ValueError("quotas: each namespace at most once")
        return self

    def quota(self, namespace: str) -> NamespaceQuota:
        return next((q for q in self.quotas if q.namespace == namespace), NamespaceQuota(namespace=namespace))

    def served_models(self) -> dict:
        """A pool serves no teacher nor judge: a member's would be its own."""
        return {}

    def _pods(self) -> int:
        return self.trainer.nodes + self.inference.replicas


class PoolMember(K8sModel):
    """One member run, as the pool sees it."""

    member: str
    """The member's name on the pool: `<namespace>.<run>`, its adapter's model name on inference."""

    namespace: str
    """The run's namespace."""

    name: str
    """The run's name."""

    share: float
    """Its fair share of the trainer's tokens (its namespace's weight split between its members,
    over every member namespace's weight), to 4 significant digits."""


class PoolStatus(RunStatus):
    """The pool's status: the components' as a run's, and its members."""

    ready: bool = False
    """Whether the trainer and inference are ready (condition `Ready`; printer column `Ready`)."""

    members: list[PoolMember] = Field(default_factory=list)
    """The member runs attached, oldest first."""

    member_count: int = 0
    """How many (printer column `Members`)."""

    waiting: int = 0
    """Runs naming the pool that are not members (refused: their `Accepted` condition says why)."""
