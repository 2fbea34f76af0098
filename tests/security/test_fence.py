"""What a tenant who may create runs but not pods can make the operator's pods reach (issue 41):
only what the run owns or the cluster admin allows. Each case goes through the chart's
ValidatingAdmissionPolicy as the API server evaluates it (rendered by Helm, its CEL run by the
project's evaluator, e2e/localcluster/policies.py) and through the operator (its own check, and
the embedded operator against the API emulator where it must read an object)."""

import asyncio
import copy
import functools
import json
import time

import jsonschema
import pytest
from rlkube_operator import crd, guardrails
from rlkube_operator.builders import APPLIED_SPEC_KEY, APPLIED_SPEC_SIGNATURE_KEY
from rlkube_operator.guardrails import POD_REFERENCES, RUN_REFERENCES, Guardrails

from e2e.localcluster import admission
from tests.operator.conftest import crd_rules_off  # noqa: F401
from tests.operator.embedded import PERMISSIVE, TOKEN_KEY, running_operator
from tests.operator.test_guardrails import EXAMPLES, SCHEMAS, operator_refusals, run
from tests.operator.test_guardrails import Policy as RenderedPolicy
from tests.operator.test_helm import render
from tests.operator.test_operator_kmock import condition, rlrun, start_everything

(TOKEN_KEY_SECRET,) = [o["metadata"]["name"] for o in render({}) if o["kind"] == "Secret"]
"""The operator's token key, which forges every run's token."""
KINDS = {"Secret": "Secret", "PersistentVolumeClaim": "claim", "ConfigMap": "ConfigMap"}
FIELDS = [(f"spec.trainer.pod.{items}[].{path}", kind, items, path) for items, path, kind in POD_REFERENCES] + [
    (f"spec.{path}", kind, None, path) for path, kind in RUN_REFERENCES]
"""Every field that can name a Secret, claim or ConfigMap (the guardrails' table; the CRD's typed
ones: test_every_field_of_the_schema_that_names_one_is_fenced)."""
VOLUME_TYPES = sorted({path.split(".")[0] for items, path, _ in POD_REFERENCES if items == "volumes"})
"""The volume types that name one (some refused by default whatever they name)."""


@functools.cache
def _policy(values: str) -> RenderedPolicy:
    return RenderedPolicy(json.loads(values))


def Policy(values: dict | None = None) -> RenderedPolicy:
    """The chart's policy for `values`, rendered once."""
    return _policy(json.dumps(values or {}, sort_keys=True))


def _put(path: str, value):
    for step in reversed(path.split(".")):
        value = {step: value}
    return value


def _nest(path: str, value):
    head, nested, rest = path.partition("[].")
    return _put(head, [_nest(rest, value)]) if nested else _put(path, value)


def naming(field: str, name: str, *, kind: str = "RLRun") -> dict:
    """A benign run whose `field` (one of FIELDS) names `name`."""
    _, _, items, path = next(f for f in FIELDS if f[0] == field)
    obj = run(kind)
    if items is not None:
        item = _nest(path, name) | ({"name": "x"} if items in ("env", "volumes") else {})
        obj["spec"].setdefault("trainer", {}).setdefault("pod", {})[items] = [item]
    elif path == "imagePullSecrets[]":
        obj["spec"]["imagePullSecrets"] = [name]
    elif path.startswith("storage.objectStore"):
        obj["spec"]["storage"] = {"pvc": {"size": "1Gi"}, "objectStore": {"url": "s3://b", path.rsplit(".")[-1]: name}}
    elif path == "export.claimName":
        obj["spec"]["export"] = {"claimName": name, "path": "models"}
    else:
        obj["spec"]["storage"] = {"pvc": {"claimName": name}}
    return obj


def refused(policy: Policy, obj: dict, values: dict | None = None) -> list[str]:
    """What admission refuses, checked to be what the operator refuses too (same messages)."""
    at_admission = policy.refusals(obj)
    assert operator_refusals(obj, values) == at_admission
    return at_admission


@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy(EXAMPLES)


@pytest.mark.parametrize("field", [f[0] for f in FIELDS])
def test_an_arbitrary_object_or_the_operators_key_is_refused_in_every_field(policy, field):
    """Another team's Secret, claim or ConfigMap, and the operator's token key, named in each
    field: refused naming the field and the object; the key even when the admin allows any."""
    kind = next(f[1] for f in FIELDS if f[0] == field)
    out = refused(policy, naming(field, "team-b-credentials"))
    assert any(m.startswith(f"{field}: {kind} team-b-credentials is not the run's own") for m in out), out
    if kind == "Secret":
        values = {"guardrails": EXAMPLES["guardrails"] | {"allowedSecrets": ["*"]}}
        out = refused(Policy(values), naming(field, TOKEN_KEY_SECRET), values)
        assert any(m.startswith(f"{field}: Secret {TOKEN_KEY_SECRET} ") for m in out), out


@pytest.mark.parametrize("field", [f[0] for f in FIELDS])
def test_what_the_run_owns_and_what_the_admin_lists_passes(field):
    kind = next(f[1] for f in FIELDS if f[0] == field)
    own = {"Secret": "r-token", "PersistentVolumeClaim": "r-data", "ConfigMap": "r-config"}[kind]
    allowed = {"Secret": "allowedSecrets", "PersistentVolumeClaim": "allowedClaims", "ConfigMap": "allowedConfigMaps"}
    values = {"guardrails": {"allowedClaims": ["reverse-text-shared"], "allowedVolumeTypes": VOLUME_TYPES}}
    listing = {"guardrails": values["guardrails"] | {allowed[kind]: ["team-shared"] + (
        ["reverse-text-shared"] if kind == "PersistentVolumeClaim" else [])}}
    assert Policy(values).refusals(naming(field, own)) == []
    assert refused(Policy(listing), naming(field, "team-shared"), listing) == []


def test_every_field_of_the_schema_that_names_one_is_fenced():
    """The CRD's typed fields that name a Secret, claim or ConfigMap are those the guardrails
    check (the free-form ones, env valueFrom, envFrom and volumes, are Kubernetes' own types,
    whose naming fields POD_REFERENCES lists)."""
    found = []

    def walk(node: dict, path: str):
        for name, sub in (node.get("properties") or {}).items():
            if any(w in name.lower() for w in ("secret", "claim", "configmap")):
                found.append(f"{path}.{name}")
            walk(sub.get("items", sub), f"{path}.{name}")

    walk(SCHEMAS["RLRun"]["properties"]["spec"], "spec")
    fenced = {f"spec.{p.removesuffix('[]')}" for p, _ in RUN_REFERENCES}
    assert sorted(found) == sorted(fenced)


@pytest.mark.parametrize("operator_settings", [{"guardrails": Guardrails(
    allowed_secrets=["*"], allowed_claims=["*"], allowed_config_maps=["*"], allowed_volume_types=VOLUME_TYPES)}])
@pytest.mark.usefixtures("crd_rules_off")
async def test_a_service_account_token_is_refused_by_its_type_in_every_field(cluster):
    """Listed by name (here: any), a `kubernetes.io/service-account-token` Secret is still a
    service account's credential: the operator reads its type and fails the run before it
    creates anything, naming every field that names it."""
    await cluster.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "builder-token"},
                          "type": "kubernetes.io/service-account-token", "data": {}})
    obj = rlrun()
    obj["spec"]["trainer"]["pod"] = {
        items: [_nest(path, "builder-token") | ({"name": "x"} if items in ("env", "volumes") else {})
                for i, path, kind in POD_REFERENCES if i == items and kind == "Secret"]
        for items in ("env", "envFrom", "volumes")}
    obj["spec"]["imagePullSecrets"] = ["builder-token"]
    obj["spec"]["storage"] = {"pvc": {"size": "1Gi"},
                              "objectStore": {"url": "s3://b", "secretName": "builder-token"}}
    await cluster.create(obj)
    status = await cluster.until(lambda: cluster.status("RLRun", "rt").get("phase") and cluster.status("RLRun", "rt"))
    message = condition(status, "SpecAccepted")["message"]
    assert status["phase"] == "Failed" and not cluster.names("Job") and not cluster.names("ConfigMap")
    for field, kind, _, _ in FIELDS:
        if kind == "Secret" and "readOnly" not in field:
            assert f"{field}: Secret builder-token is a service account's token" in message, field


@pytest.mark.parametrize("operator_settings", [{"guardrails": Guardrails(
    allowed_reference_labels={"rlkube.dev/shareable": "true"}, allowed_claims=["reverse-text-shared"])}])
@pytest.mark.usefixtures("crd_rules_off")
async def test_an_object_allowed_by_its_labels_passes_and_an_unlabelled_one_is_refused(cluster):
    """Labels are the operator's to check (admission cannot read the object)."""
    for name, labels in (("shared-cfg", {"rlkube.dev/shareable": "true"}), ("private-cfg", {})):
        await cluster.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels}})
    obj = rlrun()
    obj["spec"]["trainer"]["pod"] = {"envFrom": [{"configMapRef": {"name": "shared-cfg"}},
                                                 {"configMapRef": {"name": "private-cfg"}}]}
    await cluster.create(obj)
    status = await cluster.until(lambda: cluster.status("RLRun", "rt").get("phase") and cluster.status("RLRun", "rt"))
    message = condition(status, "SpecAccepted")["message"]
    assert "spec.trainer.pod.envFrom[].configMapRef.name: ConfigMap private-cfg" in message
    assert "lacks the labels rlkube.dev/shareable=true" in message and "shared-cfg" not in message
    await cluster.patch("RLRun", "rt", {"spec": {"trainer": {"pod": {"envFrom": [
        {"configMapRef": {"name": "shared-cfg"}}]}}}})
    await cluster.until(lambda: cluster.get("Job", "rt-trainer-0"), what="trainer once only the labelled one is named")


APPARMOR = "container.apparmor.security.beta.kubernetes.io/trainer"


@pytest.mark.parametrize("allowed", [[], ["*"], ["container.apparmor.security.beta.kubernetes.io/"]])
def test_apparmor_unconfined_is_refused_unless_the_admin_names_its_key(allowed):
    values = {"guardrails": EXAMPLES["guardrails"] | {"allowedAnnotations": allowed}}
    obj = run(trainer={"pod": {"annotations": {APPARMOR: "unconfined"}}})
    (out,) = refused(Policy(values), obj, values)
    assert out.startswith(f"spec.trainer.pod.annotations: annotation {APPARMOR} is not allowed")
    exact = {"guardrails": EXAMPLES["guardrails"] | {"allowedAnnotations": [APPARMOR]}}
    assert refused(Policy(exact), obj, exact) == []
    for key in ("sidecar.istio.io/inject", "seccomp.security.alpha.kubernetes.io/pod"):
        assert refused(Policy(values), run(trainer={"pod": {"annotations": {key: "x"}}}), values)


def test_pod_labels_stay_under_the_allowed_prefix(policy):
    (out,) = refused(policy, run(trainer={"pod": {"labels": {"app": "payments"}}}))
    assert out.startswith("spec.trainer.pod.labels: label app is outside the prefixes")
    assert refused(policy, run(trainer={"pod": {"labels": {"user.rlkube.dev/app": "payments"}}})) == []


TEAM_B = {"key": "team-b/gpu", "operator": "Exists", "effect": "NoSchedule"}
POOL = "cloud.google.com/gke-nodepool"


@pytest.mark.parametrize("where", ["scheduling", "trainer", "orchestrator"])
def test_another_teams_toleration_and_a_node_pool_are_refused(policy, where):
    def at(**settings):
        return run(scheduling=settings) if where == "scheduling" else run(**{where: {"pod": settings}})

    (out,) = refused(policy, at(tolerations=[TEAM_B]))
    assert out.startswith(f"spec.{where}.{'' if where == 'scheduling' else 'pod.'}tolerations: a toleration of "
                          "taint team-b/gpu")
    (out,) = refused(policy, at(nodeSelector={POOL: "team-b"}))
    assert f"nodeSelector: node label {POOL} is not allowed" in out
    allowing = {"guardrails": EXAMPLES["guardrails"] | {"allowedTolerations": ["team-a/gpu"],
                                                        "allowedNodeLabels": [f"{POOL}=team-a"]}}
    assert refused(Policy(allowing), at(nodeSelector={POOL: "team-a"},
                                        tolerations=[TEAM_B | {"key": "team-a/gpu"}]), allowing) == []
    assert refused(Policy(allowing), at(nodeSelector={POOL: "team-b"}), allowing)


@pytest.mark.parametrize("affinity", [
    {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": POOL, "operator": "In", "values": ["team-b"]}]}]}}},
    {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": {
        "matchExpressions": [{"key": POOL, "operator": "In", "values": ["team-b"]}]}}]}},
    {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-7"]}]}]}}},
    {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "payments"}}, "topologyKey": "kubernetes.io/hostname"}]}},
], ids=["required", "preferred", "node-name", "pod-affinity"])
def test_affinity_to_a_pool_a_node_or_other_pods_is_refused(policy, affinity):
    (out,) = refused(policy, run(trainer={"pod": {"affinity": affinity}}))
    assert out.startswith("spec.trainer.pod.affinity")
    allowing = {"guardrails": EXAMPLES["guardrails"] | {"allowedNodeLabels": [f"{POOL}=team-b", "metadata.name"],
                                                        "allowPodAffinity": True}}
    assert refused(Policy(allowing), run(trainer={"pod": {"affinity": affinity}}), allowing) == []


def test_extended_resources_are_refused_unless_allowed(policy):
    obj = run(trainer={"nodes": 1, "resources": {"limits": {"cpu": "2", "example.com/fpga": 1}}})
    (out,) = refused(policy, obj)
    assert out.startswith("spec.trainer.resources: example.com/fpga is not allowed")
    allowing = {"guardrails": EXAMPLES["guardrails"] | {"allowedExtendedResources": ["example.com/fpga"]}}
    assert refused(Policy(allowing), obj, allowing) == []


@pytest.mark.parametrize(("field", "url"), [
    ("config.ckpt.url", "s3://AKIA:secret@bucket/ckpt"),
    ("config.weights.url", "s3://bucket/w?X-Amz-Signature=abc"),
    ("config.orchestrator.judge.base_urls", "http://user:pw@judge:8000/v1"),
    ("config.trainer.compile_cache_url", "gs://b/cache?access_token=x"),
])
def test_credentials_in_a_config_url_are_refused_at_admission(field, url):
    """The CRD's own rules (the API server evaluates them, here as e2e/localcluster/admission.py
    does), before the spec is stored where `view` reads it."""
    obj = run()
    node = obj["spec"]
    *parents, leaf = field.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = [url] if leaf.endswith("urls") else url
    out = admission.check(SCHEMAS["RLRun"], obj)
    shown = f"spec.{field}" + ("[]" if leaf.endswith("urls") else "")
    assert any(f"{shown} must not hold credentials" in m for m in out), out
    assert admission.check(SCHEMAS["RLRun"], run()) == []


def spec_of(size: int) -> dict:
    """The example run with env variables to about `size` bytes of spec JSON."""
    obj = run()
    pod = obj["spec"].setdefault("trainer", {}).setdefault("pod", {})
    pod["env"] = [{"name": f"V{i}", "value": "x" * 120} for i in range(size // 140)]
    return obj


def test_a_256_kb_spec_is_refused_at_admission_and_by_the_operator_before_any_rule(monkeypatch):
    big = spec_of(256 * 1024)
    # Admission: the CRD's schema bounds each list (the API server names the size).
    with pytest.raises(jsonschema.ValidationError, match="is too long"):
        jsonschema.Draft4Validator(SCHEMAS["RLRun"]).validate(big)
    # Within every list bound still too large (one long value): the operator refuses it by its
    # size, before the CEL (about 5 s of CPU for such a spec on a 2-core x86 VM with cel-python).
    bounded = run()
    bounded["spec"]["trainer"]["pod"] = {"env": [{"name": "BLOB", "value": "x" * 256 * 1024}]}
    jsonschema.Draft4Validator(SCHEMAS["RLRun"]).validate(bounded)
    def no_rule(*_):
        raise AssertionError("a CEL rule was evaluated for a spec over the size limit")

    monkeypatch.setattr(guardrails, "_evaluate", no_rule)
    (out,) = operator_refusals(bounded)
    size = len(json.dumps(bounded["spec"] | {"securityContext": bounded["spec"]["securityContext"]},
                          separators=(",", ":")))
    assert out.startswith("spec is ") and "more than the 65536 the cluster admin allows (guardrails.maxSpecBytes)" in out
    assert abs(int(out.split()[2]) - size) < 1024


@pytest.mark.usefixtures("crd_rules_off")
async def test_a_patched_applied_spec_configmap_is_refused(cluster):
    """Whoever may patch ConfigMaps rewrites `<run>-config`'s applied spec, which a started run
    keeps: a copy the operator did not sign runs only within the guardrails, else the run fails
    naming the rule, and nothing refused is realised."""
    await cluster.create(rlrun())
    await start_everything(cluster)
    applied = json.loads(cluster.get("ConfigMap", "rt-config")["data"][APPLIED_SPEC_KEY])
    patched = copy.deepcopy(applied)
    patched["trainer"]["pod"] = {"volumes": [{"name": "host", "hostPath": {"path": "/"}}]}
    await cluster.patch("ConfigMap", "rt-config", {"data": {APPLIED_SPEC_KEY: json.dumps(patched)}})
    status = await cluster.until(lambda: cluster.status("RLRun", "rt").get("phase") == "Failed"
                                 and cluster.status("RLRun", "rt"), timeout=60, what="refused")
    accepted = condition(status, "SpecAccepted")
    assert accepted["reason"] == "UntrustedSpec"
    assert "not one this operator signed" in accepted["message"]
    assert "spec.trainer.pod.volumes: volume host is a hostPath volume" in accepted["message"]
    assert "hostPath" not in json.dumps(cluster.get("Job", "rt-trainer-0")["spec"]["template"])
    assert not cluster.names("Deployment")  # its servers went


def test_a_spec_at_the_size_limit_passes_the_guardrails(record_property):
    """The largest spec the operator evaluates; its CPU time is recorded, not bounded (a timed
    assertion fails on a busy machine): the figure docs/security.md gives."""
    at_limit = spec_of(60 * 1024)
    at_limit["spec"]["trainer"]["pod"]["env"] = at_limit["spec"]["trainer"]["pod"]["env"][:128]
    jsonschema.Draft4Validator(SCHEMAS["RLRun"]).validate(at_limit)
    start = time.process_time()
    assert operator_refusals(at_limit) == []
    record_property("guardrails CPU s at the size limit", round(time.process_time() - start, 2))


def test_the_crd_bounds_every_list_the_guardrails_walk():
    schema = crd.build_crd("RLRun")["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    pod = schema["properties"]["trainer"]["properties"]["pod"]["properties"]
    for name in ("env", "envFrom", "volumes", "tolerations", "topologySpreadConstraints"):
        assert pod[name]["maxItems"] <= 128, name
    for name in ("labels", "annotations", "nodeSelector"):
        assert pod[name]["maxProperties"] <= 32, name
    assert schema["properties"]["imagePullSecrets"]["maxItems"] == 16


async def test_a_run_started_before_the_admin_tightened_a_rule_is_told_the_rule_and_goes_on(kmock, orchestrator_status):
    """A run tolerating another team's taint, started while the guardrails allowed it; the admin
    then tightens `allowedTolerations` (the operator restarts with the new values). The run is
    not stopped (the documented choice: it keeps its applied spec, signed when it was checked):
    its `SpecAccepted` turns False naming the field and the value, once, with a Warning event,
    and it goes on. The admin stops it by deleting it."""
    toleration = {"key": "team-b/gpu", "operator": "Exists", "effect": "NoSchedule"}
    pacing = {"interval": 0.3, "progress_interval": 0.0}
    async with running_operator(kmock, orchestrator_status.url, **pacing) as cluster:
        await cluster.create(rlrun(trainer={"pod": {"tolerations": [toleration]}}))
        await start_everything(cluster)
    tightened = PERMISSIVE.model_copy(update={"allowed_tolerations": []})
    async with running_operator(kmock, orchestrator_status.url, settings={"guardrails": tightened}, **pacing) as cluster:
        status = await cluster.until(
            lambda: condition(cluster.status("RLRun", "rt"), "SpecAccepted")["status"] == "False"
            and cluster.status("RLRun", "rt"), timeout=30, what="the tightened rule named")
        accepted = condition(status, "SpecAccepted")
        assert accepted["reason"] == "InvalidSpec"
        assert "forbidden by the guardrails: spec.trainer.pod.tolerations: a toleration of taint team-b/gpu" \
            in accepted["message"]
        assert "guardrails.allowedTolerations" in accepted["message"]
        await asyncio.sleep(1)  # more passes: it goes on, and says so once
        assert cluster.status("RLRun", "rt")["phase"] == "Running"
        assert toleration in cluster.get("Job", "rt-trainer-0")["spec"]["template"]["spec"]["tolerations"]
        told = [e for e in cluster.events() if e["reason"] == "InvalidSpec"]
        assert len(told) == 1 and told[0]["type"] == "Warning" and "team-b/gpu" in told[0]["message"]


ROTATED_KEY = b"the operator's key after a rotation, in the fence tests"


async def test_a_key_rotation_leaves_a_run_started_before_a_tightening_going_on(kmock, orchestrator_status):
    """The admin rotates the operator's key (docs/security.md, rotating the key) after tightening
    a rule that a running run breaks. Under the new key with the old one given as the previous
    key, the run's applied spec is still the operator's own: it goes on, told the rule
    (`InvalidSpec`, as without the rotation), and its ConfigMap is signed again with the new key,
    so it goes on when the previous key is taken away. Without the previous key, the old
    signature is no signature: the spec breaks the rule and the run fails (`UntrustedSpec`)."""
    toleration = {"key": "team-b/gpu", "operator": "Exists", "effect": "NoSchedule"}
    pacing = {"interval": 0.3, "progress_interval": 0.0}
    tightened = PERMISSIVE.model_copy(update={"allowed_tolerations": []})

    def spec_accepted(cluster):
        status = cluster.status("RLRun", "rt")
        return next((c for c in status.get("conditions", []) if c["type"] == "SpecAccepted"), {})

    async with running_operator(kmock, orchestrator_status.url, **pacing) as cluster:
        await cluster.create(rlrun(trainer={"pod": {"tolerations": [toleration]}}))
        await start_everything(cluster)
    signed_before = cluster.get("ConfigMap", "rt-config")["data"][APPLIED_SPEC_SIGNATURE_KEY]
    rotating = {"guardrails": tightened, "token_key": ROTATED_KEY, "previous_token_key": TOKEN_KEY}
    async with running_operator(kmock, orchestrator_status.url, settings=rotating, **pacing) as cluster:
        await cluster.until(lambda: spec_accepted(cluster).get("reason") == "InvalidSpec"
                            and cluster.get("ConfigMap", "rt-config")["data"][APPLIED_SPEC_SIGNATURE_KEY]
                            != signed_before, timeout=30, what="told the rule, and signed again")
    rotated = {"guardrails": tightened, "token_key": ROTATED_KEY}
    async with running_operator(kmock, orchestrator_status.url, settings=rotated, **pacing) as cluster:
        await asyncio.sleep(1)  # passes under the new key alone
        assert spec_accepted(cluster)["reason"] == "InvalidSpec", spec_accepted(cluster)
        assert cluster.status("RLRun", "rt")["phase"] == "Running"
        assert toleration in cluster.get("Job", "rt-trainer-0")["spec"]["template"]["spec"]["tolerations"]
    never_given = {"guardrails": tightened, "token_key": b"a third key, the previous one never given, in tests"}
    async with running_operator(kmock, orchestrator_status.url, settings=never_given, **pacing) as cluster:
        await cluster.until(lambda: spec_accepted(cluster).get("reason") == "UntrustedSpec", timeout=30,
                            what="an applied spec signed by no key it has")


async def test_guardrails_in_warn_mode_post_one_warning_and_the_run_goes_on_checked_once(kmock, orchestrator_status,
                                                                                        monkeypatch):
    """`validationActions: [Warn, Audit]`: a run the guardrails would refuse is realised, with one
    Warning event naming the rule, and its spec's CEL is evaluated once, not on every pass."""
    from rlkube_operator import reconcile

    evaluated = []
    monkeypatch.setattr(reconcile, "refusals", lambda obj, g: evaluated.append(obj) or guardrails.refusals(obj, g))
    toleration = {"key": "team-b/gpu", "operator": "Exists", "effect": "NoSchedule"}
    warn = PERMISSIVE.model_copy(update={"allowed_tolerations": [], "validation_actions": ["Warn", "Audit"]})
    async with running_operator(kmock, orchestrator_status.url, settings={"guardrails": warn},
                                interval=0.3, progress_interval=0.0) as cluster:
        await cluster.create(rlrun(trainer={"pod": {"tolerations": [toleration]}}))
        await start_everything(cluster)
        await asyncio.sleep(1)  # more passes over the same spec
        assert cluster.status("RLRun", "rt")["phase"] == "Running"
        assert toleration in cluster.get("Job", "rt-trainer-0")["spec"]["template"]["spec"]["tolerations"]
        told = [e for e in cluster.events() if e["reason"] == "Forbidden"]
        assert len(told) == 1 and told[0]["type"] == "Warning" and "team-b/gpu" in told[0]["message"]
        assert len(evaluated) == 1, f"the same spec's guardrails were evaluated {len(evaluated)} times"
