"""The local API server as kubectl, kopf and the Python client see it."""

import json
import threading
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from e2e.localcluster.apiserver import ApiServer

REPO = Path(__file__).resolve().parents[2]
RLRUN = REPO / "examples" / "reverse_text" / "rlrun.yaml"


def rlrun_path(ns: str, name: str = "") -> str:
    return f"/apis/rlkube.dev/v1alpha1/namespaces/{ns}/rlruns" + (f"/{name}" if name else "")


def rlrun(name: str, **fields) -> dict:
    run = yaml.safe_load(RLRUN.read_text())
    run["metadata"]["name"] = name
    return run | fields


def test_kubectl_apply_get_describe_delete_an_rlrun(local_api, ns):
    out = local_api.kubectl("apply", "-n", ns, "-f", str(RLRUN))
    assert "rlrun.rlkube.dev/reverse-text created" in out
    header = local_api.kubectl("get", "rlruns", "-n", ns).splitlines()[0].split()
    assert header == ["NAME", "PHASE", "STEP", "REWARD", "EVAL", "INFERENCE", "RESTARTS", "AGE"]

    local_api.patch(rlrun_path(ns, "reverse-text") + "/status",
                    {"status": {"phase": "Running", "step": 7, "reward": 0.625, "restarts": 1}})
    row = local_api.kubectl("get", "rlr", "reverse-text", "-n", ns, "--no-headers").split()
    assert row[:6] == ["reverse-text", "Running", "7", "0.625", "<none>", "<none>"]  # no eval yet, no inference
    assert "Phase:" in local_api.kubectl("describe", "rlrun", "reverse-text", "-n", ns)
    listed = local_api.request("GET", rlrun_path(ns))
    assert (listed["kind"], listed["apiVersion"]) == ("RLRunList", "rlkube.dev/v1alpha1")

    # A second apply patches: the spec change bumps the generation, the status stays.
    run = yaml.safe_load(RLRUN.read_text())
    run["spec"]["suspend"] = True
    assert "configured" in local_api.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(run))
    stored = local_api.get(rlrun_path(ns, "reverse-text"))
    assert stored["spec"]["suspend"] is True
    assert stored["metadata"]["generation"] == 2
    assert stored["status"]["step"] == 7

    local_api.kubectl("delete", "rlrun", "reverse-text", "-n", ns)
    assert local_api.get(rlrun_path(ns, "reverse-text")) is None
    assert "NotFound" in local_api.kubectl("get", "rlrun", "reverse-text", "-n", ns, check=False)


def test_kubectl_scale_an_rlrun_through_its_scale_subresource(local_api, ns):
    """`kubectl scale` reads the run's scale subresource from discovery and writes its
    `autoscaling/v1` Scale: the spec's inference replicas change (a spec change: generation
    bumped), the status's stay the operator's; a precondition that does not hold is refused."""
    local_api.create(rlrun_path(ns), rlrun("s"))
    inference = {"replicas": 1, "readyReplicas": 1, "ready": "1/1", "selector": "rlkube.dev/run=s"}
    local_api.patch(rlrun_path(ns, "s") + "/status", {"status": {"phase": "Running", "inference": inference}})
    assert "rlrun.rlkube.dev/s scaled" in local_api.kubectl("scale", "-n", ns, "rlrun/s", "--replicas=3")
    stored = local_api.get(rlrun_path(ns, "s"))
    assert stored["spec"]["inference"]["replicas"] == 3 and stored["metadata"]["generation"] == 2
    assert stored["status"]["inference"] == inference
    scale = local_api.get(rlrun_path(ns, "s") + "/scale")
    assert (scale["kind"], scale["apiVersion"], scale["spec"], scale["status"]) == (
        "Scale", "autoscaling/v1", {"replicas": 3}, {"replicas": 1, "selector": "rlkube.dev/run=s"})
    refused = local_api.kubectl("scale", "-n", ns, "rlrun/s", "--current-replicas=2", "--replicas=1", check=False)
    assert "Expected replicas to be 2, was 3" in refused
    stale = scale | {"metadata": scale["metadata"] | {"resourceVersion": "1"}, "spec": {"replicas": 1}}
    local_api.request("PUT", rlrun_path(ns, "s") + "/scale", stale, ok=(409,))
    assert local_api.kubectl("get", "rlrun", "s", "-n", ns, "--no-headers").split()[5] == "1/1"  # INFERENCE, after EVAL


def test_status_subresource_generation_and_conflicts(local_api, ns):
    cm = local_api.create(f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"generateName": "c-"}, "data": {}})
    assert cm["metadata"]["name"].startswith("c-") and cm["metadata"]["uid"]
    run = local_api.create(rlrun_path(ns), rlrun("r", status={"phase": "Succeeded"}))
    assert run["status"] == {}, "status is not set through the object"
    patched = local_api.patch(rlrun_path(ns, "r"), {"spec": {"suspend": True}, "status": {"phase": "Failed"}})
    assert patched["metadata"]["generation"] == 2 and patched["status"] == {}
    labelled = local_api.patch(rlrun_path(ns, "r"), {"metadata": {"labels": {"a": "b"}}})
    assert labelled["metadata"]["generation"] == 2
    status = local_api.patch(rlrun_path(ns, "r") + "/status", {"spec": {"suspend": False}, "status": {"phase": "Running"}})
    assert status["status"] == {"phase": "Running"} and status["spec"]["suspend"] is True
    unchanged = local_api.patch(rlrun_path(ns, "r") + "/status", {"status": {"phase": "Running"}})
    assert unchanged["metadata"]["resourceVersion"] == status["metadata"]["resourceVersion"]
    stale = {"metadata": {"resourceVersion": run["metadata"]["resourceVersion"]}, "spec": {"suspend": False}}
    refused = local_api.request("PATCH", rlrun_path(ns, "r"), stale, ok=(409,))
    assert refused["reason"] == "Conflict"
    local_api.request("POST", "/api/v1/namespaces/nowhere/configmaps", {"metadata": {"name": "x"}}, ok=(404,))


def test_cel_rules_of_the_crd_are_enforced(local_api, ns):
    too_long = yaml.safe_dump(rlrun("r" * 41))
    out = local_api.kubectl("apply", "-n", ns, "-f", "-", input=too_long, check=False)
    assert "metadata.name must be at most 40 characters" in out
    local_api.create(rlrun_path(ns), rlrun("r"))
    refused = local_api.request("PATCH", rlrun_path(ns, "r"), {"spec": {"config": {"inference": {"replicas": 3}}}}, ok=(422,))
    assert "config.inference.replicas must equal inference.replicas" in refused["message"]


def test_transition_rules_of_the_crd_are_enforced_on_updates(local_api, ns):
    """The CRD's `oldSelf` rules: a started run's image and storage cannot change, its suspend can."""
    local_api.create(rlrun_path(ns), rlrun("r"))
    refused = local_api.request("PATCH", rlrun_path(ns, "r"), {"spec": {"image": "other:1"}}, ok=(422,))
    assert "spec.image: spec.image cannot change once the run is created" in refused["message"]
    claim = {"spec": {"storage": {"pvc": {"claimName": "elsewhere"}}}}
    assert "spec.storage cannot change" in local_api.request("PATCH", rlrun_path(ns, "r"), claim, ok=(422,))["message"]
    out = local_api.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(rlrun("r") | {"spec": {
        **rlrun("r")["spec"], "image": "other:1"}}), check=False)
    assert "spec.image cannot change" in out, out
    assert local_api.patch(rlrun_path(ns, "r"), {"spec": {"suspend": True}})["spec"]["suspend"] is True


def _job(name: str, **spec) -> dict:
    template = {"metadata": {"labels": {"app": name}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "x"}]}}
    return {"metadata": {"name": name}, "spec": {"template": template, **spec}}


def test_immutable_fields_of_built_in_kinds_are_refused(local_api, ns):
    """As kube-apiserver's validation: what the operator may patch, and what it may not."""
    jobs = f"/apis/batch/v1/namespaces/{ns}/jobs"
    local_api.create(jobs, _job("running"))
    image = {"spec": {"template": {"spec": {"containers": [{"name": "main", "image": "y"}]}}}}
    refused = local_api.request("PATCH", f"{jobs}/running", image, content_type="application/strategic-merge-patch+json",
                                ok=(422,))["message"]
    assert refused.startswith('Job.batch "running" is invalid: spec.template: field is immutable'), refused
    assert local_api.patch(f"{jobs}/running", {"spec": {"suspend": True, "activeDeadlineSeconds": 9}})["spec"]["suspend"]
    # A suspended Job that never started takes scheduling directives (Kueue's flavours), only those.
    local_api.create(jobs, _job("queued", suspend=True))
    flavour = {"spec": {"template": {"spec": {"nodeSelector": {"pool": "a"}, "tolerations": [{"key": "a"}]}}}}
    assert local_api.patch(f"{jobs}/queued", flavour)["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "a"}
    local_api.request("PATCH", f"{jobs}/queued", {"spec": {"template": {"spec": {"restartPolicy": "OnFailure"}}}},
                      ok=(422,))

    sets = f"/apis/apps/v1/namespaces/{ns}/statefulsets"
    sts = {"metadata": {"name": "s"}, "spec": {"serviceName": "s", "replicas": 1, "selector": {"matchLabels": {"a": "s"}},
                                               "template": {"metadata": {"labels": {"a": "s"}}, "spec": {}}}}
    local_api.create(sets, sts)
    assert local_api.patch(f"{sets}/s", {"spec": {"replicas": 0}})["spec"]["replicas"] == 0
    refused = local_api.request("PATCH", f"{sets}/s", {"spec": {"serviceName": "t"}}, ok=(422,))["message"]
    assert "updates to statefulset spec for fields other than" in refused
    deployments = f"/apis/apps/v1/namespaces/{ns}/deployments"
    local_api.create(deployments, sts | {"spec": {k: v for k, v in sts["spec"].items() if k != "serviceName"}})
    local_api.request("PATCH", f"{deployments}/s", {"spec": {"selector": {"matchLabels": {"a": "t"}}}}, ok=(422,))

    claims = f"/api/v1/namespaces/{ns}/persistentvolumeclaims"
    local_api.create(claims, {"metadata": {"name": "c"}, "spec": {"accessModes": ["ReadWriteOnce"],
                                                                 "resources": {"requests": {"storage": "1Gi"}}}})
    grown = local_api.patch(f"{claims}/c", {"spec": {"resources": {"requests": {"storage": "2Gi"}}}})
    assert grown["spec"]["resources"]["requests"]["storage"] == "2Gi"
    local_api.request("PATCH", f"{claims}/c", {"spec": {"storageClassName": "fast"}}, ok=(422,))

    services = f"/api/v1/namespaces/{ns}/services"
    local_api.create(services, {"metadata": {"name": "h"}, "spec": {"clusterIP": "None", "selector": {"a": "s"}}})
    assert local_api.patch(f"{services}/h", {"spec": {"selector": {"a": "t"}}})["spec"]["selector"] == {"a": "t"}
    local_api.request("PATCH", f"{services}/h", {"spec": {"clusterIP": None}}, ok=(422,))

    configmaps = f"/api/v1/namespaces/{ns}/configmaps"
    local_api.create(configmaps, {"metadata": {"name": "frozen"}, "immutable": True, "data": {"a": "1"}})
    local_api.request("PATCH", f"{configmaps}/frozen", {"data": {"a": "2"}}, ok=(422,))


def test_finalizers_hold_deletion_as_kopf_expects(local_api, ns):
    local_api.create(rlrun_path(ns), rlrun("r"))
    local_api.patch(rlrun_path(ns, "r"), [{"op": "add", "path": "/metadata/finalizers", "value": ["kopf.zalando.org/x"]}],
                    content_type="application/json-patch+json")
    local_api.delete(rlrun_path(ns, "r"))
    held = local_api.get(rlrun_path(ns, "r"))
    assert held["metadata"]["deletionTimestamp"] and held["metadata"]["finalizers"] == ["kopf.zalando.org/x"]
    local_api.patch(rlrun_path(ns, "r"), {"metadata": {"finalizers": None}})
    assert local_api.get(rlrun_path(ns, "r")) is None


def test_pod_deletion_is_graceful_until_the_kubelet_confirms(local_api, ns):
    pods = f"/api/v1/namespaces/{ns}/pods"
    spec = {"containers": [{"name": "main", "image": "x"}], "terminationGracePeriodSeconds": 7}
    local_api.create(pods, {"metadata": {"name": "unscheduled"}, "spec": spec})
    local_api.delete(f"{pods}/unscheduled")
    assert local_api.get(f"{pods}/unscheduled") is None, "nothing runs an unscheduled pod: deleted at once"

    local_api.create(pods, {"metadata": {"name": "p"}, "spec": spec | {"nodeName": "local"}})
    local_api.delete(f"{pods}/p")
    pod = local_api.get(f"{pods}/p")
    assert pod["metadata"]["deletionTimestamp"] and pod["metadata"]["deletionGracePeriodSeconds"] == 7
    assert "Terminating" in local_api.kubectl("get", "pods", "-n", ns)
    local_api.delete(f"{pods}/p", gracePeriodSeconds=3)
    assert local_api.get(f"{pods}/p")["metadata"]["deletionGracePeriodSeconds"] == 3
    local_api.delete(f"{pods}/p", ok=(409,), gracePeriodSeconds=0, preconditions={"uid": "someone-else"})
    local_api.delete(f"{pods}/p", gracePeriodSeconds=0, preconditions={"uid": pod["metadata"]["uid"]})
    assert local_api.get(f"{pods}/p") is None


def test_selectors_tables_and_watches(local_api, ns):
    pods = f"/api/v1/namespaces/{ns}/pods"
    for name, labels in (("a", {"app": "x", "tier": "1"}), ("b", {"app": "y"}), ("c", {"app": "x"})):
        local_api.create(pods, {"metadata": {"name": name, "labels": labels}, "spec": {"containers": [{"name": "main"}]}})

    def names(**params) -> list[str]:
        return [p["metadata"]["name"] for p in local_api.items(pods, **params)]

    assert names(labelSelector="app=x") == ["a", "c"]
    assert names(labelSelector="app in (x,y),!tier") == ["b", "c"]
    assert names(labelSelector="tier") == ["a"]
    assert names(fieldSelector="metadata.name!=a") == ["b", "c"]
    assert local_api.kubectl("get", "pods", "-n", ns, "-l", "app=y", "-o", "name").split() == ["pod/b"]

    local_api.set_pod_status(ns, "a", "Running", ready=True)
    table = local_api.kubectl("get", "pods", "-n", ns, "a").splitlines()
    assert table[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert table[1].split()[1:4] == ["1/1", "Running", "0"]

    since = local_api.request("GET", pods)["metadata"]["resourceVersion"]
    events = []

    def watch():
        params = {"watch": "true", "resourceVersion": since, "labelSelector": "app=x", "timeoutSeconds": "5"}
        with urllib.request.urlopen(f"{local_api.url}{pods}?{urllib.parse.urlencode(params)}", timeout=30) as response:
            for line in response:
                events.append(json.loads(line))
                if events[-1]["type"] == "DELETED":
                    return

    watcher = threading.Thread(target=watch)
    watcher.start()
    local_api.patch(f"{pods}/b", {"metadata": {"annotations": {"k": "v"}}})  # not selected
    local_api.patch(f"{pods}/c", {"metadata": {"annotations": {"k": "v"}}})
    local_api.delete(f"{pods}/c")
    watcher.join(30)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("MODIFIED", "c"), ("DELETED", "c")]


def test_discovery_and_openapi_come_from_the_crds(local_api):
    resources = local_api.get("/apis/rlkube.dev/v1alpha1")["resources"]
    rlruns = next(r for r in resources if r["name"] == "rlruns")
    assert rlruns["shortNames"] == ["rlr"] and "rlkube" in rlruns["categories"] and rlruns["namespaced"]
    assert any(r["name"] == "rlruns/status" for r in resources)
    index = local_api.get("/openapi/v3")["paths"]
    doc = local_api.get(index["apis/rlkube.dev/v1alpha1"]["serverRelativeURL"])
    schema = doc["components"]["schemas"]["dev.rlkube.v1alpha1.RLRun"]
    assert "spec" in schema["properties"] and schema["x-kubernetes-group-version-kind"][0]["kind"] == "RLRun"


@pytest.fixture
def kmock_options():
    return {"cls": ApiServer}


async def test_kmock_reactions_answer_first_and_the_emulator_serves_the_rest(kmock):
    """In-process use (tests/operator): a test injects a failure with kmock's DSL."""
    await kmock.create_object(kmock.kinds["", "v1", "namespaces"], None, {"metadata": {"name": "a"}})
    kmock["fetch v1/configmaps"] << 403 << {"kind": "Status", "code": 403, "reason": "Forbidden"}
    async with kmock.post("/api/v1/namespaces/a/configmaps", json={"metadata": {"name": "x"}}) as response:
        assert response.status == 201
    async with kmock.get("/api/v1/namespaces/a/configmaps/x") as response:
        assert response.status == 403
    async with kmock.get("/api/v1/namespaces/a/configmaps") as response:
        assert [i["metadata"]["name"] for i in (await response.json())["items"]] == ["x"]
