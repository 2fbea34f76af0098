"""RLPools and their members on the cluster: who is a member (`admission`, from the pool and the
runs naming it as the API server holds them), and what a member's and a pool's pods get beyond
a run's (pure manifest functions).

A member run's pods are its orchestrator and env workers, labelled with the pool's uid
(`POOL_UID_LABEL`), with the pool's addresses (`RLKUBE_POOL_*`) and the member's credentials,
derived from the pool's token (`runtoken.member_credentials`). The pool's trainer and inference
get the pool's token (`RLKUBE_TOKEN`), from which they derive each member's credential. The
NetworkPolicies: the pool's inference admits the members' orchestrators and env workers on its
port, its trainer their orchestrators on its gRPC port (`Attach`); each member's orchestrator
admits the pool's trainer on its rollouts port (the trainer pulls the batches).
"""

import copy
from dataclasses import dataclass

from pydantic import ValidationError
from rlkube.withheld import TOKEN_ENV

from rlkube_operator.admission import Candidate, Decision, candidate, decide, member_name
from rlkube_operator.builders import POOL_TOKEN_KEY
from rlkube_operator.kube import Kube
from rlkube_operator.names import POOL_UID_LABEL, RUN_UID_LABEL, RunRef
from rlkube_operator.poolspec import PoolMember, RLPoolSpec
from rlkube_operator.spec import RLRunSpec
from rlkube_operator.wiring import POOL_PORT, pool_trainer_address

POOL_ENV = ("RLKUBE_POOL_MEMBER", "RLKUBE_POOL_TRAINER", "RLKUBE_POOL_INFERENCE")
"""What a member's pods are told of the pool (POOL_CONTRACT.md): its name, the trainer's address, inference's."""


@dataclass(frozen=True)
class Attachment:
    """A member run's place on its pool."""

    pool: RunRef
    spec: RLPoolSpec
    member: str
    share: float


def ended(status: dict) -> bool:
    """Whether a run with `status` finished (Succeeded or Failed): a member that ended holds no
    place on its pool, and is never attached again."""
    return bool(status.get("completionTime")) and status.get("phase") in ("Succeeded", "Failed")


def pool_ref(run: RunRef, spec: RLRunSpec) -> tuple[str, str]:
    """(namespace, name) of the run's pool."""
    return spec.pool_ref.namespace or run.namespace, spec.pool_ref.name


class Pools:
    """The members of pools, read from the API server."""

    def __init__(self, kube: Kube, namespaces: tuple[str, ...] | None = None):
        self.kube = kube
        self.namespaces = namespaces
        """Where runs may be (the operator's watched namespaces); None: every namespace."""

    def decisions(self, pool: dict, spec: RLPoolSpec) -> tuple[dict[str, Decision], list[Candidate]]:
        """Each run naming `pool` (a stored RLPool) and not ended, and its decision, by uid."""
        meta = pool["metadata"]
        runs = [candidate(r) for r in self.kube.list_rlkube("rlruns", self.namespaces)
                if _names(r, meta["namespace"], meta["name"]) and not ended(r.get("status") or {})]
        labels = {}
        if spec.allowed_runs.namespaces.from_ == "Selector":
            labels = {ns: self.kube.namespace_labels(ns) for ns in {r.namespace for r in runs}}
        return decide(meta["name"], meta["namespace"], spec, runs, labels), runs

    def attachment(self, run: RunRef, spec: RLRunSpec, body: dict) -> Attachment | Decision:
        """The run's place on its pool, or why it has none."""
        namespace, name = pool_ref(run, spec)
        pool = self.kube.get_rlkube("rlpools", namespace, name)
        if pool is None:
            return Decision(False, "PoolNotFound", f"spec.poolRef: there is no RLPool {namespace}/{name}")
        try:
            pool_spec = RLPoolSpec.model_validate(pool.get("spec") or {})
        except ValidationError as e:
            return Decision(False, "PoolInvalid", f"spec.poolRef: RLPool {namespace}/{name} has an invalid spec "
                            f"({e.error_count()} errors): see its status")
        decisions, runs = self.decisions(pool, pool_spec)
        if run.uid not in decisions:  # not listed yet (a list served before the run was stored)
            decisions = decide(name, namespace, pool_spec, [*runs, candidate(body)],
                               {run.namespace: self.kube.namespace_labels(run.namespace)})
        decision = decisions[run.uid]
        if not decision.accepted:
            return decision
        pool_run = RunRef("RLPool", name, namespace, pool["metadata"]["uid"])
        return Attachment(pool_run, pool_spec, member_name(run.namespace, run.name), decision.share)

    def status(self, pool: dict, spec: RLPoolSpec) -> dict:
        """The pool's `members`, `memberCount` and `waiting` (`ready` is its pass's)."""
        decisions, runs = self.decisions(pool, spec)
        members = [PoolMember(member=r.member, namespace=r.namespace, name=r.name, share=decisions[r.uid].share)
                   for r in sorted(runs, key=lambda r: (r.created, r.uid)) if decisions[r.uid].accepted]
        return {"members": [m.model_dump(by_alias=True) for m in members], "memberCount": len(members),
                "waiting": len(runs) - len(members)}


def _names(run: dict, namespace: str, name: str) -> bool:
    ref = (run.get("spec") or {}).get("poolRef") or {}
    return ref.get("name") == name and (ref.get("namespace") or run["metadata"]["namespace"]) == namespace


# --- manifests ---------------------------------------------------------------------------
def _with(manifest: dict, env: list[dict], labels: dict[str, str]) -> dict:
    """`manifest` (a workload) with `env` first in each container of its pods and `labels` on them."""
    out = copy.deepcopy(manifest)
    template = out["spec"]["template"]
    template["metadata"]["labels"] |= labels
    for c in template["spec"]["containers"]:
        c["env"] = [*env, *c.get("env", [])]
    return out


def as_member(manifest: dict, attachment: Attachment) -> dict:
    """A member's orchestrator or env-worker workload: the pool's uid on its pods, and its env."""
    pool, spec = attachment.pool, attachment.spec
    values = (attachment.member, pool_trainer_address(pool), _inference_base(pool, spec))
    env = [{"name": name, "value": value} for name, value in zip(POOL_ENV, values, strict=True)]
    return _with(manifest, env, {POOL_UID_LABEL: pool.uid})


def _inference_base(pool: RunRef, spec: RLPoolSpec) -> str:
    """The pool inference Service's base URL (headless: it resolves to every replica)."""
    return f"http://{pool.service_host('inference')}:{spec.config.inference.port}"


def with_pool_token(manifest: dict, pool: RunRef) -> dict:
    """A pool's trainer or inference workload, its pods given the pool's token (`RLKUBE_TOKEN`)."""
    ref = {"name": pool.child("token"), "key": POOL_TOKEN_KEY}
    return _with(manifest, [{"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": ref}}], {})


def _peer(labels: dict[str, str], components: list[str], namespace: str | None = None) -> dict:
    selector = {"matchLabels": labels,
                "matchExpressions": [{"key": "app.kubernetes.io/component", "operator": "In", "values": components}]}
    namespaces = {"matchLabels": {"kubernetes.io/metadata.name": namespace}} if namespace else {}
    return {"namespaceSelector": namespaces, "podSelector": selector}


def pool_admitted(pool: RunRef, spec: RLPoolSpec) -> dict[str, list[dict]]:
    """The pool's NetworkPolicies' rules for its members' pods, in any namespace (the pools'
    servers check each member's credential: the policy only narrows who may dial). The trainer's
    Attach port (`POOL_PORT`) takes only a member's own rollouts credential."""
    members = {POOL_UID_LABEL: pool.uid}
    return {
        "network-policy": [{"from": [_peer(members, ["orchestrator", "env-worker"])],
                            "ports": [{"protocol": "TCP", "port": spec.config.inference.port}]}],
        "trainer-network-policy": [{"from": [_peer(members, ["orchestrator"])],
                                    "ports": [{"protocol": "TCP", "port": POOL_PORT}]}],
    }


def pool_egress(pool: RunRef) -> list[dict]:
    """Where a pool's pods connect beyond their own (egress on): its trainer to the members'
    orchestrators, in any namespace (each on its own rollouts port)."""
    return [{"to": [_peer({POOL_UID_LABEL: pool.uid}, ["orchestrator"])]}]


def member_egress(attachment: Attachment) -> list[dict]:
    """Where a member's pods connect beyond their own (egress on): the pool's inference, and its
    trainer's Attach service."""
    pool, spec = attachment.pool, attachment.spec
    return [{"to": [_peer({RUN_UID_LABEL: pool.uid}, ["inference"], pool.namespace)],
             "ports": [{"protocol": "TCP", "port": spec.config.inference.port}]},
            {"to": [_peer({RUN_UID_LABEL: pool.uid}, ["trainer"], pool.namespace)],
             "ports": [{"protocol": "TCP", "port": POOL_PORT}]}]


def member_admitted(run_spec: RLRunSpec, attachment: Attachment) -> dict[str, list[dict]]:
    """A member's NetworkPolicy's rule for its pool's trainer (it pulls the batches)."""
    pool = attachment.pool
    return {"network-policy": [{"from": [_peer({RUN_UID_LABEL: pool.uid}, ["trainer"], pool.namespace)],
                                "ports": [{"protocol": "TCP", "port": run_spec.config.rollouts.port}]}]}
