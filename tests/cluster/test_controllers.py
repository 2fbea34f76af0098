"""The local cluster's controllers (a separate process) with the test playing the kubelet."""

INDEX = "batch.kubernetes.io/job-completion-index"
CONTAINER = {"name": "main", "image": "x", "command": ["true"]}


def job(name: str, **spec) -> dict:
    template = {"metadata": {"labels": {"app": name}},
                "spec": {"restartPolicy": "Never", "containers": [CONTAINER], "subdomain": name}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"template": template, **spec}}


def pods_of(api, ns: str, selector: str, live: bool = True) -> list[dict]:
    pods = api.items(f"/api/v1/namespaces/{ns}/pods", labelSelector=selector)
    return [p for p in pods if not live or (p["status"].get("phase") not in ("Succeeded", "Failed")
                                            and not p["metadata"].get("deletionTimestamp"))]


def job_status(api, ns: str, name: str) -> dict:
    return (api.get(f"/apis/batch/v1/namespaces/{ns}/jobs/{name}") or {}).get("status") or {}


def condition(status: dict, kind: str) -> dict | None:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind and c["status"] == "True"), None)


def test_indexed_job_pods_carry_their_index_and_complete_the_job(local_api, ns):
    local_api.create(f"/apis/batch/v1/namespaces/{ns}/jobs",
                     job("train", completionMode="Indexed", completions=2, parallelism=2, backoffLimit=0))
    pods = local_api.until(lambda: len(p := pods_of(local_api, ns, "job-name=train")) == 2 and p, "two pods")
    by_index = {p["metadata"]["labels"][INDEX]: p for p in pods}
    assert sorted(by_index) == ["0", "1"]
    for index, pod in by_index.items():
        assert pod["metadata"]["annotations"][INDEX] == index
        assert pod["spec"]["hostname"] == f"train-{index}" and pod["spec"]["subdomain"] == "train"
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "Job"
    local_api.set_pod_status(ns, by_index["1"]["metadata"]["name"], "Succeeded", exit_code=0)
    assert local_api.until(lambda: job_status(local_api, ns, "train").get("completedIndexes") == "1", "index 1 done")
    assert not condition(job_status(local_api, ns, "train"), "Complete")
    local_api.set_pod_status(ns, by_index["0"]["metadata"]["name"], "Succeeded", exit_code=0)
    status = local_api.until(lambda: condition(s := job_status(local_api, ns, "train"), "Complete") and s, "Complete")
    assert status["succeeded"] == 2 and status["completedIndexes"] == "0-1" and status["failed"] == 0


def test_backoff_limit_fails_the_job(local_api, ns):
    local_api.create(f"/apis/batch/v1/namespaces/{ns}/jobs", job("flaky", backoffLimit=1))
    for attempt in range(2):
        (pod,) = local_api.until(lambda: pods_of(local_api, ns, "job-name=flaky"), f"pod of attempt {attempt}")
        assert not condition(job_status(local_api, ns, "flaky"), "Failed")
        local_api.set_pod_status(ns, pod["metadata"]["name"], "Failed", exit_code=1)
    status = local_api.until(lambda: condition(s := job_status(local_api, ns, "flaky"), "Failed") and s, "Failed")
    assert condition(status, "Failed")["reason"] == "BackoffLimitExceeded"
    assert status["failed"] == 2 and status["active"] == 0
    assert not pods_of(local_api, ns, "job-name=flaky")


def test_pod_failure_policy_ignores_disruptions_and_fails_on_exit_codes(local_api, ns):
    policy = {"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
        {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}},
    ]}
    local_api.create(f"/apis/batch/v1/namespaces/{ns}/jobs", job("pfp", backoffLimit=0, podFailurePolicy=policy))
    (first,) = local_api.until(lambda: pods_of(local_api, ns, "job-name=pfp"), "the first pod")
    local_api.set_pod_status(ns, first["metadata"]["name"], "Failed", exit_code=137,
                             conditions=({"type": "DisruptionTarget", "status": "True"},))
    (second,) = local_api.until(lambda: pods_of(local_api, ns, "job-name=pfp"), "a replacement pod")
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    status = job_status(local_api, ns, "pfp")
    assert status.get("failed", 0) == 0 and not condition(status, "Failed"), "a disruption is not a failure"
    local_api.set_pod_status(ns, second["metadata"]["name"], "Failed", exit_code=42)
    status = local_api.until(lambda: condition(s := job_status(local_api, ns, "pfp"), "Failed") and s, "Failed")
    assert condition(status, "Failed")["reason"] == "PodFailurePolicy"
    assert condition(status, "Failed")["message"] == (
        f"Container main for pod {ns}/{second['metadata']['name']} failed with exit code 42 matching FailJob rule at index 1")


def test_suspend_deletes_pods_without_failing_and_resume_recreates_them(local_api, ns):
    path = f"/apis/batch/v1/namespaces/{ns}/jobs/gang"
    local_api.create(f"/apis/batch/v1/namespaces/{ns}/jobs", job("gang", completionMode="Indexed", completions=2,
                                                                 parallelism=2, backoffLimit=0))
    before = local_api.until(lambda: len(p := pods_of(local_api, ns, "job-name=gang")) == 2 and p, "two pods")
    local_api.patch(path, {"spec": {"suspend": True}})
    status = local_api.until(lambda: condition(s := job_status(local_api, ns, "gang"), "Suspended") and s,
                             "Suspended")
    assert not pods_of(local_api, ns, "job-name=gang", live=False)
    assert status.get("failed", 0) == 0 and status["active"] == 0 and not condition(status, "Failed")
    local_api.patch(path, {"spec": {"suspend": False}})
    after = local_api.until(lambda: len(p := pods_of(local_api, ns, "job-name=gang")) == 2 and p, "pods again")
    assert {p["metadata"]["uid"] for p in after}.isdisjoint(p["metadata"]["uid"] for p in before)
    suspended = next(c for c in job_status(local_api, ns, "gang")["conditions"] if c["type"] == "Suspended")
    assert (suspended["status"], suspended["reason"]) == ("False", "JobResumed")


def test_statefulset_recreates_a_deleted_pod_scales_and_reports_readiness(local_api, ns):
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "inf"},
           "spec": {"replicas": 2, "serviceName": "inf", "podManagementPolicy": "Parallel",
                    "selector": {"matchLabels": {"app": "inf"}},
                    "template": {"metadata": {"labels": {"app": "inf"}}, "spec": {"containers": [CONTAINER]}}}}
    path = f"/apis/apps/v1/namespaces/{ns}/statefulsets/inf"
    local_api.create(f"/apis/apps/v1/namespaces/{ns}/statefulsets", sts)
    pods = local_api.until(lambda: len(p := pods_of(local_api, ns, "app=inf")) == 2 and p, "two pods")
    assert [p["metadata"]["name"] for p in pods] == ["inf-0", "inf-1"]
    assert pods[1]["spec"]["hostname"] == "inf-1" and pods[1]["spec"]["subdomain"] == "inf"
    assert pods[1]["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"] == "inf-1"
    assert pods[1]["metadata"]["labels"]["apps.kubernetes.io/pod-index"] == "1"
    for pod in pods:
        local_api.set_pod_status(ns, pod["metadata"]["name"], "Running", ready=True)
    local_api.until(lambda: (local_api.get(path)["status"].get("readyReplicas") == 2), "readyReplicas 2")

    local_api.delete(f"/api/v1/namespaces/{ns}/pods/inf-0")
    local_api.until(lambda: (p := local_api.get(f"/api/v1/namespaces/{ns}/pods/inf-0"))
                    and p["metadata"]["uid"] != pods[0]["metadata"]["uid"], "inf-0 made again")
    local_api.patch(path, {"spec": {"replicas": 1}})
    local_api.until(lambda: [p["metadata"]["name"] for p in pods_of(local_api, ns, "app=inf")] == ["inf-0"],
                    "scaled down to inf-0")


def test_deployment_replaces_pods_on_a_template_change(local_api, ns):
    deploy = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "orch"},
              "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": {"app": "orch"}},
                       "template": {"metadata": {"labels": {"app": "orch"}}, "spec": {"containers": [CONTAINER]}}}}
    local_api.create(f"/apis/apps/v1/namespaces/{ns}/deployments", deploy)
    (old,) = local_api.until(lambda: pods_of(local_api, ns, "app=orch"), "a pod")
    assert old["metadata"]["name"].startswith("orch-")
    local_api.patch(f"/apis/apps/v1/namespaces/{ns}/deployments/orch",
                    {"spec": {"template": {"metadata": {"annotations": {"restart": "1"}}}}})
    (new,) = local_api.until(lambda: [p for p in pods_of(local_api, ns, "app=orch")
                                      if p["metadata"]["uid"] != old["metadata"]["uid"]], "a new pod")
    assert new["metadata"]["annotations"]["restart"] == "1"
    assert local_api.get(f"/api/v1/namespaces/{ns}/pods/{old['metadata']['name']}") is None


def test_garbage_collection_background_foreground_and_orphan(local_api, ns):
    jobs = f"/apis/batch/v1/namespaces/{ns}/jobs"
    for name in ("bg", "fg", "orphan"):
        local_api.create(jobs, job(name, parallelism=1))
    pods = {name: local_api.until(lambda n=name: pods_of(local_api, ns, f"job-name={n}"), f"{name}'s pod")[0]
            for name in ("bg", "fg", "orphan")}
    # The foreground job's pod runs on a node: its deletion waits for the kubelet.
    fg_pod = f"/api/v1/namespaces/{ns}/pods/{pods['fg']['metadata']['name']}"
    local_api.patch(fg_pod, {"spec": {"nodeName": "local"}})

    local_api.delete(f"{jobs}/bg", propagationPolicy="Background")
    assert local_api.get(f"{jobs}/bg") is None
    local_api.until(lambda: not pods_of(local_api, ns, "job-name=bg", live=False), "bg's pod collected")

    local_api.delete(f"{jobs}/fg", propagationPolicy="Foreground")
    held = local_api.get(f"{jobs}/fg")
    assert "foregroundDeletion" in held["metadata"]["finalizers"] and held["metadata"]["deletionTimestamp"]
    local_api.until(lambda: (local_api.get(fg_pod) or {}).get("metadata", {}).get("deletionTimestamp"),
                    "fg's pod terminating")
    assert local_api.get(f"{jobs}/fg") is not None, "the owner waits for its terminating pod"
    local_api.delete(fg_pod, gracePeriodSeconds=0)  # the kubelet's last word
    local_api.until(lambda: local_api.get(f"{jobs}/fg") is None, "fg gone after its pod")

    local_api.delete(f"{jobs}/orphan", propagationPolicy="Orphan")
    local_api.until(lambda: local_api.get(f"{jobs}/orphan") is None, "orphan's job gone")
    pod = local_api.get(f"/api/v1/namespaces/{ns}/pods/{pods['orphan']['metadata']['name']}")
    assert pod is not None and not pod["metadata"].get("ownerReferences")
