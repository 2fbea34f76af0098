"""One level-triggered reconcile of an RLRun or SFTRun.

fetch the spec → decide what is applied (refusing changes that cannot apply live) → read the
actual children → decide the trainer's fate (keep, gang-restart, resume, give up) → create or
correct children (or tear them down when done) → observe pods and progress → status.

Nothing is remembered between calls: the trainer Job carries its attempt and restart count in
annotations, the ConfigMap carries the applied spec. A stale or lost status therefore cannot
make the operator restart twice or resume from the wrong place.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import BaseModel, ValidationError
from rlkube.config.cli import format_validation_error

from rlkube_operator import builders, observe, progress
from rlkube_operator.conditions import Conditions
from rlkube_operator.kube import Kube
from rlkube_operator.names import SFT_STATUS_PORT, RunRef
from rlkube_operator.spec import RLRunSpec, RunSpecBase, SFTRunSpec
from rlkube_operator.wiring import rl_tomls, sft_tomls

LIVE_FIELDS = {"suspend", "restartPolicy"}  # applied to a running run; anything else is refused


@dataclass(frozen=True)
class Workload:
    """What differs between RLRun and SFTRun."""

    spec_model: type[RunSpecBase]
    components: tuple[str, ...]
    module: str
    config_file: str
    tomls: Callable[[RunRef, RunSpecBase, int], dict[str, str]]
    trainer_status_port: int | None = None
    """Where pod 0 of the trainer serves `GET /status`; None: progress is the orchestrator's."""


WORKLOADS = {
    "RLRun": Workload(
        RLRunSpec, ("inference", "orchestrator", "trainer"), "rlkube.entrypoints.trainer", "trainer.toml", rl_tomls
    ),
    "SFTRun": Workload(
        SFTRunSpec, ("trainer",), "rlkube.entrypoints.sft", "sft.toml", sft_tomls, trainer_status_port=SFT_STATUS_PORT
    ),
}


@dataclass
class Settings:
    status_url_template: str = progress.DEFAULT_URL_TEMPLATE
    """Where a run's progress is read; see `progress.py` for why the Service, not the proxy."""


@dataclass
class Result:
    """The status to write and the events to post."""

    status: dict
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)


def _dump(spec: BaseModel) -> dict:
    return spec.model_dump(mode="json", by_alias=True)


def _frozen(spec: dict) -> dict:
    return {k: v for k, v in spec.items() if k not in LIVE_FIELDS}


def _changed_fields(old: dict, new: dict, prefix: str = "spec") -> list[str]:
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _changed_fields(a, b, f"{prefix}.{key}")
        elif a != b:
            out.append(f"{prefix}.{key}")
    return out


class Reconciler:
    def __init__(self, kube: Kube, settings: Settings | None = None):
        self.kube = kube
        self.settings = settings or Settings()

    # --- spec ---------------------------------------------------------------------
    def applied_spec(
        self, run: RunRef, workload: Workload, desired: RunSpecBase | None
    ) -> tuple[RunSpecBase | None, str | None]:
        """The spec to realize, and why the requested one was refused (None if accepted).
        A started run (its ConfigMap holds the applied spec) keeps that spec, with the live
        fields taken from the request; `desired` is None when the request is invalid."""
        cm = self.kube.get("ConfigMap", run.namespace, run.child("config"))
        if cm is None or builders.APPLIED_SPEC_KEY not in cm.get("data", {}):
            return desired, None
        old = json.loads(cm["data"][builders.APPLIED_SPEC_KEY])
        if desired is None:
            return workload.spec_model.model_validate(old), None
        new = _dump(desired)
        changed = _changed_fields(_frozen(old), _frozen(new))
        if not changed:
            return desired, None
        live = {k: v for k, v in new.items() if k in LIVE_FIELDS}
        applied = workload.spec_model.model_validate(_frozen(old) | live)
        shown = ", ".join(changed[:5]) + (" …" if len(changed) > 5 else "")
        return applied, (
            f"changes to {shown} cannot apply to a started run; only suspend and restartPolicy "
            "do. Delete and recreate the run to change them (a PVC claimName keeps checkpoints)."
        )

    # --- children ---------------------------------------------------------------------
    def trainer_jobs(self, run: RunRef) -> tuple[dict | None, list[dict]]:
        jobs = self.kube.list("Job", run.namespace, run.selector("trainer"))
        jobs.sort(key=observe.job_attempt)
        return (jobs[-1] if jobs else None), jobs[:-1]

    def apply(self, run: RunRef, workload: Workload, spec: RunSpecBase, attempt: int, restarts: int) -> None:
        """Create or correct every child for `attempt` (idempotent)."""
        k = self.kube
        if (pvc := builders.build_pvc(run, spec)) is not None:
            k.ensure(pvc)
        tomls = workload.tomls(run, spec, attempt)
        k.ensure(builders.build_configmap(run, tomls, _dump(spec)))
        replicas = 0 if spec.suspend else 1
        if "inference" in workload.components:
            k.ensure(builders.build_inference_service(run, spec))
            k.ensure(builders.build_inference_statefulset(run, spec, replicas * spec.inference.replicas))
            k.ensure(builders.build_orchestrator_service(run, spec))
            k.ensure(builders.build_orchestrator_deployment(run, spec, replicas, attempt))
        k.ensure(builders.build_trainer_service(run, spec))
        job = builders.build_trainer_job(
            run, spec, module=workload.module, config_file=workload.config_file,
            attempt=attempt, restarts=restarts, suspend=spec.suspend, status_port=workload.trainer_status_port,
        )
        existing = k.ensure(job)
        if existing.get("spec", {}).get("suspend") != spec.suspend:
            k.patch("Job", run.namespace, job["metadata"]["name"], {"spec": {"suspend": spec.suspend}})

    def teardown(self, run: RunRef, workload: Workload) -> None:
        """Free the GPUs: inference and orchestrator go; ConfigMap, PVC and the Job stay."""
        if "inference" in workload.components:
            self.kube.delete("StatefulSet", run.namespace, run.child("inference"))
            self.kube.delete("Deployment", run.namespace, run.child("orchestrator"))

    # --- the loop ---------------------------------------------------------------------
    def reconcile(self, kind: str, body: dict, now: str) -> Result:
        meta, status = body["metadata"], dict(body.get("status") or {})
        run = RunRef(kind, meta["name"], meta["namespace"], meta["uid"])
        workload = WORKLOADS[kind]
        conditions = Conditions(status.get("conditions") or [], meta.get("generation"), now)
        events: list[tuple[str, str, str]] = []

        try:
            desired, invalid = workload.spec_model.model_validate(body.get("spec") or {}), None
        except ValidationError as e:
            desired = None
            invalid = format_validation_error(e).replace("invalid config:\n", "invalid spec: ").replace("\n", ";")
        spec, refusal = self.applied_spec(run, workload, desired)
        if invalid or refusal:
            reason, why = ("InvalidSpec", invalid) if invalid else ("ChangeRequiresRecreate", refusal)
            if conditions.set("SpecAccepted", False, reason, why) and spec is not None:
                events.append(("Warning", reason, why))  # once per refused change; the run goes on
            if spec is None:  # never started: nothing to keep running
                return self._finish(status, "Failed", invalid, conditions, events, stalled=True)
        else:
            conditions.set("SpecAccepted", True, "Accepted", "spec applied")
        status["maxSteps"] = spec.config.max_steps

        job, older = self.trainer_jobs(run)
        attempt = observe.job_attempt(job) if job else int(status.get("attempt", 0))
        restarts = int(job["metadata"].get("annotations", {}).get(builders.RESTARTS_ANNOTATION, 0)) if job else 0
        pods = self.kube.list("Pod", run.namespace, {"rlkube.dev/run": run.name})
        trainer_pods = [p for p in pods if _component(p) == "trainer" and observe.pod_attempt(p) == attempt]
        outcome, why = observe.trainer_outcome(job, trainer_pods)

        terminal: str | None = None
        limit = spec.restart_policy.backoff_limit
        if outcome == "none" and status.get("completionTime") and status.get("phase") in ("Succeeded", "Failed"):
            # Finished, and its Job is gone (TTL controller, or by hand): stay finished, never re-run.
            terminal, why = status["phase"], status.get("message", "")
        elif outcome == "failed":
            if restarts >= limit:
                terminal, why = "Failed", f"BackoffLimitExceeded: {why} after {restarts} restarts"
            elif not spec.suspend:
                attempt, restarts = attempt + 1, restarts + 1
                events.append(("Warning", "TrainerRestarted",
                               f"{why}; gang restart {restarts}/{limit} from the latest checkpoint"))
                older.append(job)
        elif outcome == "succeeded":
            terminal = "Succeeded"
        elif outcome == "suspended" and not spec.suspend:
            attempt += 1  # resume: a fresh trainer Job that loads the latest checkpoint
            events.append(("Normal", "Resumed", "resuming from the latest checkpoint"))
            older.append(job)

        status.update(restarts=restarts, attempt=attempt)
        if terminal:
            self.teardown(run, workload)
        else:
            status["startTime"] = status.get("startTime") or now
            self.apply(run, workload, spec, attempt, restarts)
            for stale in older:
                self.kube.delete("Job", run.namespace, stale["metadata"]["name"])
        health = self._health(workload, spec, attempt, pods, terminal)
        for comp, h in health.items():
            conditions.set(f"{comp.capitalize()}Ready", h.ready, h.reason, h.message)
        self._read_progress(run, workload, spec, attempt, health, status)
        phase, message = self._phase(spec, health, terminal, why)
        if terminal:
            status["completionTime"] = status.get("completionTime") or now
            if terminal == "Succeeded":
                status["step"] = spec.config.max_steps
        else:
            status["completionTime"] = None  # null deletes it in the merge patch
        worst = next((h for h in health.values() if h.bad), None)
        return self._finish(status, phase, message, conditions, events, stalled=terminal == "Failed", worst=worst)

    @staticmethod
    def _health(workload, spec, attempt: int, pods: list[dict], terminal: str | None) -> dict[str, observe.Health]:
        """Each component's health from its pods (the trainer's of the current attempt only)."""
        expected = {"orchestrator": 1, "trainer": spec.trainer.nodes}
        if "inference" in workload.components:
            expected["inference"] = spec.inference.replicas
        health = {}
        for comp in workload.components:
            if terminal or spec.suspend:
                reason = terminal or "Suspended"
                health[comp] = observe.Health(False, reason, f"{comp} stopped ({reason})")
                continue
            mine = [p for p in pods if _component(p) == comp and (comp != "trainer" or observe.pod_attempt(p) == attempt)]
            health[comp] = observe.component_health(mine, expected[comp])
        return health

    @staticmethod
    def _phase(spec, health: dict[str, observe.Health], terminal: str | None, why: str) -> tuple[str, str]:
        if terminal:
            return terminal, why
        if spec.suspend:
            return "Suspended", "suspended: compute scaled to zero, storage kept"
        worst = next((h for h in health.values() if h.bad), None)
        if worst is not None:
            phase = "Pending" if worst.reason in observe.PENDING_REASONS else "Initializing"
            return phase, f"{worst.reason}: {worst.message}"
        if all(h.ready for h in health.values()):
            return "Running", "training"
        return "Initializing", "; ".join(f"{c}: {h.message}" for c, h in health.items() if not h.ready)

    def _read_progress(
        self, run: RunRef, workload: Workload, spec: RLRunSpec | SFTRunSpec, attempt: int,
        health: dict[str, observe.Health], status: dict,
    ) -> None:
        """Step, reward and checkpoint from the orchestrator (RLRun) or trainer pod 0 (SFTRun)."""
        if workload.trainer_status_port is None:
            source, service, port = "orchestrator", run.child("orchestrator"), spec.config.orchestrator.http_port
        else:
            source, service, port = "trainer", run.trainer_pod0(attempt), workload.trainer_status_port
        if not health[source].ready:  # every component of the workload has a health
            return
        url = progress.status_url(self.settings.status_url_template, service=service,
                                  namespace=run.namespace, port=port)
        data = progress.read_progress(url)
        if data is None:
            return
        for ours, theirs in (("step", "step"), ("reward", "reward"), ("lastCheckpointStep", "last_checkpoint_step")):
            if data.get(theirs) is not None:
                status[ours] = data[theirs]

    @staticmethod
    def _finish(status, phase, message, conditions: Conditions, events, *, stalled, worst=None) -> Result:
        """Ready/Progressing/Reconciling/Stalled from the phase, an event on every phase change.

        `Reconciling` and `Stalled` are the abnormal-true pair Flux's kstatus reads: without
        `Reconciling`, kstatus would call a run whose pods are still Pending "Current"."""
        ready = phase in ("Running", "Succeeded")
        reason = worst.reason if worst is not None and not ready else phase
        conditions.set("Ready", ready, reason, message)
        conditions.set("Progressing", phase in ("Pending", "Initializing", "Running"), phase, message)
        starting = phase in ("Pending", "Initializing")
        conditions.set("Reconciling", starting, phase, message if starting else "")
        conditions.set("Stalled", stalled, "Failed" if stalled else phase, message if stalled else "")
        if phase != status.get("phase"):
            events.append(("Warning" if phase == "Failed" else "Normal", phase, message))
        status.update(phase=phase, message=message, conditions=conditions.items,
                      observedGeneration=conditions.generation)
        return Result(status=status, events=events)


def _component(pod: dict) -> str | None:
    return pod.get("metadata", {}).get("labels", {}).get("app.kubernetes.io/component")
