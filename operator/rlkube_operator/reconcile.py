"""One level-triggered reconcile of an RLRun or SFTRun.

fetch the spec → decide what is applied (refusing changes that cannot apply live) → read the
actual children → decide the trainer's fate (keep, gang-restart, resume, give up) → create or
correct children (or tear them down when done) → observe pods and progress → status.

Nothing is remembered between calls: the trainer Job carries its attempt and restart count in
annotations, the ConfigMap carries the applied spec. A stale or lost status therefore cannot
make the operator restart twice or resume from the wrong place. (The status says only whether
the run has been Running: a run that degrades afterwards stays Running, with `Degraded`.)

Children count only when the run's uid controls them, pods only when they carry its uid: a
child under the run's name that is someone else's stops the pass (`ForeignChild`) with a
condition saying whose it is. A pass that fails any other way writes its error to the status.
"""

import hmac
import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from kubernetes.client.exceptions import ApiException
from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_snake
from rlkube.config.cli import format_validation_error

from rlkube_operator import (
    builders,
    export,
    lifetime,
    namedobjects,
    observe,
    podread,
    pools,
    progress,
    queueing,
)
from rlkube_operator.conditions import Conditions, get_condition
from rlkube_operator.egress import Egress, build_egress_policy
from rlkube_operator.guardrails import Guardrails, refusals
from rlkube_operator.kube import ForeignChild, Kube
from rlkube_operator.names import SFT_STATUS_PORT, RunRef
from rlkube_operator.poolspec import RLPoolSpec
from rlkube_operator.runtoken import KEY_SETTING
from rlkube_operator.spec import SERVED_MODELS, RLRunSpec, RunSpecBase, SFTRunSpec
from rlkube_operator.wiring import (
    POOL_FILE,
    POOL_PORT,
    member_files,
    pool_files,
    rl_files,
    sft_tomls,
    trainer_metrics_port,
)

log = logging.getLogger(__name__)

# Applied to a running run; anything else is refused.
LIVE_FIELDS = ("suspend", "restartPolicy", "ttlSecondsAfterFinished")
POOL_LIVE_FIELDS = ("allowedRuns", "quotas")
"""An RLPool's, applied live too: which runs are members is decided on every pass (`admission`)."""
# Applied to a suspended run as well, when it resumes: every pod is then new, and these size
# components that keep no state of their own (inference and the env workers are stateless, the
# orchestrator restarts from the trainer's checkpoint). The trainer's world size (nodes, GPUs,
# processes per node) stays: its checkpoints' shards and data position were written for it.
# The CRD's transition rules (crd.py) enforce the same at admission.
SUSPENDED_FIELDS = {
    "trainer": ("resources",),
    "inference": ("replicas", "gpusPerReplica", "resources"),
    "orchestrator": ("resources",),
    "envWorkers": ("replicas", "resources"),
    "toolService": ("replicas", "resources"),
}
ELASTIC_FIELDS = {"inference": ("replicas",), "toolService": ("replicas",)}
"""Applied to a running run too (`kubectl scale rlrun`, or an apply): inference replicas keep
no state, and the orchestrator brings a new one to the current policy before it routes a request
to it (`client.base_urls_file`); the tool service keeps nothing (a call that reached a pod that
went away is retried on another). Not over NCCL (the trainer's broadcast group is sized at its
start) nor in a Kueue queue (its Workload's pod counts were admitted): there a change waits
for a suspension (`SUSPENDED_FIELDS`)."""
SUSPENDED_BLOCKS = SERVED_MODELS
"""Whole sections a suspended run may add, change or drop, applied when it resumes: the teacher
and the judge serve a fixed model and keep nothing of the run."""


@dataclass(frozen=True)
class Workload:
    """What differs between RLRun and SFTRun."""

    spec_model: type[RunSpecBase]
    components: tuple[str, ...]
    module: str
    config_file: str
    tomls: Callable[[RunRef, RunSpecBase], dict[str, str]]
    trainer_status_port: int | None = None
    """Where pod 0 of the trainer serves `GET /status`; None: progress is the orchestrator's."""
    reads_progress: bool = True
    """Whether the run's progress is read (a pool has none of its own: its members do)."""
    attach_port: int | None = None
    """Where the trainer's rank 0 serves a pool's Attach (`wiring.POOL_PORT`); None: not a pool."""


WORKLOADS = {
    "RLRun": Workload(
        RLRunSpec, ("inference", "orchestrator", "trainer"), "rlkube.entrypoints.trainer", "trainer.toml", rl_files
    ),
    "SFTRun": Workload(
        SFTRunSpec, ("trainer",), "rlkube.entrypoints.sft", "sft.toml", sft_tomls, trainer_status_port=SFT_STATUS_PORT
    ),
    "RLPool": Workload(
        RLPoolSpec, ("inference", "trainer"), "rlkube.entrypoints.pool_trainer", POOL_FILE, pool_files,
        reads_progress=False, attach_port=POOL_PORT,
    ),
}
MEMBER = Workload(RLRunSpec, ("orchestrator",), "", "", rl_files)
"""An RLRun with `spec.poolRef`: its orchestrator and env workers; the pool has the rest."""


OPERATOR_POD_LABELS = {"app.kubernetes.io/name": "rlkube-operator"}
"""The labels of the chart's operator pods (`rlkube.selectorLabels`)."""
DEFAULT_OPERATOR_NAMESPACE = "rlkube"
"""Where the docs install the chart (`helm install rlkube helm/rlkube -n rlkube`)."""


def operator_peer(namespace: str) -> dict:
    """The NetworkPolicyPeer of the operator's pods: those labels, in the operator's namespace
    only. The labels alone would admit any tenant's pod that carries them, from any namespace."""
    return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)}}


@dataclass
class Settings:
    status_url_template: str = progress.DEFAULT_URL_TEMPLATE
    """Where a run's progress is read; see `progress.py` for why the Service, not the proxy."""

    network_policy_peer: dict | None = field(default_factory=lambda: operator_peer(DEFAULT_OPERATOR_NAMESPACE))
    """A NetworkPolicyPeer matching the operator's pods: each run gets a NetworkPolicy that admits
    only its own pods, and this peer on its status port. None: no NetworkPolicies (a cluster
    that fences runs some other way)."""

    metrics_scraper_peer: dict | None = None
    """The NetworkPolicyPeer admitted to the ports that serve `/metrics`: a namespace (the
    monitoring one), never pod labels alone, which any tenant can set (`scraper_peer`). None: no
    scraper."""

    guardrails: Guardrails = field(default_factory=Guardrails)
    """What runs may ask of their pods (`guardrails.py`): a spec that breaks it is invalid."""

    egress: Egress | None = None
    """Where the runs' pods may connect (`egress.py`): each run gets an egress NetworkPolicy.
    None: no egress policy, the pods may dial anything (the chart turns it on by default)."""

    namespaces: tuple[str, ...] | None = None
    """The namespaces the operator watches, where a pool's members may be; None: all of them."""

    token_key: bytes | None = None
    """The key each run's token is derived from (`runtoken`), read from `--token-key-file`;
    needed to create a run's children."""

    previous_token_key: bytes | None = None
    """The key before a rotation (`--previous-token-key-file`): an applied spec it signed is
    trusted as this operator's own, and the next pass signs it with `token_key`, so a rotation
    stops no started run. None: only `token_key`'s signatures are."""

    def key(self) -> bytes:
        if self.token_key is None:
            raise ValueError(f"the operator has no token key ({KEY_SETTING}): it cannot create a run's token")
        return self.token_key


class UntrustedSpec(Exception):
    """The run's stored applied spec is neither signed by this operator nor within the guardrails."""


@dataclass
class Result:
    """The status to write and the events to post."""

    status: dict
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    error: str | None = None
    """Why the pass failed (also in the status); None when it did its work."""


def _dump(spec: BaseModel) -> dict:
    """What the user set (the spec as given, no defaults): what the ConfigMap stores as the
    applied spec, so a default the operator changes later is no change to a started run."""
    return spec.model_dump(mode="json", by_alias=True, exclude_unset=True)


def _values(spec: BaseModel) -> dict:
    """Every field, defaults too: the values a change is measured on."""
    return spec.model_dump(mode="json", by_alias=True)


def _with_defaults(workload: Workload, applied: dict) -> dict:
    """A stored spec's values, with today's defaults filled in; as stored if it no longer validates."""
    try:
        return _values(workload.spec_model.model_validate(applied))
    except ValidationError:
        return applied


def elastic(spec: dict) -> bool:
    """Whether `ELASTIC_FIELDS` apply to a running run of this (user-set) spec."""
    weights = ((spec.get("config") or {}).get("weights") or {}).get("type")
    return weights != "nccl" and not spec.get("queue")


def _frozen(spec: dict, suspended: bool, live_components: bool = False) -> dict:
    """The fields a started run keeps: all but the live ones (with `live_components`, the
    `ELASTIC_FIELDS` too), and while it is suspended, all but the resumable ones
    (`SUSPENDED_FIELDS`, `SUSPENDED_BLOCKS`) too."""
    out = {k: v for k, v in spec.items()
           if k not in LIVE_FIELDS + POOL_LIVE_FIELDS and not (suspended and k in SUSPENDED_BLOCKS)}
    if suspended:
        out = _without(out, SUSPENDED_FIELDS)
    if live_components:
        out = _without(out, ELASTIC_FIELDS)
    return out


def _without(spec: dict, fields: dict[str, tuple[str, ...]]) -> dict:
    """`spec` less the `fields` of its components (component -> field names); the given
    dicts are left as they are."""
    out = dict(spec)
    for component, names in fields.items():
        if isinstance(out.get(component), dict):
            out[component] = {k: v for k, v in out[component].items() if k not in names}
    return out


def _live(live_components: bool, kind: str) -> list[str]:
    elastic_fields = [f"{c}.{f}" for c, fields in ELASTIC_FIELDS.items() for f in fields] if live_components else []
    return list(LIVE_FIELDS) + list(POOL_LIVE_FIELDS if kind == "RLPool" else ()) + elastic_fields


def _resumable() -> str:
    fields = [f"{component}.{name}" for component, names in SUSPENDED_FIELDS.items() for name in names]
    return ", ".join(fields + list(SUSPENDED_BLOCKS))


def _changed_fields(old: dict, new: dict, old_values: dict, new_values: dict, prefix: str = "spec") -> list[str]:
    """The fields that `old` or `new` set (user-set dumps) whose values (`*_values`, with
    defaults) differ. A field neither sets is no change whatever its default; a spec stored by
    an older operator (every field, with that operator's defaults) is compared on all of its
    fields, and not on the fields added since."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) or isinstance(b, dict):
            out += _changed_fields(a if isinstance(a, dict) else {}, b if isinstance(b, dict) else {},
                                   old_values.get(key) or {}, new_values.get(key) or {}, f"{prefix}.{key}")
        elif old_values.get(key) != new_values.get(key):
            out.append(f"{prefix}.{key}")
    return out


class Reconciler:
    def __init__(self, kube: Kube, settings: Settings | None = None):
        self.kube = kube
        self.settings = settings or Settings()
        self.custom = queueing.CustomObjects(kube)
        self.kueue = queueing.Kueue(self.custom)
        self.pools = pools.Pools(kube, self.settings.namespaces)
        self._refused: dict[str, dict[tuple, list[str]]] = {}
        """Per run uid: the last two specs checked against the guardrails (the request, and a
        stored copy the operator did not sign), and what they refused (cel-python takes ~0.25 s
        a spec, so a spec is checked once)."""
        self._token_made: dict[str, tuple[int, bool]] = {}
        """Per run uid: the (attempt, paused) for which this operator last created the run's token
        Secret. Created again when those change (new pods are about to start: a Secret lost meanwhile
        is made again, with the same token), not on every pass: a steady run costs no write."""

    # --- spec ---------------------------------------------------------------------
    def applied_spec(
        self, run: RunRef, workload: Workload, desired: RunSpecBase | None
    ) -> tuple[RunSpecBase | None, str | None]:
        """The spec to realize, and why the requested one was refused (None if accepted).
        A started run (its ConfigMap holds the applied spec) keeps that spec, with the live
        fields taken from the request; `desired` is None when the request is invalid."""
        cm = self.kube.get("ConfigMap", run.namespace, run.child("config"))
        if cm is not None and not run.owns(cm):
            raise ForeignChild({"kind": "ConfigMap"} | cm)
        if cm is None or builders.APPLIED_SPEC_KEY not in cm.get("data", {}):
            return desired, None
        old = json.loads(self._trusted_copy(run, workload, cm))
        if desired is None:
            return workload.spec_model.model_validate(old), None
        new, suspended = _dump(desired), bool(old.get("suspend"))
        live_components = "inference" in workload.components and elastic(old)
        changed = _changed_fields(_frozen(old, suspended, live_components), _frozen(new, suspended, live_components),
                                  _with_defaults(workload, old), _values(desired))
        if not changed:
            return desired, None
        live = {k: v for k, v in new.items() if k in LIVE_FIELDS + POOL_LIVE_FIELDS}
        applied = workload.spec_model.model_validate(_frozen(old, False) | live)
        if live_components:  # the elastic fields apply all the same
            for component, names in ELASTIC_FIELDS.items():
                field = to_snake(component)
                wanted, section = getattr(desired, field), getattr(applied, field)
                if wanted is None or section is None:  # an optional component (toolService) absent
                    continue
                requested = {to_snake(name): getattr(wanted, to_snake(name)) for name in names}
                applied = applied.model_copy(update={field: section.model_copy(update=requested)})
        shown = ", ".join(changed[:5]) + (" …" if len(changed) > 5 else "")
        return applied, (
            f"changes to {shown} cannot apply to a started run; only {', '.join(_live(live_components, run.kind))} do, and "
            f"while it is suspended {_resumable()}. Delete and recreate the run to change the others "
            "(a PVC claimName keeps checkpoints)."
        )

    def _trusted_copy(self, run: RunRef, workload: Workload, cm: dict) -> str:
        """The applied spec in the run's ConfigMap, if this operator signed it (with its key, or
        the one before a rotation: `previous_token_key`; `apply` signs it again with the key) or it
        passes the guardrails (a copy written by an operator before signatures, or changed by
        whoever may patch ConfigMaps): the spec that runs is a spec that was checked.
        UntrustedSpec if not."""
        data = cm["data"]
        text = data[builders.APPLIED_SPEC_KEY]
        signature = data.get(builders.APPLIED_SPEC_SIGNATURE_KEY, "")
        keys = [k for k in (self.settings.token_key, self.settings.previous_token_key) if k is not None]
        if any(hmac.compare_digest(signature, builders.applied_spec_signature(k, run, text)) for k in keys):
            return text
        try:
            refused, _ = self.guardrail_refusals(run, workload.spec_model.model_validate(json.loads(text)))
        except (ValueError, ValidationError) as e:
            refused = [f"invalid: {e}"]
        if refused:
            raise UntrustedSpec(
                f"the applied spec in ConfigMap {run.child('config')} is not one this operator signed, and it breaks "
                f"the guardrails: {'; '.join(refused)}")
        return text

    def guardrail_refusals(self, run: RunRef, spec: RunSpecBase) -> tuple[list[str], bool]:
        """What the guardrails refuse of `spec`, as the admission policy would of the run, then what
        only the operator sees (`namedobjects`: labels, a Secret's type), and whether it was checked
        now rather than remembered: a spec is checked once, as it changes (a generation). A spec
        over `maxSpecBytes` is refused by its size alone, before the CEL, whose cost grows with it."""
        seen = spec.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"config"})
        key = (run.kind, run.name, json.dumps(seen, sort_keys=True))
        checked = self._refused.setdefault(run.uid, {})
        if key in checked:
            return checked[key], False
        limit = self.settings.guardrails.max_spec_bytes
        if (size := len(json.dumps(spec.model_dump(mode="json", by_alias=True, exclude_unset=True),
                                   separators=(",", ":")))) > limit:
            refused = [(f"spec is {size} bytes (as JSON), more than the {limit} the cluster admin allows "
                        "(guardrails.maxSpecBytes)")]
        else:
            obj = {"kind": run.kind, "metadata": {"name": run.name, "namespace": run.namespace}, "spec": seen}
            refused = refusals(obj, self.settings.guardrails)
            refused += namedobjects.refusals(self.kube, run, seen, self.settings.guardrails)
        checked[key] = refused
        for stale in list(checked)[:-2]:
            del checked[stale]
        return refused, True

    # --- children ---------------------------------------------------------------------
    def trainer_jobs(self, run: RunRef) -> tuple[dict | None, list[dict]]:
        jobs = [j for j in self.kube.list("Job", run.namespace, run.selector("trainer")) if run.owns(j)]
        jobs.sort(key=observe.job_attempt)
        return (jobs[-1] if jobs else None), jobs[:-1]

    def apply(self, run: RunRef, workload: Workload, spec: RunSpecBase, attempt: int, restarts: int,
              seconds_left: float | None, held: bool = False, queued: queueing.Admission | None = None,
              attachment: pools.Attachment | None = None) -> None:
        """Create or correct every child for `attempt` (idempotent). A new trainer Job gets the
        run's time left as its own deadline. `held`: its trainer Job is suspended from outside,
        so the other components wait at zero too (the Job itself is left as it is). `queued`:
        the run's Kueue admission, whose flavours place the pods (`queueing.place`).
        `attachment`: a pool member's place on its pool (`pools`)."""
        k = self.kube
        pool = run if run.kind == "RLPool" else None
        if self.settings.network_policy_peer is not None:  # before any pod that listens
            admitted = (pools.pool_admitted(run, spec) if pool else
                        pools.member_admitted(spec, attachment) if attachment else None)
            for policy in builders.build_network_policies(
                    run, self.settings.network_policy_peer, _status_port(workload, spec),
                    self.settings.metrics_scraper_peer, _metrics_ports(workload, spec), _serving_ports(workload, spec),
                    admitted, tool_port=tools.port if (tools := getattr(spec, "tool_service", None)) else None):
                k.ensure(policy)
        if self.settings.egress is not None:
            peers = pools.pool_egress(run) if pool else pools.member_egress(attachment) if attachment else []
            k.ensure(build_egress_policy(run, self.settings.egress, spec.network.egress, peers))
        if (pvc := builders.build_pvc(run, spec)) is not None:
            k.ensure(pvc)
        # The token Secret before any pod: they read it at start.
        if self._token_made.get(run.uid) != (made := (attempt, spec.suspend or held)):
            self._make_token_secret(run, attachment)
            self._token_made[run.uid] = made
        tomls = (member_files(run, spec, attachment.pool, attachment.spec, attachment.member) if attachment
                 else workload.tomls(run, spec))
        config = k.ensure(builders.build_configmap(run, tomls, _dump(spec), self.settings.key()))
        if (group := queueing.build_pod_group(run, spec)) is not None:  # before its pods
            queueing.ensure_pod_group(self.custom, run, group)
        replicas = 0 if spec.suspend or held else 1
        member = (lambda m: pools.as_member(m, attachment)) if attachment else (lambda m: m)
        pooled = (lambda m: pools.with_pool_token(m, pool)) if pool else (lambda m: m)
        if "inference" in workload.components:
            k.ensure(builders.build_inference_service(run, spec))
            k.ensure(queueing.place(pooled(builders.build_inference_statefulset(
                run, spec, replicas * spec.inference.replicas)), queued))
            k.ensure(builders.build_servers_pdb(run, "inference"))
            for name in SERVED_MODELS:
                if (served := spec.served_models().get(name)) is not None:
                    k.ensure(builders.build_served_service(run, spec, name))
                    k.ensure(queueing.place(
                        builders.build_served_statefulset(run, spec, name, replicas * served.replicas), queued))
                    k.ensure(builders.build_servers_pdb(run, name))
                elif builders.served_toml(name) in config.get("data", {}):
                    self.drop_served(run, name)
        if "orchestrator" in workload.components:
            k.ensure(builders.build_orchestrator_service(run, spec))
            k.ensure(queueing.place(member(builders.build_orchestrator_deployment(run, spec, replicas, attempt)),
                                    queued))
            if spec.env_workers.replicas:
                k.ensure(queueing.place(member(builders.build_env_worker_deployment(
                    run, spec, replicas * spec.env_workers.replicas)), queued))
            if getattr(spec, "tool_service", None) is not None and replicas:
                self.apply_tool_service(run, spec)
        if "trainer" not in workload.components:
            return
        k.ensure(builders.build_trainer_master_service(run, spec, workload.trainer_status_port, attempt=attempt,
                                                       attach_port=workload.attach_port))
        job = builders.build_trainer_job(
            run, spec, module=workload.module, config_file=workload.config_file,
            attempt=attempt, restarts=restarts, suspend=spec.suspend, status_port=workload.trainer_status_port,
            active_deadline_seconds=None if seconds_left is None else max(1, math.ceil(seconds_left)),
            attach_port=workload.attach_port,
        )
        existing = k.ensure(queueing.place(pooled(job), queued))  # a suspended Job's template takes it
        if (patch := queueing.suspend_patch(existing, spec.suspend)) is not None:
            k.patch("Job", run.namespace, job["metadata"]["name"], patch)

    def _make_token_secret(self, run: RunRef, attachment: pools.Attachment | None) -> None:
        """Create the run's token Secret. One already there (AlreadyExists) is read once for its
        keys: made by an older operator without some this one's pods read (the single `token`
        before scopes, a scope added since), it is replaced, immutable as it is, by one with its
        own values kept and the missing ones added (`builders.upgraded_token_secret`), so the
        pods this operator starts find every key they name."""
        secret = self._token_secret(run, attachment)
        if self.kube.create(secret):
            return
        existing = self.kube.get("Secret", run.namespace, run.child("token"))
        if existing is None or not run.owns(existing):
            return
        if (upgraded := builders.upgraded_token_secret(existing, secret)) is None:
            return
        log.info("%s %s/%s: its token Secret lacks %s (made by an older operator): replaced", run.kind, run.namespace,
                 run.name, ", ".join(sorted(set(upgraded["data"]) - set(existing.get("data") or {}))))
        self.kube.delete("Secret", run.namespace, run.child("token"), uid=existing["metadata"]["uid"])
        self.kube.create(upgraded)

    def _token_secret(self, run: RunRef, attachment: pools.Attachment | None) -> dict:
        """The run's token Secret: a pool's holds its token too, a member's only its own credentials."""
        if attachment is not None:
            return builders.build_member_token_secret(run, self.settings.key(), attachment.pool.uid, attachment.member)
        if run.kind == "RLPool":
            return builders.build_pool_token_secret(run, self.settings.key())
        return builders.build_token_secret(run, self.settings.key())

    def apply_tool_service(self, run: RunRef, spec: RLRunSpec) -> None:
        """The tool service's Service and Deployment; the Deployment's replicas are the spec's
        only when they changed there (`builders.build_tool_service_deployment`), and the
        annotation that marks them applied is patched after."""
        k, name = self.kube, run.child("tool-service")
        k.ensure(builders.build_tool_service_service(run, spec))
        deployment = builders.build_tool_service_deployment(run, spec, k.get("Deployment", run.namespace, name))
        applied = k.ensure(deployment)
        marks = deployment["metadata"]["annotations"]
        if (applied["metadata"].get("annotations") or {}).get(builders.TOOL_REPLICAS_ANNOTATION) != marks[builders.TOOL_REPLICAS_ANNOTATION]:
            k.patch("Deployment", run.namespace, name, {"metadata": {"annotations": marks}})

    def drop_served(self, run: RunRef, name: str) -> None:
        """The run's teacher or judge was removed (while it was suspended): its servers, Service
        and disruption budget go, then `<name>.toml`, which marks a run that has them (so a run
        that never had one costs no requests for this)."""
        for kind in ("StatefulSet", "PodDisruptionBudget", "Service"):
            self.kube.delete_owned(kind, run.namespace, run.child(name), run.uid)
        self.kube.patch("ConfigMap", run.namespace, run.child("config"), {"data": {builders.served_toml(name): None}})

    def teardown(self, run: RunRef, workload: Workload, spec: RunSpecBase) -> None:
        """Free the GPUs: inference, the teacher and the judge (and their disruption budgets), the
        orchestrator and the env workers go; ConfigMap, PVC and the Job stay."""
        if "inference" in workload.components:
            for component in ("inference", *spec.served_models()):
                self.kube.delete_owned("StatefulSet", run.namespace, run.child(component), run.uid)
                self.kube.delete_owned("PodDisruptionBudget", run.namespace, run.child(component), run.uid)
        if "orchestrator" in workload.components:
            self.kube.delete_owned("Deployment", run.namespace, run.child("orchestrator"), run.uid)
            self.kube.delete_owned("Deployment", run.namespace, run.child("env-worker"), run.uid)
            self.kube.delete_owned("Deployment", run.namespace, run.child("tool-service"), run.uid)

    # --- the loop ---------------------------------------------------------------------
    def reconcile(self, kind: str, body: dict, now: str) -> Result:
        """One pass; what stops it (a foreign child, an API error) is written to the status."""
        meta, status = body["metadata"], dict(body.get("status") or {})
        conditions = Conditions(status.get("conditions") or [], meta.get("generation"), now)
        try:
            result = self._reconcile(kind, body, now)
            if kind == "RLPool" and (spec := _valid(RLPoolSpec, body)) is not None:
                result.status |= self.pools.status(body, spec)
                result.status["ready"] = any(c["type"] == "Ready" and c["status"] == "True"
                                             for c in result.status.get("conditions", []))
            return result
        except ForeignChild as e:
            return self._blocked(status, conditions, e, RunRef(kind, meta["name"], meta["namespace"], meta["uid"]))
        except Exception as e:  # written to the status, retried on the next pass
            log.exception("reconcile of %s %s/%s failed", kind, meta["namespace"], meta["name"])
            return self._error(status, conditions, describe_error(e))

    def _reconcile(self, kind: str, body: dict, now: str) -> Result:
        meta, status = body["metadata"], dict(body.get("status") or {})
        run = RunRef(kind, meta["name"], meta["namespace"], meta["uid"])
        workload = WORKLOADS[kind]
        conditions = Conditions(status.get("conditions") or [], meta.get("generation"), now)
        events: list[tuple[str, str, str]] = []

        try:
            desired, invalid = workload.spec_model.model_validate(body.get("spec") or {}), None
            desired = queueing.queue_from_label(desired, meta.get("labels"))
        except ValidationError as e:
            desired = None
            invalid = format_validation_error(e, model=workload.spec_model).replace("invalid config:\n", "invalid spec: ").replace("\n", ";")
        except ValueError as e:  # the run's queue-name label contradicts spec.queue
            desired, invalid = None, f"invalid spec: {e}"
        refused, checked = self.guardrail_refusals(run, desired) if desired is not None else ([], False)
        if refused:
            why = f"forbidden by the guardrails: {'; '.join(refused)}"
            if self.settings.guardrails.enforced:
                desired, invalid = None, why
            elif checked:  # [Warn, Audit]: said once per spec, and the run goes on
                events.append(("Warning", "Forbidden", why))
        try:
            spec, refusal = self.applied_spec(run, workload, desired)
        except UntrustedSpec as e:  # never realised: the run fails and its servers go
            if desired is not None:
                self.teardown(run, workload, desired)
            if conditions.set("SpecAccepted", False, "UntrustedSpec", str(e)):
                events.append(("Warning", "UntrustedSpec", str(e)))
            return self._finish(status, "Failed", str(e), conditions, events, stalled=True)
        if invalid or refusal:
            reason, why = ("InvalidSpec", invalid) if invalid else ("ChangeRequiresRecreate", refusal)
            if conditions.set("SpecAccepted", False, reason, why) and spec is not None:
                events.append(("Warning", reason, why))  # once per refused change; the run goes on
            if spec is None:  # never started: nothing to keep running
                return self._finish(status, "Failed", invalid, conditions, events, stalled=True)
        else:
            conditions.set("SpecAccepted", True, "Accepted", "spec applied")
        status["maxSteps"] = spec.config.max_steps
        attachment = None
        if getattr(spec, "member", False):
            workload = MEMBER
        if workload is MEMBER and not pools.ended(status):  # an ended member is never attached again
            found = self.pools.attachment(run, spec, body)
            if isinstance(found, pools.Attachment):
                attachment = found
                conditions.set("Accepted", True, "Attached", f"member {found.member} of RLPool "
                               f"{found.pool.namespace}/{found.pool.name}, share {found.share}")
            else:  # never started, or detached: nothing of it runs
                self.teardown(run, workload, spec)
                if conditions.set("Accepted", False, found.reason, found.message):
                    events.append(("Warning", found.reason, found.message))
                return self._finish(status, "Pending", f"{found.reason}: {found.message}", conditions, events,
                                    stalled=False, worst=observe.Health(False, found.reason, found.message))

        job, older = self.trainer_jobs(run)
        attempt = observe.job_attempt(job) if job else int(status.get("attempt", 0))
        restarts = int(job["metadata"].get("annotations", {}).get(builders.RESTARTS_ANNOTATION, 0)) if job else 0
        pods = self.kube.list("Pod", run.namespace, run.pod_labels())
        trainer_pods = [p for p in pods if _component(p) == "trainer" and observe.pod_attempt(p) == attempt]
        outcome, why = observe.trainer_outcome(job, trainer_pods)
        # A member has no trainer of its own: its orchestrator says it finished (exit 0, the
        # step in its termination message), and the pool trainer let it go at its max_steps.
        finishers = trainer_pods if attachment is None else [p for p in pods if _component(p) == "orchestrator"]
        if attachment is not None and (done := observe.finished_step(finishers)) is not None:
            outcome, why = "succeeded", (f"finished at step {done} on RLPool "
                                         f"{attachment.pool.namespace}/{attachment.pool.name}")
        queued = self._queue(run, workload, spec)
        spec, hold, held_outside = _held(spec, queued, job)
        if outcome in ("failed", "disrupted") and spec.suspend:
            outcome = "suspended"  # pods killed by the suspension are not failures

        # The run's clock starts at its first unsuspended pass (a run queued suspended waits free).
        status["startTime"] = status.get("startTime") or (None if spec.suspend or hold else now)
        left = lifetime.seconds_left(spec, status, now)
        terminal: str | None = None
        limit = spec.restart_policy.backoff_limit
        if outcome == "none" and status.get("completionTime") and status.get("phase") in ("Succeeded", "Failed"):
            # Finished, and its Job is gone (TTL controller, or by hand): stay finished, never re-run.
            terminal, why = status["phase"], status.get("message", "")
        elif outcome == "succeeded":
            terminal = "Succeeded"
        elif (invalid := observe.invalid_exit(trainer_pods + [p for p in pods if _component(p) != "trainer"])) \
                or outcome == "invalid":
            # Exit code 2 (an invalid config, a missing model) in any component: no restart fixes it.
            terminal, why = "Failed", ": ".join(invalid or (observe.INVALID_CONFIG, why))
        elif (outcome == "deadline" or (left is not None and left <= 0)) and not lifetime.finished_before_deadline(
                spec, status):
            terminal, why = "Failed", f"DeadlineExceeded: {lifetime.deadline_message(spec, status)}"
        elif outcome == "failed" and restarts >= limit:
            terminal, why = "Failed", f"BackoffLimitExceeded: {why} after {restarts} restarts"
        elif outcome in ("failed", "disrupted"):
            # A disruption (preemption, eviction, a drained node) is not the trainer's fault:
            # the gang restarts all the same, but without spending the run's backoffLimit.
            attempt, restarts = attempt + 1, restarts + (outcome == "failed")
            events.append(_restart_event(outcome, why, restarts, limit))
            older.append(job)
        elif outcome == "suspended" and not spec.suspend and not held_outside:
            attempt += 1  # resume: a fresh trainer Job that loads the latest checkpoint
            events.append(("Normal", "Resumed", "resuming from the latest checkpoint"))
            older.append(job)

        status.update(restarts=restarts, attempt=attempt)
        if terminal == "Succeeded" and status.get("phase") != "Succeeded":
            self._read_final_progress(run, workload, spec, finishers, status, conditions)  # before teardown
        if terminal:
            self.teardown(run, workload, spec)
            if workload is MEMBER:
                conditions.set("Accepted", False, "Finished", f"the run ended ({terminal}): it holds no place on "
                               "its pool")
            if queued is not None:
                self.kueue.finish(queued.workload, terminal, why, now)
            if terminal == "Succeeded" and spec.export is not None:
                self._export(run, workload, spec, pods, status, conditions, events)
        else:
            self.apply(run, workload, spec, attempt, restarts, left, held=held_outside, queued=queued,
                       attachment=attachment)
            for stale in older:
                self.kube.delete("Job", run.namespace, stale["metadata"]["name"], uid=stale["metadata"].get("uid"))
            if queued is not None and queued.evicted:  # stopped now: Kueue may requeue it
                self.kueue.release(queued.workload, now)
        volumes = self._volume_problems(run, pods)
        health = self._health(workload, spec, attempt, pods, terminal, volumes, hold)
        for comp, h in health.items():
            conditions.set(f"{comp.capitalize()}Ready", h.ready, h.reason, h.message)
        for name in SERVED_MODELS:
            if name not in health:
                conditions.drop(f"{name.capitalize()}Ready")  # dropped while suspended
        if "inference" in workload.components:  # desired: none while stopped (suspended, queued, ended)
            desired = 0 if terminal or spec.suspend or hold else spec.inference.replicas
            status["inference"] = observe.replicas_status(
                run, [p for p in pods if _component(p) == "inference"], desired)
        self._read_progress(run, workload, spec, health, status, conditions)
        was_running = status.get("phase") == "Running"
        phase, message, degraded = self._phase(spec, health, terminal, why, was_running, hold)
        if terminal:
            status["completionTime"] = status.get("completionTime") or now
        else:
            status["completionTime"] = None  # null deletes it in the merge patch
        if degraded is None:
            conditions.set("Degraded", False, phase, "")
        else:
            conditions.set("Degraded", True, degraded[1].reason, f"{degraded[0]}: {degraded[1].message}")
        worst = degraded[1] if degraded else None
        if hold and not terminal:
            worst = observe.Health(False, "Queued", hold)
        result = self._finish(status, phase, message, conditions, events, stalled=terminal == "Failed", worst=worst)
        if terminal and lifetime.expired(spec, status, now) and self.kube.delete_run(run):
            why = (f"finished at {status['completionTime']}, ttlSecondsAfterFinished is "
                   f"{spec.ttl_seconds_after_finished}: deleting the run and its children")
            result.events.append(("Normal", "Expired", why))
        return result

    def _export(self, run: RunRef, workload: Workload, spec: RunSpecBase, pods: list[dict], status: dict,
                conditions: Conditions, events: list) -> None:
        """`spec.export` of a run that Succeeded: its export Job made once, its outcome in
        condition `Exported` and, once done, `status.export`. A run exported stays so when its
        Job is gone."""
        done = get_condition(conditions.items, "Exported")
        if done is not None and done.get("status") == "True":
            return
        job = self.kube.ensure(export.build_export_job(run, spec, workload.config_file))
        ok, message = export.outcome(job, [p for p in pods if _component(p) == export.COMPONENT])
        where = export.location(run, spec)
        if ok:
            status["export"] = where
            message = f"exported to {export.described(where)}"
        reason = {True: "Exported", False: "ExportFailed", None: "Exporting"}[ok]
        if conditions.set("Exported", ok is True if ok is not None else None, reason, message) and ok is not None:
            events.append(("Normal" if ok else "Warning", reason, message))

    def _volume_problems(self, run: RunRef, pods: list[dict]) -> dict[str, dict]:
        """Volume events of pods stuck before starting (read only when a pod is)."""
        if not any(observe.creating(p) for p in pods):
            return {}
        events = self.kube.list("Event", run.namespace, {}, {"involvedObject.kind": "Pod", "type": "Warning"})
        return observe.volume_problems(pods, events)

    def _queue(self, run: RunRef, workload: Workload, spec: RunSpecBase) -> queueing.Admission | None:
        """The admission of the run's Kueue Workload (made on the first pass); None: no queue."""
        if spec.queue is None:
            return None
        trainer = builders.build_trainer_job(run, spec, module=workload.module, config_file=workload.config_file,
                                             attempt=0, restarts=0, suspend=True,
                                             status_port=workload.trainer_status_port
                                             ) if "trainer" in workload.components else None
        return self.kueue.ensure(run, queueing.build_workload(run, spec, trainer))

    @staticmethod
    def _health(workload, spec, attempt: int, pods: list[dict], terminal: str | None,
                volumes: dict[str, dict], hold: str | None = None) -> dict[str, observe.Health]:
        """Each component's health from its pods (the trainer's of the current attempt only)."""
        expected = {"orchestrator": 1, "trainer": spec.trainer.nodes}
        if "inference" in workload.components:
            expected["inference"] = spec.inference.replicas
            expected |= {name: served.replicas for name, served in spec.served_models().items()}
        health = {}
        for comp in workload.components + tuple(name for name in SERVED_MODELS if name in expected):
            if terminal or spec.suspend or hold:
                reason = terminal or ("Queued" if hold else "Suspended")
                health[comp] = observe.Health(False, reason, f"{comp} stopped ({reason})")
                continue
            mine = [p for p in pods if _component(p) == comp and (comp != "trainer" or observe.pod_attempt(p) == attempt)]
            health[comp] = observe.component_health(mine, expected[comp], volumes)
        return health

    @staticmethod
    def _phase(
        spec, health: dict[str, observe.Health], terminal: str | None, why: str, was_running: bool,
        hold: str | None = None,
    ) -> tuple[str, str, tuple[str, observe.Health] | None]:
        """(phase, message, the degraded component and its health). A run that has been Running
        stays Running when a component crash-loops or loses readiness: `Degraded` says which."""
        if terminal:
            return terminal, why, None
        if hold:  # waiting for capacity: nothing of it runs, and nothing is wrong with it
            return "Pending", f"Queued: {hold}", None
        if spec.suspend:
            return "Suspended", "suspended: compute scaled to zero, storage kept", None
        bad = next(((c, h) for c, h in health.items() if h.bad), None)
        unready = next(((c, h) for c, h in health.items() if not h.ready), None)
        if was_running and unready is not None:
            comp, h = bad or unready
            return "Running", f"degraded: {comp} {h.reason}: {h.message}", bad or unready
        if bad is not None:
            comp, h = bad
            phase = "Pending" if h.reason in observe.PENDING_REASONS else "Initializing"
            return phase, f"{h.reason}: {h.message}", bad
        if unready is None:
            return "Running", "training", None
        return "Initializing", "; ".join(f"{c}: {h.message}" for c, h in health.items() if not h.ready), None

    def _read_final_progress(
        self, run: RunRef, workload: Workload, spec: RLRunSpec | SFTRunSpec, trainer_pods: list[dict],
        status: dict, conditions: Conditions,
    ) -> None:
        """The end of a run that Succeeded: the step from the trainer itself (its termination
        message, `observe.finished_step`), reward and checkpoint from a last read of the
        orchestrator's status (an RLRun). Neither status server outlives the run for long: an
        SFTRun's goes with its trainer, and without the message STEP would stay the last one
        read while it trained."""
        finished = observe.finished_step(trainer_pods)
        if "orchestrator" in workload.components:
            self._read_progress(run, workload, spec, None, status, conditions, finished=finished)
        if finished is not None:
            status["step"] = finished

    def _read_progress(
        self, run: RunRef, workload: Workload, spec: RLRunSpec | SFTRunSpec,
        health: dict[str, observe.Health] | None, status: dict, conditions: Conditions,
        finished: int | None = None,
    ) -> None:
        """Step, reward and checkpoint from the orchestrator (RLRun) or trainer pod 0 (SFTRun);
        `ProgressReadable` says whether the last read worked, and if not from where and why."""
        if not workload.reads_progress:
            return
        if workload.trainer_status_port is None:
            source, service = "orchestrator", run.child("orchestrator")
        else:
            source, service = "trainer", run.trainer_master_service
        port = _status_port(workload, spec)
        if health is not None and not health[source].ready:  # None: the final read of a finished run
            return
        url = progress.status_url(self.settings.status_url_template, service=service,
                                  namespace=run.namespace, port=port)
        try:
            data = progress.read_progress(url)
        except podread.Unreadable as e:
            message = str(e)
            if health is None:  # the final read of a finished run (its orchestrator may be gone already)
                last = "step and reward are the last read" if finished is None else \
                    "the step is the trainer's own, reward and checkpoint the last read"
                message = f"the run ended before its final {source} status was read ({e}): {last}"
            if conditions.set("ProgressReadable", False, e.reason, message):
                log.warning("progress of %s %s/%s unreadable: %s", run.kind, run.namespace, run.name, e)
            return
        conditions.set("ProgressReadable", True, "Read", f"{source} status read from {url}")
        for ours, theirs in (("step", "step"), ("reward", "reward"), ("evalReward", "eval_reward"),
                             ("lastCheckpointStep", "last_checkpoint_step")):
            if (value := data.get(theirs)) is not None:
                status[ours] = progress.significant(value) if ours in progress.ROUNDED else value

    @staticmethod
    def _finish(status, phase, message, conditions: Conditions, events, *, stalled, worst=None) -> Result:
        """Ready/Progressing/Reconciling/Stalled from the phase, an event on every phase change.

        `Reconciling` and `Stalled` are the abnormal-true pair Flux's kstatus reads: without
        `Reconciling`, kstatus would call a run whose pods are still Pending, or a running run
        whose component crash-loops, "Current"."""
        ready = phase in ("Running", "Succeeded") and worst is None
        reason = worst.reason if worst is not None else phase
        conditions.set("Ready", ready, reason, message)
        conditions.set("Progressing", phase in ("Pending", "Initializing", "Running"), phase, message)
        reconciling = phase in ("Pending", "Initializing") or (phase == "Running" and worst is not None)
        conditions.set("Reconciling", reconciling, reason if reconciling else phase, message if reconciling else "")
        conditions.set("Stalled", stalled, "Failed" if stalled else phase, message if stalled else "")
        if phase == "Failed":  # why, with the reason the message starts with (`InvalidConfig: …`)
            prefix = message.partition(":")[0]
            conditions.set("Failed", True, prefix if prefix.isidentifier() and prefix[0].isupper() else "Failed", message)
        else:
            conditions.drop("Failed")
        if phase != status.get("phase"):
            events.append(("Warning" if phase == "Failed" else "Normal", phase, message))
        status.update(phase=phase, message=message, conditions=conditions.items,
                      observedGeneration=conditions.generation)
        return Result(status=status, events=events)

    @staticmethod
    def _blocked(status: dict, conditions: Conditions, foreign: ForeignChild, run: RunRef) -> Result:
        """A child's name is taken: by this run's deleted predecessor (wait for the garbage
        collector), or by someone else's object (the user must resolve it). Never adopted."""
        owner = foreign.owner
        if owner and (owner.get("kind"), owner.get("name")) == (run.kind, run.name):
            reason = "PreviousRunTerminating"
            message = (f"{foreign.kind} {foreign.name} still belongs to a deleted {run.kind} {run.name} "
                       f"(uid {owner.get('uid')}): waiting for the garbage collector to remove it")
        else:
            reason = "NameConflict"
            message = f"{foreign}, not to this run: rename the run, or delete that {foreign.kind}"
        phase = status.get("phase") if status.get("phase") in ("Succeeded", "Failed") else "Pending"
        events = [("Warning", reason, message)] if conditions.set("Ready", False, reason, message) else []
        conditions.set("Reconciling", phase == "Pending", reason, message)
        status.update(phase=phase, message=f"{reason}: {message}", conditions=conditions.items)
        return Result(status=status, events=events)

    @staticmethod
    def _error(status: dict, conditions: Conditions, message: str) -> Result:
        """A pass that failed: Ready=False (ReconcileError) with the error, the phase kept, and
        `observedGeneration` not advanced (this spec was not reconciled)."""
        events = [("Warning", "ReconcileError", message)] if conditions.set("Ready", False, "ReconcileError", message) else []
        status.update(phase=status.get("phase") or "Pending", message=f"ReconcileError: {message}",
                      conditions=conditions.items)
        return Result(status=status, events=events, error=message)


def _valid(model: type[BaseModel], body: dict) -> BaseModel | None:
    try:
        return model.model_validate(body.get("spec") or {})
    except ValidationError:
        return None


def describe_error(e: Exception) -> str:
    """One line: an API error's status and the API server's own message, else the exception."""
    if isinstance(e, ApiException):
        try:
            detail = json.loads(e.body or "{}").get("message") or e.reason
        except (ValueError, AttributeError):
            detail = e.reason
        return f"{e.status} {e.reason}: {detail}"
    return f"{type(e).__name__}: {e}"


def _held(spec: RunSpecBase, queued: queueing.Admission | None,
          job: dict | None) -> tuple[RunSpecBase, str | None, bool]:
    """(the spec to realize, why the run waits for capacity, whether its trainer Job is held
    from outside). A run its queue has not admitted (or has evicted) is realized suspended; one
    whose Job someone else suspended keeps its spec, the Job left as it is."""
    if spec.suspend:
        return spec, None, False
    if queued is not None and not queued.admitted:
        return spec.model_copy(update={"suspend": True}), queued.message, False
    if (outside := queueing.suspended_from_outside(job)) is not None:
        return spec, outside, True
    return spec, None, False


def _restart_event(outcome: str, why: str, restarts: int, limit: int) -> tuple[str, str, str]:
    if outcome == "disrupted":
        message = f"{why}; gang restart from the latest checkpoint, not counted against backoffLimit"
        return "Warning", "TrainerDisrupted", f"{message} ({restarts}/{limit} restarts used)"
    return "Warning", "TrainerRestarted", f"{why}; gang restart {restarts}/{limit} from the latest checkpoint"


def _status_port(workload: Workload, spec: RunSpecBase) -> int:
    """The port of the run's `GET /status`: the orchestrator's (RLRun) or trainer pod 0's (SFTRun)."""
    return workload.trainer_status_port or spec.config.orchestrator.http_port


def _serving_ports(workload: Workload, spec: RunSpecBase) -> list[int] | None:
    """The ports an RLRun's servers serve its pods on: the orchestrator's status and gRPC, vLLM's
    HTTP (inference, teacher, judge); None for an SFTRun, whose trainer is its only pod."""
    if workload.components == ("trainer",):
        return None
    served = [s.server.port for s in spec.served_models().values()]
    return sorted({_status_port(workload, spec), spec.config.rollouts.port, spec.config.inference.port, *served})


def _metrics_ports(workload: Workload, spec: RunSpecBase) -> list[int]:
    """The ports that serve `/metrics`: the status port, the RL trainer's, and vLLM's (inference,
    teacher, judge)."""
    ports = {_status_port(workload, spec)}
    if metrics := trainer_metrics_port(spec):
        ports.add(metrics)
    if "inference" in workload.components:
        ports.add(spec.config.inference.port)
        ports |= {served.server.port for served in spec.served_models().values()}
    return sorted(ports)


def _component(pod: dict) -> str | None:
    return pod.get("metadata", {}).get("labels", {}).get("app.kubernetes.io/component")
