"""Queueing against kmock: the operator leaves an external suspend alone, and a run with
`spec.queue` is one Kueue Workload (the test plays Kueue, writing the Workload's status)."""

import asyncio
import json
import tomllib

import pytest
from rlkube_operator import builders, queueing
from rlkube_operator.builders import SUSPEND_ANNOTATION
from rlkube_operator.components import TeacherSpec
from rlkube_operator.names import RunRef
from rlkube_operator.queueing import suspend_patch
from rlkube_operator.spec import RLRunSpec

from tests.operator.cluster import pod_disrupted, pod_failed
from tests.operator.test_helm import VALUES, _granted, operator_requests, render
from tests.operator.test_operator_kmock import TEACHER, condition, rlrun, start_everything

KUEUE_SUSPENDS = {"metadata": {"managedFields": [
    {"manager": "kueue", "operation": "Update", "apiVersion": "batch/v1", "fieldsType": "FieldsV1",
     "fieldsV1": {"f:spec": {"f:suspend": {}}}}]}}


def _status(cluster) -> dict:
    return cluster.status("RLRun", "rt")


def _compute(cluster) -> dict[str, int]:
    """Replicas of every scaled child, and whether the trainer Job runs (1) or not (0)."""
    out = {f"{kind} {name}": cluster.get(kind, name)["spec"]["replicas"]
           for kind in ("StatefulSet", "Deployment") for name in cluster.names(kind)}
    return out | {f"Job {name}": int(not cluster.get("Job", name)["spec"]["suspend"]) for name in cluster.names("Job")}


def _kueue_conditions(*true: str, false: tuple[str, ...] = ()) -> list[dict]:
    now = "2026-01-01T00:00:00Z"
    return [{"type": t, "status": s, "reason": t if s == "True" else "Pending", "message": f"{t} by the test",
             "lastTransitionTime": now} for t, s in [(t, "True") for t in true] + [(t, "False") for t in false]]


ADMISSION = {"clusterQueue": "gpus", "podSetAssignments": [
    {"name": "trainer", "flavors": {"nvidia.com/gpu": "h100"}, "count": 1}]}


async def flavor(cluster, name: str, **spec) -> None:
    """A Kueue ResourceFlavor (cluster-scoped), as an admin makes it."""
    body = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": name}, "spec": spec}
    await cluster.api.create(body)  # one made already is fine


async def admit(cluster, admission: dict = ADMISSION) -> None:
    """What Kueue writes when it admits the Workload (on flavours that exist)."""
    for name in {f for a in admission["podSetAssignments"] for f in a["flavors"].values()}:
        await flavor(cluster, name)
    await cluster.patch("Workload", "rt-workload", {"status": {
        "admission": admission, "conditions": _kueue_conditions("QuotaReserved", "Admitted", false=("Evicted",))}})


def _kueue_grants(values: dict) -> set[tuple[str, str, str]]:
    """The chart's Kueue grants: the run's Role, and the ClusterRole for ResourceFlavors."""
    flavors = {(group, res, verb) for o in render(values) if o["kind"] == "ClusterRole" for rule in o["rules"]
               for group in rule["apiGroups"] for res in rule["resources"] for verb in rule["verbs"]}
    return {g for g in _granted(values) | flavors if g[0] == "kueue.x-k8s.io"}


def _job(suspend: bool, last_applied: str | None = None) -> dict:
    annotations = {} if last_applied is None else {SUSPEND_ANNOTATION: last_applied}
    return {"metadata": {"name": "rt-trainer-0", "annotations": annotations}, "spec": {"suspend": suspend}}


def test_the_job_is_patched_only_when_the_runs_own_suspend_changed():
    assert suspend_patch(_job(True, last_applied="false"), False) is None  # suspended from outside: stays
    assert suspend_patch(_job(False, last_applied="true"), True) is None  # released from outside: runs
    assert suspend_patch(_job(False, last_applied="false"), True) == {
        "metadata": {"annotations": {SUSPEND_ANNOTATION: "true"}}, "spec": {"suspend": True}}
    # A Job made before the annotation: annotated with what it is, not changed.
    assert suspend_patch(_job(True), True) == {"metadata": {"annotations": {SUSPEND_ANNOTATION: "true"}}}


async def test_an_external_suspend_is_not_fought_and_its_release_just_runs(cluster):
    """A queue controller (here: Kueue, by its managed field) suspends the trainer Job of a
    running run: the Job stays suspended, the run is Pending (Queued) with the rest scaled to
    zero, no restart is counted and no new attempt made; released, the same Job runs on."""
    await cluster.create(rlrun(restartPolicy={"backoffLimit": 0}))
    await start_everything(cluster)

    await cluster.patch("Job", "rt-trainer-0", {"spec": {"suspend": True}} | KUEUE_SUSPENDS)
    await cluster.patch("Pod", "rt-trainer-0-0", {"status": pod_failed(exit_code=143)})  # killed by the suspension
    await cluster.delete("Pod", "rt-trainer-0-0")  # and removed, as the Job controller does
    status = await cluster.until(lambda: _status(cluster)["phase"] == "Pending" and _status(cluster), what="Pending")
    await asyncio.sleep(1)  # several passes of the test operator (every 0.3 s)
    status = _status(cluster)
    assert condition(status, "Ready")["reason"] == "Queued"
    assert "trainer Job rt-trainer-0 suspended by kueue" in status["message"]
    assert _compute(cluster) == {"StatefulSet rt-inference": 0, "Deployment rt-orchestrator": 0, "Job rt-trainer-0": 0}
    assert status["restarts"] == 0 and status["attempt"] == 0
    assert not [e for e in cluster.events() if e["reason"] in ("Resumed", "TrainerRestarted", "Failed")]

    await cluster.patch("Job", "rt-trainer-0", {"spec": {"suspend": False}})
    await cluster.until(lambda: cluster.get("StatefulSet", "rt-inference")["spec"]["replicas"] == 1, what="scaled up")
    await cluster.run_pods(cluster.get("Job", "rt-trainer-0"), 1)  # the same attempt, new pods
    await cluster.until(lambda: _status(cluster)["phase"] == "Running", what="Running")
    assert _compute(cluster) == {"StatefulSet rt-inference": 1, "Deployment rt-orchestrator": 1, "Job rt-trainer-0": 1}
    assert _status(cluster)["restarts"] == 0


async def test_a_queued_run_is_one_kueue_workload_and_starts_only_when_admitted(cluster):
    run = await cluster.create(rlrun(queue={"name": "team-gpus", "priorityClassName": "high"},
                                     activeDeadlineSeconds=3600, inference={"replicas": 2}, envWorkers={"replicas": 3}))
    wl = await cluster.until(lambda: cluster.get("Workload", "rt-workload"), what="Workload")
    (owner,) = wl["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("RLRun", run["metadata"]["uid"], True)
    assert wl["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-gpus"
    assert (wl["spec"]["queueName"], wl["spec"]["priorityClassName"], wl["spec"]["active"]) == ("team-gpus", "high", True)
    counts = {s["name"]: s["count"] for s in wl["spec"]["podSets"]}
    assert counts == {"inference": 2, "orchestrator": 1, "env-worker": 3, "trainer": 1}
    trainer_set = next(s for s in wl["spec"]["podSets"] if s["name"] == "trainer")
    assert trainer_set["template"]["spec"]["containers"][0]["command"][:2] == ["rlkube", "torchrun"]

    # Kueue has not admitted it: nothing runs, the deadline clock has not started.
    await cluster.patch("Workload", "rt-workload", {"status": {"conditions": [
        {"type": "QuotaReserved", "status": "False", "reason": "Pending", "lastTransitionTime": "2026-01-01T00:00:00Z",
         "message": "couldn't assign flavors to pod set trainer: insufficient quota for nvidia.com/gpu"}]}})
    await cluster.until(lambda: "insufficient quota" in _status(cluster)["message"], what="Kueue's message")
    await asyncio.sleep(1)
    status = _status(cluster)
    assert status["phase"] == "Pending" and status["message"].startswith("Queued: Workload rt-workload waits")
    assert condition(status, "Ready")["reason"] == "Queued" and condition(status, "TrainerReady")["reason"] == "Queued"
    assert set(_compute(cluster).values()) == {0} and not status.get("startTime")

    await admit(cluster)
    job = await cluster.until(lambda: cluster.get("Job", "rt-trainer-1"), what="trainer Job of the admitted run")
    assert not job["spec"]["suspend"] and job["spec"]["activeDeadlineSeconds"] == 3600
    await cluster.until(lambda: _compute(cluster) == {"StatefulSet rt-inference": 2, "Deployment rt-orchestrator": 1,
                                                      "Deployment rt-env-worker": 3, "Job rt-trainer-1": 1},
                        what="everything scaled up, the queued Job replaced")
    await cluster.until(lambda: _status(cluster).get("startTime"), what="the clock started")


async def test_eviction_scales_to_zero_without_spending_backoff_and_readmission_resumes(cluster):
    """Evicted (preempted), the run stops and gives the quota back; admitted again, it resumes
    from the latest checkpoint. A user's suspend deactivates the Workload (Kueue then evicts it,
    releasing its quota). Finished, the Workload says so. The chart's Kueue rules grant exactly
    the Workload calls this life makes."""
    await cluster.create(rlrun(queue={"name": "team-gpus"}, restartPolicy={"backoffLimit": 0}))
    await cluster.until(lambda: cluster.get("Workload", "rt-workload"), what="Workload")
    await admit(cluster)
    await start_everything(cluster, attempt=1)

    # Kueue preempts the run: Evicted, quota still held until the run has stopped.
    await cluster.patch("Workload", "rt-workload", {"status": {"conditions": _kueue_conditions(
        "QuotaReserved", "Admitted", "Evicted")}})
    await cluster.patch("Pod", "rt-trainer-1-0", {"status": pod_disrupted()})
    wl = await cluster.until(lambda: not cluster.get("Workload", "rt-workload")["status"].get("admission")
                             and cluster.get("Workload", "rt-workload"), what="quota released")
    assert condition(wl["status"], "QuotaReserved")["status"] == "False"
    status = await cluster.until(lambda: _status(cluster)["phase"] == "Pending" and _status(cluster), what="Pending")
    assert condition(status, "Ready")["reason"] == "Queued"
    assert set(_compute(cluster).values()) == {0} and status["restarts"] == 0
    assert not [e for e in cluster.events() if e["reason"] in ("TrainerRestarted", "TrainerDisrupted", "Failed")]

    await admit(cluster)
    await run_trainer(cluster, 2)
    trainer = tomllib.loads(cluster.get("ConfigMap", "rt-config")["data"]["trainer.toml"])
    assert trainer["ckpt"]["resume_step"] == "latest" and _status(cluster)["restarts"] == 0

    await cluster.patch("RLRun", "rt", {"spec": {"suspend": True}})
    await cluster.until(lambda: cluster.get("Workload", "rt-workload")["spec"]["active"] is False, what="inactive")
    await cluster.until(lambda: _status(cluster)["phase"] == "Suspended", what="Suspended")
    await cluster.patch("RLRun", "rt", {"spec": {"suspend": False}})
    await cluster.until(lambda: cluster.get("Workload", "rt-workload")["spec"]["active"] is True, what="active")
    await run_trainer(cluster, 3)

    # Done: the Workload is Finished, so Kueue gives its quota to the next in line.
    await cluster.patch("Job", "rt-trainer-3", {"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
    wl = await cluster.until(lambda: [c for c in cluster.get("Workload", "rt-workload")["status"]["conditions"]
                                      if c["type"] == "Finished"] and cluster.get("Workload", "rt-workload"))
    finished = condition(wl["status"], "Finished")
    assert (finished["status"], finished["reason"]) == ("True", "Succeeded")

    kueue = {g for g in operator_requests(cluster) if g[0] == "kueue.x-k8s.io"}
    assert kueue == _kueue_grants(VALUES["kueue"]) - {RESIZE_GRANT}
    assert _kueue_grants(VALUES["default"]) == set()


RESIZE_GRANT = ("kueue.x-k8s.io", "workloads", "delete")
"""The one Workload call a run's life makes only when it is resized while suspended."""


def _pod_set_counts(cluster) -> dict[str, int]:
    return {s["name"]: s["count"] for s in cluster.get("Workload", "rt-workload")["spec"]["podSets"]}


def test_a_workload_is_resized_only_when_what_kueue_counts_changed():
    """The same template as Kueue may store it (a request defaulted to its limit, a quantity in
    another form) is no change; another count or resource is."""
    def workload(count: int, resources: dict) -> dict:
        template = {"spec": {"containers": [{"name": "main", "image": "x", "resources": resources}]}}
        return {"spec": {"podSets": [{"name": "teacher", "count": count, "template": template}]}}

    shape = queueing.quota_shape(workload(2, {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "2"}}))
    kueue_stored = {"limits": {"nvidia.com/gpu": 1}, "requests": {"cpu": "2000m", "nvidia.com/gpu": "1"}}
    assert queueing.quota_shape(workload(2, kueue_stored)) == shape
    assert queueing.quota_shape(workload(3, kueue_stored)) != shape
    assert queueing.quota_shape(workload(2, kueue_stored | {"requests": {"cpu": "3"}})) != shape


async def test_a_run_resized_while_suspended_gets_a_workload_of_its_new_size(cluster):
    """A suspended queued run that adds a teacher and more inference replicas: its Workload
    (podSets are immutable) is deleted and made anew with the new podSets, so Kueue counts the
    teacher's pods; resumed, the run queues at that size. The chart grants the delete."""
    await cluster.create(rlrun(queue={"name": "team-gpus"}, suspend=True))
    old = await cluster.until(lambda: cluster.get("Workload", "rt-workload"), what="Workload")
    assert _pod_set_counts(cluster) == {"inference": 1, "orchestrator": 1, "trainer": 1}

    await cluster.patch("RLRun", "rt", {"spec": {"teacher": TEACHER, "inference": {"replicas": 2}}})
    new = await cluster.until(lambda: cluster.get("Workload", "rt-workload")["metadata"]["uid"] != old["metadata"]["uid"]
                              and cluster.get("Workload", "rt-workload"), what="a new Workload")
    assert _pod_set_counts(cluster) == {"inference": 2, "orchestrator": 1, "teacher": 2, "trainer": 1}
    assert new["spec"]["active"] is False
    (teacher,) = next(s for s in new["spec"]["podSets"] if s["name"] == "teacher")["template"]["spec"]["containers"]
    assert teacher["resources"]["requests"] == TEACHER["resources"]["requests"]

    await cluster.patch("RLRun", "rt", {"spec": {"suspend": False}})
    await cluster.until(lambda: cluster.get("Workload", "rt-workload")["spec"]["active"] is True, what="queued")
    assert cluster.get("Workload", "rt-workload")["metadata"]["uid"] == new["metadata"]["uid"]
    assert RESIZE_GRANT in operator_requests(cluster) <= _granted(VALUES["kueue"])


async def test_a_workload_holding_quota_is_not_replaced_until_kueue_releases_it(cluster):
    """Resized while Kueue still holds the old size's quota (suspended, not yet evicted): the
    Workload stays, inactive even when the run is resumed at once (which then says why it
    waits); evicted, the run gives the quota back and only then is the Workload made anew,
    without the dropped teacher."""
    await cluster.create(rlrun(queue={"name": "team-gpus"}, teacher=TEACHER))
    old = await cluster.until(lambda: cluster.get("Workload", "rt-workload"), what="Workload")
    await admit(cluster)
    await cluster.until(lambda: cluster.get("Job", "rt-trainer-1"), what="the admitted run's trainer Job")

    await cluster.patch("RLRun", "rt", {"spec": {"suspend": True}})
    await cluster.patch("RLRun", "rt", {"spec": {"teacher": None}})  # the CRD allows it once suspended
    await cluster.until(lambda: cluster.get("Workload", "rt-workload")["spec"]["active"] is False, what="inactive")
    await asyncio.sleep(1)  # several passes of the test operator
    wl = cluster.get("Workload", "rt-workload")
    assert wl["metadata"]["uid"] == old["metadata"]["uid"] and "teacher" in _pod_set_counts(cluster)
    assert wl["status"]["admission"] == ADMISSION
    await cluster.patch("RLRun", "rt", {"spec": {"suspend": False}})
    status = await cluster.until(lambda: "former size" in _status(cluster)["message"] and _status(cluster),
                                 what="the run waiting for the quota")
    assert status["message"] == ("Queued: Workload rt-workload still holds quota for the run's former size "
                                 "(inference×1, orchestrator×1, teacher×2, trainer×1); it is recreated for the "
                                 "new size once Kueue releases it")
    assert cluster.get("Workload", "rt-workload")["spec"]["active"] is False

    await cluster.patch("Workload", "rt-workload", {"status": {"conditions": _kueue_conditions(
        "QuotaReserved", "Admitted", "Evicted")}})  # Kueue evicts the inactive Workload
    await cluster.until(lambda: cluster.get("Workload", "rt-workload")["metadata"]["uid"] != old["metadata"]["uid"],
                        what="a new Workload once the quota is released")
    assert _pod_set_counts(cluster) == {"inference": 1, "orchestrator": 1, "trainer": 1}
    assert cluster.get("Workload", "rt-workload")["spec"]["active"] is True


async def run_trainer(cluster, attempt: int) -> None:
    """Start the trainer pods of `attempt` (kmock never removed the other components' pods)."""
    job = await cluster.until(lambda: cluster.get("Job", f"rt-trainer-{attempt}"), what="a fresh trainer Job")
    await cluster.run_pods(job, 1)
    await cluster.until(lambda: _status(cluster)["phase"] == "Running", what="Running again")


@pytest.mark.parametrize(("scheduler", "kind", "where", "key"), [
    ("volcano", "volcano PodGroup", "annotations", "scheduling.k8s.io/group-name"),
    ("scheduler-plugins-scheduler", "coscheduling PodGroup", "labels", "scheduling.x-k8s.io/pod-group"),
], ids=["volcano", "coscheduling"])
async def test_a_gang_scheduler_gets_one_pod_group_of_the_pods_it_places(cluster, scheduler, kind, where, key):
    """`minMember` counts every pod the gang scheduler places (the orchestrator here opts out to
    the default scheduler), each of those pods names the group, and the group keeps its size."""
    run = await cluster.create(rlrun(scheduling={"schedulerName": scheduler}, inference={"replicas": 2},
                                     envWorkers={"replicas": 3},
                                     orchestrator={"pod": {"schedulerName": "default-scheduler"}}))
    group = await cluster.until(lambda: cluster.get(kind, "rt-pod-group"), what="PodGroup")
    assert group["metadata"]["ownerReferences"][0]["uid"] == run["metadata"]["uid"]
    assert group["spec"]["minMember"] == 2 + 3 + 1
    await cluster.until(lambda: cluster.get("Job", "rt-trainer-0"), what="trainer Job")
    templates = {name: cluster.get(k, name)["spec"]["template"]["metadata"] for k, name in (
        ("StatefulSet", "rt-inference"), ("Deployment", "rt-env-worker"), ("Job", "rt-trainer-0"),
        ("Deployment", "rt-orchestrator"))}
    assert {name: meta.get(where, {}).get(key) for name, meta in templates.items()} == {
        "rt-inference": "rt-pod-group", "rt-env-worker": "rt-pod-group", "rt-trainer-0": "rt-pod-group",
        "rt-orchestrator": None}

    await cluster.patch(kind, "rt-pod-group", {"spec": {"minMember": 1}})
    await cluster.until(lambda: cluster.get(kind, "rt-pod-group")["spec"]["minMember"] == 6, what="size restored")
    group_api = group["apiVersion"].split("/")[0]
    assert {g for g in operator_requests(cluster) if g[0] == group_api} == {
        g for g in _granted(VALUES["gang-scheduling"]) if g[0] == group_api}
    assert not {g for g in _granted(VALUES["default"]) if g[1] == "podgroups"}


def test_the_teacher_is_a_podset_of_the_workload_and_a_member_of_the_gang():
    """Kueue admits the teacher's pods with the rest (its own podSet, with its template), and
    the gang scheduler waits for them too, unless the teacher opts out of it."""
    run = RunRef("RLRun", "rt", "team-a", "uid-1")
    teacher = TEACHER | {"replicas": 3, "gpusPerReplica": 2}
    spec = RLRunSpec.model_validate(rlrun(queue={"name": "team-gpus"}, inference={"replicas": 2}, teacher=teacher,
                                          scheduling={"schedulerName": "volcano"})["spec"])
    trainer = builders.build_trainer_job(run, spec, module="m", config_file="trainer.toml", attempt=0, restarts=0,
                                         suspend=True)
    pod_sets = {s["name"]: s for s in queueing.build_workload(run, spec, trainer)["spec"]["podSets"]}
    assert {name: s["count"] for name, s in pod_sets.items()} == {
        "inference": 2, "orchestrator": 1, "teacher": 3, "trainer": 1}
    (main,) = pod_sets["teacher"]["template"]["spec"]["containers"]
    assert main["command"][-1] == "/etc/rlkube/teacher.toml" and main["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert queueing.build_pod_group(run, spec)["spec"]["minMember"] == 2 + 1 + 3 + 1

    default_scheduled = teacher | {"pod": {"schedulerName": "default-scheduler"}}
    spec = spec.model_copy(update={"teacher": TeacherSpec.model_validate(default_scheduled)})
    assert queueing.build_pod_group(run, spec)["spec"]["minMember"] == 2 + 1 + 1


ZONES = {"a": {"nodeLabels": {"topology.kubernetes.io/zone": "a", "gpu.example.com/model": "h100"}},
         "b": {"nodeLabels": {"topology.kubernetes.io/zone": "b", "gpu.example.com/model": "h200"},
               "nodeTaints": [{"key": "gpu.example.com/reserved", "value": "b", "effect": "NoSchedule"}],
               "tolerations": [{"key": "gpu.example.com/reserved", "operator": "Equal", "value": "b",
                                "effect": "NoSchedule"}]}}
USER_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def _scheduling(cluster) -> dict[str, tuple[dict, list]]:
    """nodeSelector and tolerations of each workload's pod template."""
    out = {}
    for kind in ("StatefulSet", "Deployment", "Job"):
        for name in cluster.names(kind):
            pod = cluster.get(kind, name)["spec"]["template"]["spec"]
            out[name] = (pod.get("nodeSelector") or {}, pod.get("tolerations") or [])
    return out


async def test_the_pods_land_on_the_flavours_kueue_assigned_and_get_the_users_scheduling_back(cluster):
    """A ClusterQueue with two flavours (zone a: H100s; zone b: H200s behind a taint). Kueue
    admits the GPU podSets on b and the orchestrator on a: each component's pods get its
    flavour's node labels over the user's nodeSelector and its tolerations after the user's.
    Evicted, the templates are the user's again (zone b's labels and toleration gone); admitted
    again on a, the new trainer Job and the servers go to a."""
    for name, spec in ZONES.items():
        await flavor(cluster, name, **spec)
    user = {"nodeSelector": {"pool": "gpu"}, "tolerations": [USER_TOLERATION]}
    await cluster.create(rlrun(queue={"name": "team-gpus"}, scheduling=user))
    await cluster.until(lambda: cluster.get("Workload", "rt-workload"), what="Workload")
    await cluster.until(lambda: cluster.get("Job", "rt-trainer-0"), what="the queued trainer Job")

    on = {"inference": "b", "trainer": "b", "orchestrator": "a"}
    await admit(cluster, {"clusterQueue": "gpus", "podSetAssignments": [
        {"name": pod_set, "flavors": {"nvidia.com/gpu" if zone == "b" else "cpu": zone}, "count": 1}
        for pod_set, zone in on.items()]})
    await cluster.until(lambda: cluster.get("Job", "rt-trainer-1") and not cluster.get("Job", "rt-trainer-1")["spec"]["suspend"]
                        and not cluster.get("Job", "rt-trainer-0"), what="the admitted run's trainer Job running alone")
    b = ({"pool": "gpu"} | ZONES["b"]["nodeLabels"], [USER_TOLERATION, *ZONES["b"]["tolerations"]])
    assert _scheduling(cluster) == {"rt-inference": b, "rt-trainer-1": b, "rt-orchestrator": (ZONES["a"]["nodeLabels"], [])}
    record = cluster.get("Workload", "rt-workload")["metadata"]["annotations"][queueing.PLACEMENT_ANNOTATION]
    assert json.loads(record)["flavors"] == {"inference": ["b"], "trainer": ["b"], "orchestrator": ["a"]}

    # Evicted: everything at zero, with the user's scheduling (the Job: its next attempt's).
    await cluster.patch("Workload", "rt-workload", {"status": {"conditions": _kueue_conditions(
        "QuotaReserved", "Admitted", "Evicted")}})
    await cluster.until(lambda: not cluster.get("Workload", "rt-workload")["status"].get("admission"), what="released")
    restored = await cluster.until(lambda: _scheduling(cluster)["rt-inference"] == (user["nodeSelector"], [USER_TOLERATION])
                                   and _scheduling(cluster), what="the user's scheduling back")
    assert restored["rt-orchestrator"] == ({}, [])
    assert set(_compute(cluster).values()) == {0}

    await admit(cluster, {"clusterQueue": "gpus", "podSetAssignments": [
        {"name": pod_set, "flavors": {"nvidia.com/gpu": "a"}, "count": 1} for pod_set in ("inference", "trainer")]})
    job = await cluster.until(lambda: cluster.get("Job", "rt-trainer-2"), what="the re-admitted run's trainer Job")
    a = ({"pool": "gpu"} | ZONES["a"]["nodeLabels"], [USER_TOLERATION])
    assert (job["spec"]["template"]["spec"]["nodeSelector"], job["spec"]["template"]["spec"]["tolerations"]) == a
    await cluster.until(lambda: _scheduling(cluster)["rt-inference"] == a, what="inference on zone a")
    assert _scheduling(cluster)["rt-orchestrator"] == ({}, [])  # no flavour assigned to it this time


async def test_a_flavour_that_does_not_exist_keeps_the_run_queued(cluster):
    await cluster.create(rlrun(queue={"name": "team-gpus"}))
    await cluster.until(lambda: cluster.get("Workload", "rt-workload"), what="Workload")
    await cluster.patch("Workload", "rt-workload", {"status": {
        "admission": ADMISSION, "conditions": _kueue_conditions("QuotaReserved", "Admitted", false=("Evicted",))}})
    status = await cluster.until(lambda: "does not exist" in _status(cluster)["message"] and _status(cluster),
                                 what="the run saying why it waits")
    assert status["message"] == ("Queued: Workload rt-workload is admitted on ResourceFlavor h100, which does not "
                                 "exist: its pods would not land where Kueue counted them")
    assert set(_compute(cluster).values()) == {0}


async def test_the_queue_name_label_picks_the_local_queue(cluster):
    """Kueue's way of naming a job's LocalQueue works on a run too; a label contradicting
    `spec.queue` is refused, naming both."""
    run = rlrun()
    run["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-gpus"}
    await cluster.create(run)
    wl = await cluster.until(lambda: cluster.get("Workload", "rt-workload"), what="Workload")
    assert wl["spec"]["queueName"] == "team-gpus"
    await cluster.until(lambda: _status(cluster).get("message", "").startswith("Queued"), what="queued")

    run = rlrun("other", queue={"name": "team-cpus"})
    run["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-gpus"}
    await cluster.create(run)
    status = await cluster.until(lambda: cluster.status("RLRun", "other").get("phase") == "Failed"
                                 and cluster.status("RLRun", "other"), what="refused")
    assert "spec.queue.name is 'team-cpus' but the label kueue.x-k8s.io/queue-name is 'team-gpus'" in status["message"]
