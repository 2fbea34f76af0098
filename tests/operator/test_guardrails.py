"""The guardrails, enforced twice from one definition (rlkube_operator/guardrails.py): the chart's
ValidatingAdmissionPolicy, rendered by the real Helm engine, validated against the official
schemas, and its CEL evaluated with cel-python as the API server would (variables first, then
each validation; the object with the CRD's defaults applied) against hostile runs and benign
ones (the local API server enforces it too: tests/cluster); and the operator, which refuses the
same runs with the same messages."""

import copy

import kubernetes_validate
import pytest
from pydantic import ValidationError
from rlkube_operator import crd, guardrails
from rlkube_operator.names import RunRef
from rlkube_operator.reconcile import Reconciler, Settings
from rlkube_operator.spec import KINDS, RLRunSpec

from e2e.localcluster import policies
from e2e.localcluster.admission import with_defaults
from tests.operator.test_helm import render
from tests.operator.test_operator_kmock import example

SCHEMAS = {kind: crd.build_crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"] for kind in crd.KINDS}


class Policy:
    """The chart's ValidatingAdmissionPolicy and binding, evaluated as kube-apiserver's admission
    does (e2e/localcluster/policies.py, which the local API server enforces too)."""

    def __init__(self, values: dict | None = None):
        objects = render(values or {})
        (self.policy,) = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"]
        (self.binding,) = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"]

    def refusals(self, run: dict, old: dict | None = None) -> list[str]:
        """The messages of the validations `run` fails (`old`: an UPDATE from it)."""
        seen = [with_defaults(SCHEMAS[run["kind"]], o) if o else None for o in (run, old)]
        request = {"operation": "UPDATE" if old else "CREATE"}
        return [message for message, _ in policies.evaluate(self.policy, request, *seen)]


EXAMPLES = {"guardrails": {"allowedClaims": ["reverse-text-shared"]}}
"""The values the examples need: their runs share one claim (examples/reverse_text/sftrun.yaml)."""


@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy(EXAMPLES)


def run(kind: str = "RLRun", **spec) -> dict:
    name = "rlrun.yaml" if kind == "RLRun" else "sftrun.yaml"
    return {"apiVersion": "rlkube.dev/v1alpha1", "kind": kind, "metadata": {"name": "r", "namespace": "team-a"},
            "spec": copy.deepcopy(example(name)["spec"]) | spec}


def with_pod(component: str, **pod) -> dict:
    obj = run()
    obj["spec"].setdefault(component, {})["pod"] = pod
    if component == "teacher":
        obj["spec"]["teacher"]["model"] = {"name": "teacher-model"}
    return obj


HOST_PATH = {"name": "host", "hostPath": {"path": "/"}}
NFS = {"name": "share", "nfs": {"server": "10.0.0.1", "path": "/"}}
HOSTILE = {
    "hostPath": (with_pod("trainer", volumes=[{"name": "scratch", "emptyDir": {}}, HOST_PATH]),
                 "spec.trainer.pod.volumes: volume host is a hostPath volume"),
    "nfs on env workers": (with_pod("envWorkers", volumes=[NFS]), "spec.envWorkers.pod.volumes: volume share is a nfs"),
    "hostPath in an SFTRun": (run("SFTRun", trainer={"pod": {"volumes": [HOST_PATH]}}),
                              "spec.trainer.pod.volumes: volume host is a hostPath volume"),
    "runAsUser 0": (run(securityContext={"runAsUser": 0}), "spec.securityContext.runAsUser: 0 is root"),
    "runAsGroup 0": (run(securityContext={"runAsGroup": 0}), "spec.securityContext.runAsGroup: 0 is root"),
    "runAsNonRoot false": (run(securityContext={"runAsNonRoot": False}), "spec.securityContext.runAsNonRoot: false"),
    "unconfined": (run(securityContext={"seccompProfile": {"type": "Unconfined"}}),
                   "spec.securityContext.seccompProfile.type: Unconfined"),
    "tolerate every taint": (run(scheduling={"tolerations": [{"operator": "Exists"}]}), "spec.scheduling.tolerations:"),
    "tolerate every taint, teacher": (with_pod("teacher", tolerations=[{"key": "", "operator": "Exists"}]),
                                      "spec.teacher.pod.tolerations:"),
    "run-level service account": (run(serviceAccountName="ci-deployer"),
                                  "spec.serviceAccountName ci-deployer is not allowed"),
    "component service account": (with_pod("inference", serviceAccountName="ci-deployer"),
                                  "spec.inference.pod.serviceAccountName ci-deployer is not allowed"),
    "priority class": (with_pod("orchestrator", priorityClassName="system-cluster-critical"),
                       "spec.orchestrator.pod.priorityClassName system-cluster-critical is not allowed"),
    "run-level priority class": (run(scheduling={"priorityClassName": "system-node-critical"}),
                                 "spec.scheduling.priorityClassName system-node-critical is not allowed"),
    "runtime class": (with_pod("trainer", runtimeClassName="unsandboxed"),
                      "spec.trainer.pod.runtimeClassName unsandboxed is not allowed"),
    "unlisted registry": (run(image="docker.io/someone/rlkube:latest"),
                          "spec.image docker.io/someone/rlkube:latest is not from a registry"),
    "projected service-account token": (
        with_pod("orchestrator", volumes=[{"name": "sa", "projected": {"sources": [
            {"configMap": {"name": "r-config"}}, {"serviceAccountToken": {"path": "token", "audience": "vault"}}]}}]),
        "spec.orchestrator.pod.volumes: a projected serviceAccountToken"),
    "csi volume": (with_pod("trainer", volumes=[{"name": "s", "csi": {"driver": "secrets-store.csi.k8s.io"}}]),
                   "spec.trainer.pod.volumes: volume s is a csi volume"),
    "ephemeral volume cloning a claim": (
        with_pod("trainer", volumes=[{"name": "e", "ephemeral": {"volumeClaimTemplate": {"spec": {
            "dataSource": {"kind": "PersistentVolumeClaim", "name": "r-data"}}}}}]),
        "spec.trainer.pod.volumes: volume e is a ephemeral volume"),
    "another run's claim, as a volume": (
        with_pod("inference", volumes=[{"name": "o", "persistentVolumeClaim": {"claimName": "other-data"}}]),
        "spec.inference.pod.volumes[].persistentVolumeClaim.claimName: PersistentVolumeClaim other-data is not"),
    "another run's claim, as storage": (run(storage={"pvc": {"claimName": "other-sft-data"}}),
                                        "spec.storage.pvc.claimName: PersistentVolumeClaim other-sft-data is not the run's own"),
    "another run's token, secretKeyRef": (
        with_pod("envWorkers", env=[{"name": "T", "valueFrom": {"secretKeyRef": {"name": "other-token", "key": "token"}}}]),
        "spec.envWorkers.pod.env[].valueFrom.secretKeyRef.name: Secret other-token is not"),
    "another run's token, envFrom": (with_pod("trainer", envFrom=[{"secretRef": {"name": "other-sft-token"}}]),
                                     "spec.trainer.pod.envFrom[].secretRef.name: Secret other-sft-token is not"),
    "another run's token, secret volume": (
        with_pod("trainer", volumes=[{"name": "t", "secret": {"secretName": "other-token"}}]),
        "spec.trainer.pod.volumes[].secret.secretName: Secret other-token is not"),
    "another run's token, as the store's secret": (
        run(storage={"pvc": {"size": "1Gi"}, "objectStore": {"url": "s3://b", "secretName": "other-token"}}),
        "spec.storage.objectStore.secretName: Secret other-token is not"),
    "control-plane toleration": (
        run(scheduling={"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists",
                                         "effect": "NoSchedule"}]}),
        "spec.scheduling.tolerations: a toleration of taint node-role.kubernetes.io/control-plane"),
    "pinned to the control plane": (with_pod("orchestrator", nodeSelector={"node-role.kubernetes.io/control-plane": ""}),
                                    "spec.orchestrator.pod.nodeSelector: node label node-role.kubernetes.io/control-plane is not allowed"),
    "pinned to a node by affinity": (
        with_pod("trainer", affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["cp-0"]}]}]}}}),
        "spec.trainer.pod.affinity.nodeAffinity: a node label or field the cluster admin does not allow"),
    "scheduler": (run(scheduling={"schedulerName": "my-scheduler"}),
                  "spec.scheduling.schedulerName my-scheduler is not allowed"),
    "component scheduler": (with_pod("teacher", schedulerName="my-scheduler"),
                            "spec.teacher.pod.schedulerName my-scheduler is not allowed"),
    "queue priority": (run(queue={"name": "q", "priorityClassName": "urgent"}),
                       "spec.queue.priorityClassName urgent is not allowed"),
}


class EmptyNamespace:
    """The API as the operator's reference check sees a namespace holding none of the objects
    a run names (tests/security reads real ones from the API emulator)."""

    def get(self, kind, namespace, name):
        return None


def operator_refusals(obj: dict, values: dict | None = None) -> list[str]:
    """What the operator refuses of `obj`, with the guardrails the chart gives it for `values`."""
    (deployment,) = [o for o in render(values or EXAMPLES) if o["kind"] == "Deployment"]
    (arg,) = [a for a in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
              if a.startswith("--guardrails=")]
    given = guardrails.Guardrails.model_validate_json(arg.split("=", 1)[1])
    reconciler = Reconciler(EmptyNamespace(), Settings(guardrails=given))
    meta = obj["metadata"]
    spec = KINDS[obj["kind"]].model_validate(obj["spec"])
    refused, checked = reconciler.guardrail_refusals(RunRef(obj["kind"], meta["name"], meta["namespace"], "u"), spec)
    assert checked
    return refused


def test_the_chart_policy_is_the_operators_definition():
    """The chart takes its rules from the file the operator writes, and its variables from the
    values the operator gets: one definition (the file's freshness: test_crds)."""
    for values in ({}, {"guardrails": {"allowedSchedulers": ["volcano"], "allowPodAffinity": True}}):
        spec = Policy(values).policy["spec"]
        (deployment,) = [o for o in render(values) if o["kind"] == "Deployment"]
        (arg,) = [a for a in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
                  if a.startswith("--guardrails=")]
        given = guardrails.Guardrails.model_validate_json(arg.split("=", 1)[1])
        assert spec["variables"] == given.variables() and spec["validations"] == guardrails.VALIDATIONS
    # The chart adds the operator's token key to the Secrets no run may name.
    (key,) = [o["metadata"]["name"] for o in render(values) if o["kind"] == "Secret" and o["metadata"]["name"].endswith(
        "-token-key")]
    assert given.protected_secrets == [key]
    assert guardrails.Guardrails() == given.model_copy(update={"allowed_schedulers": [], "allow_pod_affinity": False,
                                                              "protected_secrets": []})


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_the_operator_refuses_what_admission_refuses(policy, case):
    """A cluster without the policy (< 1.30, guardrails.enabled=false, CRDs without the chart)
    is still guarded: the operator refuses the same runs, with the same messages."""
    obj, message = HOSTILE[case]
    if case == "runAsUser 0":  # with runAsNonRoot (the default) the spec itself is refused first
        obj = run(securityContext={"runAsUser": 0, "runAsNonRoot": False})
        message = "spec.securityContext.runAsUser: 0 is root"
    refused = operator_refusals(obj)
    assert message in "\n".join(refused) and refused == policy.refusals(obj), refused


def test_the_guardrails_are_valid_kubernetes_objects(policy):
    for obj in (policy.policy, policy.binding):
        kubernetes_validate.validate(obj, "1.37.0", strict=True)
    assert policy.binding["spec"]["policyName"] == policy.policy["metadata"]["name"]
    assert policy.binding["spec"]["validationActions"] == ["Deny"]
    assert policy.binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][0]["values"] == [
        "rlkube-system"]  # the watched namespaces only


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_run_is_refused_naming_the_field(policy, case):
    obj, message = HOSTILE[case]
    refusals = policy.refusals(obj)
    assert len(refusals) == 1 and message in refusals[0], refusals


@pytest.mark.parametrize("kind", ["RLRun", "SFTRun"])
def test_benign_runs_pass(policy, kind):
    assert policy.refusals(run(kind)) == []
    # What the admin allows: a GPU pool's taint and label, shared names, prefixed labels.
    admin = Policy({"guardrails": EXAMPLES["guardrails"] | {
        "allowedTolerations": ["nvidia.com/gpu"], "allowedNodeLabels": ["pool=gpu", "kubernetes.io/arch"],
        "allowedConfigMaps": ["nccl"], "allowedClaims": ["reverse-text-shared", "shared"]}})
    keyed = {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
             "nodeSelector": {"pool": "gpu"}}
    volumes = [{"name": "cache", "emptyDir": {}}, {"name": "cfg", "configMap": {"name": "nccl"}},
               {"name": "ckpt", "persistentVolumeClaim": {"claimName": "shared"}}]
    affinity = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {
        "matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}}]}}
    pod = {"volumes": volumes, "affinity": affinity, "labels": {"user.rlkube.dev/team": "a"},
           "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}} | keyed
    assert admin.refusals(run(kind, scheduling=keyed, trainer={"pod": pod})) == []
    assert policy.refusals(run(kind, scheduling=keyed, trainer={"pod": pod})) != []
    # The defaults the CRD gives a run without a securityContext pass: they are the restricted ones.
    bare = run(kind)
    del bare["spec"]["securityContext"]
    assert policy.refusals(bare) == []
    assert operator_refusals(run(kind)) == []
    # Its own claim, token and config by name.
    prefix = "r-" if kind == "RLRun" else "r-sft-"
    own = run(kind, storage={"pvc": {"claimName": f"{prefix}data"}},
              trainer={"pod": {"envFrom": [{"secretRef": {"name": f"{prefix}token"}},
                                           {"configMapRef": {"name": f"{prefix}config"}}]}})
    assert Policy().refusals(own) == []


def test_what_the_admin_allows_passes_and_nothing_more():
    allowing = Policy({"guardrails": {
        "allowedServiceAccounts": ["ci-deployer"], "allowedPriorityClasses": ["*"],
        "allowedRuntimeClasses": ["unsandboxed"], "allowRoot": True, "allowTolerateAll": True,
        "allowedVolumeTypes": ["emptyDir", "hostPath"], "allowedImageRegistries": ["docker.io/someone/", "ghcr.io/"],
        "validationActions": ["Warn", "Audit"], "allowedClaims": ["*"],
    }})
    for case in ("hostPath", "runAsUser 0", "runAsNonRoot false", "component service account", "priority class",
                 "runtime class", "unlisted registry", "tolerate every taint"):
        assert allowing.refusals(HOSTILE[case][0]) == [], case
    assert "volume share is a nfs" in allowing.refusals(HOSTILE["nfs on env workers"][0])[0]
    assert "Unconfined" in allowing.refusals(HOSTILE["unconfined"][0])[0]
    other = with_pod("trainer", serviceAccountName="cluster-admin")
    assert "serviceAccountName cluster-admin" in allowing.refusals(other)[0]
    assert allowing.binding["spec"]["validationActions"] == ["Warn", "Audit"]


def test_an_update_that_leaves_the_spec_alone_is_not_checked(policy):
    """A run from before the guardrails can still get its finalizer removed and be deleted."""
    old, _ = HOSTILE["hostPath"]
    finalized = copy.deepcopy(old)
    finalized["metadata"]["finalizers"] = []
    assert policy.refusals(finalized, old=old) == []
    resized = copy.deepcopy(old)
    resized["spec"]["inference"] = {"replicas": 2}
    assert policy.refusals(resized, old=old)


def test_the_guardrails_can_be_turned_off():
    kinds = {o["kind"] for o in render({"guardrails": {"enabled": False}})}
    assert not kinds & {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


@pytest.mark.parametrize("field", [{"privileged": True}, {"capabilities": {"add": ["SYS_ADMIN"]}},
                                   {"allowPrivilegeEscalation": True}])
def test_privileges_a_spec_cannot_even_ask_for(field):
    """Containers always drop every capability, never escalate and are never privileged: the
    spec has no field to ask otherwise, and an unknown one is refused, not ignored."""
    spec = run()["spec"] | {"securityContext": field}
    with pytest.raises(ValidationError, match="securityContext"):
        RLRunSpec.model_validate(spec)


def allows(role: dict, verb: str, resource: str) -> bool:
    return any("rlkube.dev" in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]
               for r in role["rules"])


def test_namespace_users_get_runs_through_the_aggregated_roles():
    roles = {o["metadata"]["name"].rsplit("-", 1)[1]: o for o in render({}) if o["kind"] == "ClusterRole"
             and any(k.startswith("rbac.authorization.k8s.io/aggregate-to-") for k in o["metadata"]["labels"])}
    for role in roles.values():
        kubernetes_validate.validate(role, "1.37.0", strict=True)
    edit, view = roles["edit"], roles["view"]
    assert {"rbac.authorization.k8s.io/aggregate-to-edit", "rbac.authorization.k8s.io/aggregate-to-admin"} <= set(
        edit["metadata"]["labels"])
    assert "rbac.authorization.k8s.io/aggregate-to-view" in view["metadata"]["labels"]
    for resource in ("rlruns", "sftruns"):
        assert all(allows(edit, verb, resource) for verb in ("create", "patch", "delete", "list", "watch"))
        assert all(allows(view, verb, resource) for verb in ("get", "list", "watch"))
        assert not any(allows(view, verb, resource) for verb in ("create", "update", "patch", "delete"))
        assert not allows(edit, "patch", f"{resource}/status")  # status is the operator's
    assert not [o for o in render({"aggregateRoles": False}) if o["metadata"]["name"].endswith(("-edit", "-view"))]



@pytest.mark.parametrize(("values", "field"), [
    ({"guardrails": {"allowedImageRegistries": ["ghcr.io/x' || true || '"]}}, "/guardrails/allowedImageRegistries/0"),
    ({"guardrails": {"validationActions": ["Block"]}}, "/guardrails/validationActions/0"),
    ({"guardrails": {"allowRoot": "yes"}}, "/guardrails/allowRoot"),
    ({"guardrails": {"allowedServiceAccounts": ["Not_A_Name"]}}, "/guardrails/allowedServiceAccounts/0"),
])
def test_guardrail_values_that_would_break_the_policy_are_refused_naming_them(values, field):
    """A registry is put inside a CEL string of the messages: a quote is refused, not injected."""
    with pytest.raises(Exception, match="schema") as error:
        render(values)
    assert field in str(error.value)
