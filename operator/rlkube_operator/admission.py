"""Which runs naming a pool are its members (pure): one decision, made alike by the pool's
pass (its `status.members`) and by each run's pass (its `Accepted` condition), from the same
objects.

A run fits or not by itself (its namespace admitted, its base model the pool's, its LoRA adapter
of the pool's shape: rank `maxLoraRank`, the pool's target modules and dropout, as the pool
trainer's one adapter slot has them); the runs that fit then take the pool's places in order: members already
attached first (a run admitted later never evicts one), then the oldest. A refusal names the
field and the limit.
"""

from dataclasses import dataclass

from rlkube.config.trainer import LoraConfig

from rlkube_operator.poolspec import RLPoolSpec
from rlkube_operator.progress import significant

LORA_SHAPE = ("target_modules", "dropout")
"""Besides the rank, what a member's adapter shares with the pool's slot (`alpha` may differ)."""


@dataclass(frozen=True)
class Candidate:
    """A run whose `spec.poolRef` names the pool."""

    namespace: str
    name: str
    uid: str
    created: str
    attached: bool
    """Its status says it is a member (`Accepted` true): it keeps its place."""
    model: str | None
    """`spec.config.model.name`, if the run sets it."""
    lora: dict | None
    """`spec.config.trainer.lora` as the run sets it; None without LoRA."""

    @property
    def member(self) -> str:
        return member_name(self.namespace, self.name)

    def lora_value(self, key: str):
        """The run's `lora.<key>`, or the runtime's default."""
        return self.lora.get(key, LoraConfig.model_fields[key].get_default(call_default_factory=True))


@dataclass(frozen=True)
class Decision:
    accepted: bool
    reason: str
    message: str
    share: float | None = None


def member_name(namespace: str, name: str) -> str:
    """A member's name on its pool: `<namespace>.<run>` (the adapter's model name on inference)."""
    return f"{namespace}.{name}"


def _misfit(pool_name: str, pool_namespace: str, spec: RLPoolSpec, run: Candidate,
            labels: dict[str, str] | None) -> Decision | None:
    pool = f"RLPool {pool_namespace}/{pool_name}"
    allowed = spec.allowed_runs.namespaces
    if not allowed.admits(pool_namespace, run.namespace, labels or {}):
        return Decision(False, "NamespaceNotAllowed",
                        f"spec.poolRef: namespace {run.namespace} is not admitted by {pool} (its "
                        f"spec.allowedRuns.namespaces admits {allowed.describe()})")
    if run.model is not None and run.model != spec.config.model.name:
        return Decision(False, "BaseModelMismatch",
                        f"spec.config.model.name {run.model!r} is not the base model of {pool} "
                        f"({spec.config.model.name!r}): leave it out or name that model")
    if run.lora is None:
        return Decision(False, "LoraRequired",
                        f"spec.config.trainer.lora: a member of {pool} trains a LoRA adapter of rank "
                        f"{spec.max_lora_rank} (its spec.maxLoraRank); set it")
    if (rank := run.lora_value("rank")) != spec.max_lora_rank:
        above = rank > spec.max_lora_rank
        return Decision(False, "LoraRankTooLarge" if above else "LoraRankMismatch",
                        f"spec.config.trainer.lora.rank {rank} is {'above' if above else 'below'} the spec.maxLoraRank "
                        f"{spec.max_lora_rank} of {pool}: its trainer's adapter slots are all of that rank")
    slot = spec.config.trainer.lora or LoraConfig()
    for key in LORA_SHAPE:
        if (mine := run.lora_value(key)) != (theirs := getattr(slot, key)):
            return Decision(False, "LoraShapeMismatch",
                            f"spec.config.trainer.lora.{key} {mine!r} is not that of {pool}'s adapters ({theirs!r}, its "
                            f"spec.config.trainer.lora.{key}): its trainer holds one adapter shape")
    return None


def decide(pool_name: str, pool_namespace: str, spec: RLPoolSpec, runs: list[Candidate],
           labels: dict[str, dict[str, str]]) -> dict[str, Decision]:
    """Each run's decision by uid; `labels`: each run namespace's labels."""
    out: dict[str, Decision] = {}
    members: list[Candidate] = []
    for run in sorted(runs, key=lambda r: (not r.attached, r.created, r.uid)):
        if (misfit := _misfit(pool_name, pool_namespace, spec, run, labels.get(run.namespace))) is not None:
            out[run.uid] = misfit
            continue
        pool = f"RLPool {pool_namespace}/{pool_name}"
        if len(members) >= spec.max_runs:
            out[run.uid] = Decision(False, "PoolFull", f"{pool} has spec.maxRuns {spec.max_runs} members already: "
                                    "the run attaches when one leaves")
            continue
        quota = spec.quota(run.namespace)
        taken = sum(m.namespace == run.namespace for m in members)
        if quota.max_runs is not None and taken >= quota.max_runs:
            out[run.uid] = Decision(False, "NamespaceQuotaReached",
                                    f"namespace {run.namespace} has {taken} members of {pool}, its quota's maxRuns "
                                    f"(spec.quotas[namespace={run.namespace}].maxRuns {quota.max_runs})")
            continue
        members.append(run)
    for uid, share in shares(spec, members).items():
        out[uid] = Decision(True, "Attached", "member of the pool", share)
    return out


def shares(spec: RLPoolSpec, members: list[Candidate]) -> dict[str, float]:
    """Each member's fair share of the trainer: its namespace's weight over every member
    namespace's weight, split evenly between the namespace's members."""
    per_namespace: dict[str, int] = {}
    for m in members:
        per_namespace[m.namespace] = per_namespace.get(m.namespace, 0) + 1
    total = sum(spec.quota(ns).weight for ns in per_namespace)
    return {m.uid: significant(spec.quota(m.namespace).weight / total / per_namespace[m.namespace])
            for m in members}


def candidate(run: dict) -> Candidate:
    """A stored RLRun (its raw object) as a candidate."""
    meta, spec = run["metadata"], run.get("spec") or {}
    config = spec.get("config") or {}
    lora = (config.get("trainer") or {}).get("lora")
    conditions = (run.get("status") or {}).get("conditions") or []
    attached = any(c.get("type") == "Accepted" and c.get("status") == "True" for c in conditions)
    return Candidate(meta["namespace"], meta["name"], meta["uid"], meta.get("creationTimestamp") or "", attached,
                     (config.get("model") or {}).get("name"), lora if isinstance(lora, dict) else None)
