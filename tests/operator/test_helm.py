"""The Helm chart, rendered and linted by the real Helm engine (helm-python-sdk binds Helm's Go
SDK as a shared library; no binary, no network), its objects validated against the Kubernetes
schemas, and its RBAC compared with the API requests the operator really makes."""

import base64
import json
import re
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from helm_python import _native
from kubernetes_validate.utils import SchemaNotFoundError
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from rlkube_operator.guardrails import Guardrails

from tests.operator.cluster import AGENT, pod_creating, pod_failed
from tests.operator.embedded import VERBS, operator_calls
from tests.operator.test_operator_kmock import (
    TEACHER,
    plant_old_token_secret,
    rlrun,
    start_everything,
)
from tests.operator.test_pools import member, rlpool

CHART = Path(__file__).resolve().parents[2] / "helm" / "rlkube"
REPO = CHART.parents[1]
VALUES = {
    "default": {},
    "network-policies": {"networkPolicy": {"enabled": True}},
    "cluster-wide": {"watch": {"allNamespaces": True}, "serviceMonitor": {"enabled": True}},
    "two-namespaces": {"watch": {"namespaces": ["team-a", "team-b"]}, "imagePullSecrets": [{"name": "reg"}]},
    "kueue": {"kueue": {"enabled": True}},
    "gang-scheduling": {"gangScheduling": {"enabled": True}},
    "egress": {"networkPolicy": {"egress": {"enabled": True, "allowed": [{"cidr": "10.0.0.0/8", "ports": [443]}]}}},
}


CRD_CHART = CHART.parent / "rlkube-crds"
CLUSTER_SCOPED = {"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "Namespace"}


def render_files(values: dict, chart: Path = CHART, name: str = "rlkube", namespace: str = "rlkube-system",
                 kube_version: str | None = None) -> dict[str, str]:
    """Template path -> rendered text, as `helm install` renders it (`helm template
    --kube-version` with one: Chart.render does not pass that option of Helm's SDK on)."""
    opts = {"name": name, "namespace": namespace, "is_install": True}
    if kube_version:
        opts["kube_version"] = kube_version
    with helm.Chart.load(str(chart)) as loaded:
        return json.loads(_native.call_string("helm_render", loaded._raw(), json.dumps(values), json.dumps(opts)))


def render(values: dict, chart: Path = CHART, name: str = "rlkube", namespace: str = "rlkube-system",
           kube_version: str | None = None) -> list[dict]:
    out = render_files(values, chart, name, namespace, kube_version)
    return [doc for path, text in sorted(out.items()) if path.endswith(".yaml")
            for doc in yaml.safe_load_all(text) if doc]


def claimed_minors(chart: Path) -> list[str]:
    """The Kubernetes minors the chart's kubeVersion admits that kubernetes-validate has the
    official schemas of ("1.28.0", ...)."""
    claimed = SpecifierSet(yaml.safe_load((chart / "Chart.yaml").read_text())["kubeVersion"].replace("-0", ""))
    return sorted({v for v in kubernetes_validate.utils.all_versions() if Version(v) in claimed}, key=Version)


def owned(objects: list[dict], namespace: str) -> set[tuple]:
    """What a release owns, as Helm identifies it: a second release rendering one of these fails
    ("cannot be imported into the current release: invalid ownership metadata")."""
    return {(o["apiVersion"].split("/")[0] if "/" in o["apiVersion"] else "", o["kind"],
             None if o["kind"] in CLUSTER_SCOPED else o["metadata"].get("namespace", namespace),
             o["metadata"]["name"]) for o in objects}


@pytest.mark.parametrize("name", sorted(VALUES))
def test_chart_lints_clean(name):
    report = helm.lint(str(CHART), VALUES[name], strict=True, kube_version="v1.30.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def validate(obj: dict, version: str) -> None:
    if obj["apiVersion"] != "monitoring.coreos.com/v1":  # the Prometheus Operator's CRD, not Kubernetes'
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_chart_claims_the_minors_its_default_install_runs_on():
    """kubeVersion's floor is the CRDs' (CEL rules with fieldPath, 1.28); the guardrails' admission
    policy (v1, 1.30) is rendered only where the cluster serves it."""
    assert claimed_minors(CHART)[:3] == ["1.28.0", "1.29.0", "1.30.0"]
    assert claimed_minors(CRD_CHART) == claimed_minors(CHART)
    assert "ValidatingAdmissionPolicy" not in {o["kind"] for o in render({}, kube_version="v1.29.9")}
    assert {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} <= {
        o["kind"] for o in render({}, kube_version="v1.30.0")}


MINORS = claimed_minors(CHART)


@pytest.mark.parametrize(("name", "version"), [("default", v) for v in MINORS] + [
    (name, v) for name in sorted(VALUES) if name != "default" for v in (MINORS[0], MINORS[-1])])
def test_rendered_objects_validate_on_every_claimed_minor(name, version):
    """Rendered for that minor (what `helm install` on such a cluster renders), every object is
    valid against that minor's official schemas: an API it does not serve has no schema there.
    The defaults on every minor, the other value sets on the first and the last."""
    objects = render(VALUES[name], kube_version=f"v{version}")
    for obj in objects:
        try:
            validate(obj, version)
        except SchemaNotFoundError as e:
            raise AssertionError(f"Kubernetes {version} has no {obj['apiVersion']} {obj['kind']}") from e
    # The one Secret: the key of the runs' tokens (test_the_operator_gets_its_token_key_…).
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "Secret"] == ["rlkube-rlkube-operator-token-key"]


@pytest.mark.parametrize(("values", "field"), [
    ({"watch": {"allNamespaces": "yes"}}, "/watch/allNamespaces"),
    ({"watch": {"namespaces": ["Team_A"]}}, "/watch/namespaces/0"),
    ({"reconcileInterval": 0}, "/reconcileInterval"),
    ({"metrics": {"port": 0}}, "/metrics/port"),
    ({"logLevel": "verbose"}, "/logLevel"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"watchNamespaces": ["team-a"]}, "'watchNamespaces' not allowed"),  # a typo is not ignored
])
def test_bad_values_are_refused_naming_the_field(values, field):
    with pytest.raises(Exception, match="schema") as error:
        render(values)
    assert field in str(error.value)


def for_runs(obj: dict) -> bool:
    """The operator's RBAC in the runs' namespaces, not the Lease's (leader-election.yaml,
    test_leader.py) nor the users' (user-roles.yaml, test_guardrails.py)."""
    return "Role" in obj["kind"] and not obj["metadata"]["name"].endswith(("-leader-election", "-edit", "-view",
                                                                           "-pool-namespaces"))


def test_rbac_scope_follows_the_watch_mode():
    kinds = lambda objs: sorted((o["kind"], o["metadata"].get("namespace")) for o in objs if for_runs(o))
    assert kinds(render({})) == [("Role", "rlkube-system"), ("RoleBinding", "rlkube-system")]
    assert kinds(render(VALUES["cluster-wide"])) == [("ClusterRole", None), ("ClusterRoleBinding", None)]
    assert kinds(render(VALUES["two-namespaces"])) == sorted(
        [("Role", "team-a"), ("RoleBinding", "team-a"), ("Role", "team-b"), ("RoleBinding", "team-b")])
    # in every mode, a pool's allowedRuns selector reads namespaces' labels: cluster-scoped, get only
    for values in ({}, VALUES["cluster-wide"], VALUES["two-namespaces"]):
        (role,) = [o for o in render(values) if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith(
            "-pool-namespaces")]
        assert role["rules"] == [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}]
    args = next(o for o in render(VALUES["two-namespaces"]) if o["kind"] == "Deployment")[
        "spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["--namespace=team-a", "--namespace=team-b"]


@pytest.mark.parametrize("name", sorted(VALUES))
def test_the_operator_may_create_secrets_and_get_but_never_list_one(name):
    """Every run's token is derived from the operator's key (`runtoken`); the operator gets the
    Secrets a run names, for their type (`namedobjects`), and a run's token Secret it finds
    there, for its keys, which it replaces (delete, create) when an older operator left some out:
    its RBAC, in any mode, has no list/watch on Secrets."""
    rules = [rule for o in render(VALUES[name]) if o["kind"] in ("Role", "ClusterRole") for rule in o["rules"]]
    on_secrets = {verb for rule in rules if "" in rule["apiGroups"] and {"secrets", "*"} & set(rule["resources"])
                  for verb in rule["verbs"]}
    assert on_secrets == {"get", "create", "delete"}


@pytest.mark.parametrize("existing", ["", "our-token-key"])
def test_the_operator_gets_its_token_key_from_a_secret_mounted_for_it(existing, tmp_path):
    """The chart's own Secret (a random key of 64 characters), or the admin's: mounted read-only
    where `--token-key-file` points, and usable as a key."""
    from rlkube_operator.main import parse_args
    from rlkube_operator.runtoken import read_key

    objects = render({"tokenKey": {"existingSecret": existing}})
    deploy = next(o for o in objects if o["kind"] == "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if "secret" in v]
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    path = parse_args(operator_args({"tokenKey": {"existingSecret": existing}})).token_key_file
    (item,) = volume["secret"]["items"]
    assert path == f"{mount['mountPath']}/{item['path']}"
    secrets = [o for o in objects if o["kind"] == "Secret"]
    if existing:
        assert volume["secret"]["secretName"] == existing and secrets == []
        return
    (secret,) = secrets
    assert (secret["metadata"]["name"], secret["metadata"]["namespace"]) == (volume["secret"]["secretName"], "rlkube-system")
    (tmp_path / "key").write_bytes(base64.b64decode(secret["data"][item["key"]]))
    assert len(read_key(str(tmp_path / "key"))) == 64
    again = next(o for o in render({}) if o["kind"] == "Secret")
    assert again["data"] != secret["data"], "not random: every install would share one key"


def test_a_rotations_previous_key_is_mounted_for_the_operator_and_named_by_no_run():
    """`tokenKey.previousSecret` (docs/security.md, rotating the key): mounted read-only where
    `--previous-token-key-file` points, and among the Secrets no run may name; absent, neither."""
    from rlkube_operator.main import parse_args

    values = {"tokenKey": {"existingSecret": "new-key", "previousSecret": "old-key"}}
    pod = next(o for o in render(values) if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == "old-key"]
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
    args = parse_args(operator_args(values))
    assert mount["readOnly"] is True
    assert args.previous_token_key_file == f"{mount['mountPath']}/{volume['secret']['items'][0]['path']}"
    assert {"new-key", "old-key"} <= set(args.guardrails.protected_secrets)
    assert parse_args(operator_args({})).previous_token_key_file is None


def test_operator_pod_is_non_root_with_a_read_only_root_filesystem():
    deploy = next(o for o in render({}) if o["kind"] == "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert deploy["spec"]["strategy"]["type"] == "RollingUpdate"  # two replicas, one leader: test_leader.py


def test_crds_are_upgradable_templates_kept_on_uninstall():
    crds = [o for o in render({}) if o["kind"] == "CustomResourceDefinition"]
    assert sorted(c["metadata"]["name"] for c in crds) == ["rlpools.rlkube.dev", "rlruns.rlkube.dev", "sftruns.rlkube.dev"]
    for c in crds:
        assert c["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        committed = yaml.safe_load((REPO / "crds" / f"rlkube.dev_{c['spec']['names']['plural']}.yaml").read_text())
        assert c == committed
    assert not [o for o in render({"crds": {"install": False}}) if o["kind"] == "CustomResourceDefinition"]


@pytest.mark.parametrize("version", claimed_minors(CRD_CHART))
def test_the_crd_chart_installs_exactly_the_committed_crds(version):
    report = helm.lint(str(CRD_CHART), {}, strict=True, kube_version=f"v{version}")
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == []
    crds = render({}, CRD_CHART, name="rlkube-crds", namespace="default", kube_version=f"v{version}")
    assert sorted(c["metadata"]["name"] for c in crds) == ["rlpools.rlkube.dev", "rlruns.rlkube.dev", "sftruns.rlkube.dev"]
    for c in crds:
        kubernetes_validate.validate(c, version, strict=True)
        assert c == yaml.safe_load((REPO / "crds" / f"rlkube.dev_{c['spec']['names']['plural']}.yaml").read_text())
    with pytest.raises(Exception, match="schema"):
        render({"install": True}, CRD_CHART)  # it takes no values: a typo is not ignored


def test_a_second_release_in_another_namespace_owns_nothing_the_first_owns():
    """The CRDs from their own chart, once; then one operator release per team namespace."""
    crds = owned(render({}, CRD_CHART, name="rlkube-crds", namespace="default"), "default")
    releases = [owned(render({"crds": {"install": False}}, name=f"rlkube-{ns}", namespace=ns), ns)
                for ns in ("team-a", "team-b")]
    assert not crds & releases[0] and not crds & releases[1] and not releases[0] & releases[1]
    assert {kind for _, kind, _, _ in releases[0]} >= {"Deployment", "Role", "RoleBinding", "ServiceAccount"}
    # What the chart's own CRDs would do: the second release would fail on their ownership.
    both = [owned(render({}, name=f"rlkube-{ns}", namespace=ns), ns) for ns in ("team-a", "team-b")]
    assert {kind for _, kind, _, _ in both[0] & both[1]} == {"CustomResourceDefinition"}


def _granted(values: dict) -> set[tuple[str, str, str]]:
    objects = render(values)
    role = next(o for o in objects if o["kind"] == "Role" and for_runs(o))
    namespaces = next(o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith(
        "-pool-namespaces"))
    return {(group, res.replace("sftruns", "rlruns"), verb) for rule in role["rules"] + namespaces["rules"]
            for group in rule["apiGroups"] for res in rule["resources"] for verb in rule["verbs"]}


def operator_requests(cluster) -> set[tuple[str, str, str]]:
    """(group, resource, verb) of every request the operator made to the API emulator."""
    used = set()
    for request in cluster.server:  # a namespace read: kmock parses /api/v1/namespaces/<name> as a namespace
        if (request.headers.get("User-Agent") != AGENT and request.method.upper() == "GET"
                and re.fullmatch(r"/api/v1/namespaces/[^/]+", request.url.path)):
            used.add(("", "namespaces", "get"))
    for request, resource in operator_calls(cluster.server):
        used.add((request.resource.group, resource.replace("sftruns", "rlruns"), VERBS[request.action.value]))
        # What the API server checks besides the verb itself (OwnerReferencesPermissionEnforcement):
        # setting blockOwnerDeletion on an owner reference needs `update` on the owner's finalizers.
        body = request.data if isinstance(request.data, dict) else {}
        for ref in (body.get("metadata") or {}).get("ownerReferences") or []:
            if ref.get("blockOwnerDeletion"):
                used.add(("rlkube.dev", ref["kind"].lower().replace("sftrun", "rlrun") + "s/finalizers", "update"))
    return used


NETWORK_POLICY_OFF = {"networkPolicy": {"enabled": False}}


def operator_args(values: dict) -> list[str]:
    deploy = next(o for o in render(values) if o["kind"] == "Deployment")
    return deploy["spec"]["template"]["spec"]["containers"][0]["args"]


def test_network_policies_are_on_by_default_and_admit_the_operators_pods_and_the_scrapers_namespace():
    from rlkube_operator.main import parse_args

    deploy = next(o for o in render({}) if o["kind"] == "Deployment")
    args = parse_args(operator_args({}))
    assert args.network_policy_peer == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "rlkube-system"}},
                                        "podSelector": {"matchLabels": deploy["spec"]["template"]["metadata"]["labels"]}}
    assert args.metrics_scraper_peer is None  # no scraper until the admin names its namespace
    assert not args.no_network_policy
    assert parse_args(operator_args(NETWORK_POLICY_OFF)).no_network_policy
    prometheus = {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}
    values = {"networkPolicy": {"metricsScraper": {"namespaces": ["monitoring"], "podSelector": prometheus}}}
    assert parse_args(operator_args(values)).metrics_scraper_peer == {"namespaceSelector": {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["monitoring"]}]}, "podSelector": prometheus}


@pytest.mark.parametrize("peer", [{"podSelector": {"matchLabels": {"rlkube.dev/metrics-scraper": "true"}}},
                                  {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "prometheus"}}}])
def test_a_scraper_peer_any_tenant_could_join_is_refused(peer, capsys):
    """A pod label alone (from the run's namespace, or any) is no fence: any tenant can set it."""
    from rlkube_operator.main import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--metrics-scraper-peer", json.dumps(peer)])
    assert "never by pod labels from any namespace" in capsys.readouterr().err


def test_a_malformed_network_policy_peer_is_refused_saying_why(capsys):
    from rlkube_operator.main import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--network-policy-peer", "{namespaceSelector: x}"])
    assert "--network-policy-peer: not JSON" in capsys.readouterr().err


@pytest.mark.parametrize(("operator_settings", "values"), [
    ({"guardrails": Guardrails(allowed_secrets=["team-s3"])}, {}),
    ({"network_policy_peer": None, "guardrails": Guardrails(allowed_secrets=["team-s3"])}, NETWORK_POLICY_OFF),
], ids=["default", "no-network-policies"])
async def test_rbac_grants_exactly_the_verbs_the_operator_uses(cluster, values):
    """A run's whole life (a created PVC, a judge dropped while running, which waits, then
    while suspended, which deletes its servers, budget and Service, suspend and resume, a gang
    restart, completion, deletion by its ttlSecondsAfterFinished), with every request the
    operator makes recorded by the API emulator. A Secret the run names is read for its type
    (the operator's reference check)."""
    await cluster.create(rlrun(storage={"pvc": {"size": "1Gi"}}, judge=TEACHER,
                               trainer={"pod": {"envFrom": [{"secretRef": {"name": "team-s3"}}]}}))
    # An inference pod stuck creating (its volume events are read), then everything runs.
    await cluster.until(lambda: cluster.get("StatefulSet", "rt-inference"), what="StatefulSet")
    await cluster.run_pods(cluster.get("StatefulSet", "rt-inference"), 1, **pod_creating())
    await cluster.until(lambda: next(c for c in cluster.status("RLRun", "rt")["conditions"]
                                     if c["type"] == "InferenceReady")["reason"] == "Starting", what="seen")
    await cluster.delete("Pod", "rt-inference-0")
    await cluster.run_pods(cluster.get("StatefulSet", "rt-judge"), TEACHER["replicas"])
    await start_everything(cluster)
    # Children edited by someone else are brought back (patched) on the next resync.
    await cluster.patch("Service", "rt-orchestrator", {"spec": {"ports": [{"name": "http", "port": 1}]}})
    await cluster.patch("PodDisruptionBudget", "rt-inference", {"spec": {"maxUnavailable": 5}})
    for policy in cluster.names("NetworkPolicy"):
        await cluster.patch("NetworkPolicy", policy, {"spec": {"policyTypes": ["Egress"]}})
    await cluster.until(lambda: cluster.get("PodDisruptionBudget", "rt-inference")["spec"]["maxUnavailable"] == 1
                        and len(cluster.get("Service", "rt-orchestrator")["spec"]["ports"]) == 2
                        and all(cluster.get("NetworkPolicy", p)["spec"]["policyTypes"] == ["Ingress"]
                                for p in cluster.names("NetworkPolicy")), what="corrected")
    # A judge dropped while the run is running is refused (the CRD's rule); suspended, it goes:
    # its StatefulSet, disruption budget and Service.
    drop = {"spec": {"judge": None}}
    code, answer = await cluster.api.request("PATCH", cluster.url("RLRun", "rt"), drop, "application/merge-patch+json")
    assert code == 422 and "unless the run is suspended" in answer["message"], answer
    await cluster.patch("RLRun", "rt", {"spec": {"suspend": True}})
    await cluster.until(lambda: cluster.status("RLRun", "rt")["phase"] == "Suspended", what="suspended")
    assert "rt-judge" in cluster.names("Service")
    await cluster.patch("RLRun", "rt", drop)
    await cluster.until(lambda: not {"rt-judge"} & (cluster.names("StatefulSet") | cluster.names("Service")
                                                  | cluster.names("PodDisruptionBudget")), what="judge dropped")
    await plant_old_token_secret(cluster, "rt")  # an older operator's: replaced on resume
    await cluster.patch("RLRun", "rt", {"spec": {"suspend": False}})
    job = await cluster.until(lambda: cluster.get("Job", "rt-trainer-1"), what="resume")
    await cluster.run_pods(job, 1, **pod_failed())
    await cluster.until(lambda: cluster.get("Job", "rt-trainer-2"), what="restart")
    await cluster.patch("Job", "rt-trainer-2", {"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
    await cluster.until(lambda: not cluster.names("Deployment"), what="teardown")
    await cluster.patch("RLRun", "rt", {"spec": {"ttlSecondsAfterFinished": 0}})
    await cluster.until(lambda: cluster.get("RLRun", "rt") is None, what="deleted, finalizer released")
    # A pool admitting by namespace labels (it reads the member's namespace), a member attached.
    selector = {"matchExpressions": [{"key": "quarantined", "operator": "DoesNotExist"}]}
    await cluster.create(rlpool(allowedRuns={"namespaces": {"from": "Selector", "selector": selector}},
                                storage={"pvc": {"size": "1Gi"}}))
    await cluster.create(member("m", storage={}))
    await cluster.until(lambda: cluster.get("Deployment", "m-orchestrator"), what="member attached")
    await cluster.until(lambda: cluster.status("RLPool", "pool").get("memberCount") == 1, what="pool status")
    await cluster.delete("RLPool", "pool")
    await cluster.until(lambda: cluster.get("RLPool", "pool") is None, what="pool deleted, finalizer released")

    used = operator_requests(cluster)
    assert used - _granted(values) == set(), "the operator needs verbs the chart does not grant"
    assert _granted(values) - used == set(), "the chart grants verbs the operator never uses"


@pytest.mark.parametrize("scraper", [[], ["monitoring"]])
def test_the_operators_metrics_reach_only_the_scrapers_namespace(scraper):
    """The operator's /metrics lists every run's namespace, name and step: the chart's own
    NetworkPolicy isolates the operator's pods and admits the scraper's namespace, on the
    metrics port only (none when no namespace is named)."""
    values = {"networkPolicy": {"metricsScraper": {"namespaces": scraper}}}
    objects = render(values)
    (policy,) = [o for o in objects if o["kind"] == "NetworkPolicy"]
    kubernetes_validate.validate(policy, "1.37.0", strict=True)
    deploy = next(o for o in objects if o["kind"] == "Deployment")
    assert policy["metadata"]["namespace"] == deploy["metadata"]["namespace"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= deploy["spec"]["template"]["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    expected = [{"from": [{"namespaceSelector": {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": scraper}]}}],
        "ports": [{"protocol": "TCP", "port": 8080}]}] if scraper else []
    assert policy["spec"]["ingress"] == expected
    assert not [o for o in render(NETWORK_POLICY_OFF) if o["kind"] == "NetworkPolicy"]


@pytest.mark.parametrize("watch", [
    {"namespaces": ["team-a", "rlkube-system"]},
    {"allNamespaces": True, "allowedSystemNamespaces": ["rlkube-system"]},
])
def test_an_install_watching_the_token_keys_namespace_beside_others_is_refused(watch):
    """The operator's token key lives in the release namespace (rlkube-system here): a run's author
    there who may read Secrets would forge the tokens of every other watched namespace's runs."""
    with pytest.raises(Exception) as error:
        render({"watch": watch})
    assert "watch: the release namespace rlkube-system holds the operator's token key (tokenKey)" in str(error.value)
    for fine in ({}, {"namespaces": ["rlkube-system"]}, {"namespaces": ["team-a", "team-b"]}, {"allNamespaces": True}):
        assert render({"watch": fine})  # its own namespace alone, or not at all
