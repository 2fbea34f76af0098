"""What a run may ask of the pods the operator creates for it: the guardrails, defined once as
CEL and enforced twice.

Creating an RLRun makes the operator create pods as its own service account, so whoever may
create a run could otherwise ask for anything below. The rules are `VALIDATIONS`, CEL over the
run (`object`) and `variables`: what the cluster admin allows (`Guardrails`, the chart's
`guardrails` values) and what the run itself implies (`DERIVED`). They are enforced
- by the API server at admission: the chart's ValidatingAdmissionPolicy takes its variables
  from the values and the rest from `helm/rlkube/files/guardrails.yaml`, which
  `python -m rlkube_operator.crd` writes from this module (a test keeps it fresh);
- by the operator, on every spec it reconciles (`refusals`, with cel-python), so a cluster
  without the policy (Kubernetes < 1.30, `guardrails.enabled=false`, CRDs applied without
  the chart) is still guarded. A refused spec is an invalid one: its run fails before it
  starts, or keeps its applied spec, with the refusal in its status and events.
Each refusal names the field and the value that lets it.
"""

import functools
import json
from typing import Literal

from pydantic import Field

from rlkube_operator.egress import Destination
from rlkube_operator.schema import K8sModel


class Guardrails(K8sModel):
    """What the cluster admin allows a run to ask for (Helm `guardrails`; the operator's
    `--guardrails`). Lists take `"*"` for any."""

    validation_actions: list[Literal["Deny", "Warn", "Audit"]] = Field(default_factory=lambda: ["Deny"], min_length=1)
    """`[Deny]` refuses; `[Warn, Audit]` tries the guardrails first (the operator then posts a
    Warning event and goes on)."""

    allowed_image_registries: list[str] = Field(default_factory=lambda: ["ghcr.io/rlkube/"])
    """Prefixes a run's `spec.image` must start with ("registry/path/")."""

    allowed_service_accounts: list[str] = Field(default_factory=list)
    """ServiceAccounts the pods may run as (`serviceAccountName`, run-level and per component).
    None: the pods run as the namespace's `default`, without its token."""

    allowed_priority_classes: list[str] = Field(default_factory=list)
    """PriorityClasses the pods may ask for (a high one preempts other teams' pods)."""

    allowed_runtime_classes: list[str] = Field(default_factory=list)
    """RuntimeClasses the pods may ask for (for example `nvidia`)."""

    allowed_schedulers: list[str] = Field(default_factory=list)
    """`schedulerName`s the pods may ask for (a gang scheduler such as `volcano`); none: the
    default scheduler."""

    allowed_queue_priority_classes: list[str] = Field(default_factory=list)
    """Kueue WorkloadPriorityClasses a run may ask for (`queue.priorityClassName`)."""

    allowed_volume_types: list[str] = Field(default_factory=lambda: [
        "configMap", "downwardAPI", "emptyDir", "persistentVolumeClaim", "projected", "secret"])
    """Volume types a run's extra volumes may be. `csi` and `ephemeral` (a new claim, which may
    clone another run's), `hostPath` and `nfs` only if you trust every run's author."""

    allowed_secrets: list[str] = Field(default_factory=list)
    """Secrets a run may name (env, envFrom, volumes, `storage.objectStore`, `imagePullSecrets`)
    besides its own (`<run>-token`); `"*"` any but `protected_secrets`."""

    allowed_claims: list[str] = Field(default_factory=list)
    """PersistentVolumeClaims a run may name (`storage.pvc.claimName`, volumes, an ephemeral
    volume's data source) besides its own (`<run>-data`); `"*"` any."""

    allowed_config_maps: list[str] = Field(default_factory=list)
    """ConfigMaps a run may name (env, envFrom, volumes) besides its own (`<run>-config`); `"*"` any."""

    allowed_reference_labels: dict[str, str] = Field(default_factory=dict)
    """Secrets, claims and ConfigMaps carrying every one of these labels may be named too. The
    API server cannot see an object's labels at admission: with labels set, a name not listed
    passes admission and the operator, which reads the object, refuses it if it lacks them."""

    protected_secrets: list[str] = Field(default_factory=list)
    """Secrets no run may name, whatever the lists say: the operator's token key (the chart sets
    it)."""

    allow_service_account_tokens: bool = False
    """Let runs mount a `projected` `serviceAccountToken` (a token for the pods' service account,
    whatever `automountServiceAccountToken` says)."""

    allowed_tolerations: list[str] = Field(default_factory=list)
    """Taint keys the pods may tolerate (`"*"` any key); none: the cluster's general pool, whose
    nodes have no taint. A taint marks a pool (another team's GPUs, the control plane)."""

    allowed_node_labels: list[str] = Field(default_factory=lambda: ["kubernetes.io/arch", "kubernetes.io/os"])
    """Node labels `nodeSelector` and node affinity (required and preferred) may name, as `key`
    (any value) or `key=value`; `"*"` any. A node label chooses a pool, or a node by name."""

    allow_pod_affinity: bool = False
    """Let runs ask for `podAffinity`/`podAntiAffinity` (to land beside, or away from, other
    workloads' pods, which it names by their labels)."""

    allowed_extended_resources: list[str] = Field(default_factory=list)
    """Resources beyond `cpu`, `memory`, `ephemeral-storage` and `hugepages-*` that a component's
    `resources` may ask for (`"*"` any). GPUs come from the `gpus` fields, which the operator turns
    into its own requests."""

    allowed_annotations: list[str] = Field(default_factory=lambda: ["cluster-autoscaler.kubernetes.io/safe-to-evict"])
    """Pod annotation keys a run may set; an entry ending in `*` is a prefix, `"*"` any. Keys that
    change the pods' confinement or add containers (AppArmor, seccomp, service-mesh injection:
    `CONFINING_ANNOTATIONS`) pass only when listed exactly, never through a prefix or `"*"`."""

    allowed_label_prefixes: list[str] = Field(default_factory=lambda: ["user.rlkube.dev/"])
    """Prefixes the keys of a run's pod labels must start with (`"*"` any). A label with a key
    other workloads' selectors use (`app`, `role`) would put the run's pods behind their Services
    and NetworkPolicy peers; a prefix of the run authors' own keeps labels out of those."""

    allowed_egress: list[Destination] = Field(default_factory=list)
    """Destinations a run may ask to connect to (`spec.network.egress`), beyond what the egress
    policy opens to every run: a run's CIDR must be one listed here, its ports among those listed
    (none listed: any). Empty: none."""

    max_spec_bytes: int = Field(default=65536, ge=1024)
    """The largest spec (its JSON) a run may have; the operator refuses a larger one before any
    rule. At admission the CRD bounds each list and string (`crd.py`)."""

    allow_root: bool = False
    """Let runs ask for root (`securityContext.runAsUser/runAsGroup/fsGroup: 0`,
    `runAsNonRoot: false`). Containers still drop every capability and never escalate."""

    allow_unconfined_seccomp: bool = False
    """Let runs ask for `securityContext.seccompProfile.type: Unconfined`."""

    allow_tolerate_all: bool = False
    """Let runs tolerate every taint (a toleration with `operator: Exists` and no key)."""

    def variables(self) -> list[dict]:
        """The policy's variables from these values, as the chart renders them, then `DERIVED`."""
        values = self.model_dump(by_alias=True, exclude={"validation_actions", "max_spec_bytes"})
        return [{"name": k, "expression": json.dumps(v, separators=(",", ":"))}  # Helm's toJson
                for k, v in sorted(values.items())] + DERIVED

    @property
    def enforced(self) -> bool:
        return "Deny" in self.validation_actions


CONFINING_ANNOTATIONS = [
    "container.apparmor.security.beta.kubernetes.io/", "seccomp.security.alpha.kubernetes.io/",
    "container.seccomp.security.alpha.kubernetes.io/", "sidecar.istio.io/", "proxy.istio.io/",
    "traffic.sidecar.istio.io/", "istio.io/", "linkerd.io/", "config.linkerd.io/", "kuma.io/",
    "consul.hashicorp.com/", "vault.hashicorp.com/"]
"""Annotation prefixes that unconfine a pod (AppArmor, seccomp) or inject containers into it
(service meshes, Vault's agent): allowed only by an exact `allowedAnnotations` entry."""
STANDARD_RESOURCES = ["cpu", "memory", "ephemeral-storage"]
OWN = {"Secret": "token", "PersistentVolumeClaim": "data", "ConfigMap": "config"}
"""The child the operator makes for a run, of each kind a spec can name (`RunRef.child`)."""
ALLOWED = {"Secret": "allowedSecrets", "PersistentVolumeClaim": "allowedClaims", "ConfigMap": "allowedConfigMaps"}
DERIVED = [
    {"name": "confiningAnnotations", "expression": json.dumps(CONFINING_ANNOTATIONS)},
    {"name": "standardResources", "expression": json.dumps(STANDARD_RESOURCES)},
    *({"name": f"own{kind}", "expression": (
        f"object.metadata.name + '-' + (object.kind == 'SFTRun' ? 'sft-' : '') + '{child}'")}
      for kind, child in OWN.items()),
]
"""Variables that come from the run, not from the values."""

COMPONENTS = ("inference", "orchestrator", "trainer", "envWorkers", "toolService", "teacher", "judge")

POD_REFERENCES = [
    ("env", "valueFrom.secretKeyRef.name", "Secret"),
    ("env", "valueFrom.configMapKeyRef.name", "ConfigMap"),
    ("envFrom", "secretRef.name", "Secret"),
    ("envFrom", "configMapRef.name", "ConfigMap"),
    ("volumes", "secret.secretName", "Secret"),
    ("volumes", "configMap.name", "ConfigMap"),
    ("volumes", "persistentVolumeClaim.claimName", "PersistentVolumeClaim"),
    ("volumes", "projected.sources[].secret.name", "Secret"),
    ("volumes", "projected.sources[].configMap.name", "ConfigMap"),
    ("volumes", "ephemeral.volumeClaimTemplate.spec.dataSource.name", "PersistentVolumeClaim"),
    ("volumes", "ephemeral.volumeClaimTemplate.spec.dataSourceRef.name", "PersistentVolumeClaim"),
    ("volumes", "csi.nodePublishSecretRef.name", "Secret"),
    ("volumes", "azureFile.secretName", "Secret"),
    *(("volumes", f"{t}.secretRef.name", "Secret") for t in ("cephfs", "cinder", "flexVolume", "iscsi", "rbd",
                                                             "scaleIO", "storageos")),
]
"""Every field of a component's `pod` (and the Kubernetes volume types) that names a Secret,
claim or ConfigMap: (list, path in an item with `[]` for a list inside it, kind)."""
RUN_REFERENCES = [
    ("storage.pvc.claimName", "PersistentVolumeClaim"),
    ("export.claimName", "PersistentVolumeClaim"),
    ("storage.objectStore.secretName", "Secret"),
    ("storage.objectStore.readOnlySecretName", "Secret"),
    ("imagePullSecrets[]", "Secret"),
]
"""The run-level fields that name one."""


def _places() -> list[tuple[str, str, str]]:
    """Where pod settings live: (path shown, CEL reference, CEL "it is set")."""
    pods = [(f"spec.{c}.pod", f"object.spec.{c}.pod", f"has(object.spec.{c}) && has(object.spec.{c}.pod)")
            for c in COMPONENTS]
    return [("spec.scheduling", "object.spec.scheduling", "has(object.spec.scheduling)"), *pods]


def _rule(expression: str, message: str, shown: str | None = None) -> dict:
    """A validation; `shown`: a CEL message naming the value (`message` if it cannot evaluate)."""
    rule = {"expression": expression, "message": message, "reason": "Forbidden"}
    return rule | ({"messageExpression": shown} if shown else {})


def _listed(allowed: str, value: str) -> str:
    return f"variables.{allowed}.exists(a, a == '*' || a == {value})"


def _name_list_rules(path: str, ref: str, is_set: str, field: str, allowed: str) -> dict:
    value = f"{ref}.{field}"
    return _rule(f"!({is_set}) || !has({value}) || {_listed(allowed, value)}",
                 f"{path}.{field} is not allowed by the cluster admin (guardrails.{allowed})",
                 f"'{path}.{field} ' + {value} + ' is not allowed by the cluster admin (guardrails.{allowed})'")


def _present(ref: str, path: str) -> str:
    """CEL: every step of the dotted `path` below `ref` is set."""
    steps = path.split(".")
    return " && ".join(f"has({ref}.{'.'.join(steps[:i + 1])})" for i in range(len(steps)))


def _may_name(kind: str, name: str) -> str:
    """CEL: a run may name this `kind` (its own, one the admin lists, or one the operator checks
    by label; never a protected Secret)."""
    ok = (f"{name} == variables.own{kind} || {_listed(ALLOWED[kind], name)} || "
          "size(variables.allowedReferenceLabels) > 0")
    return f"(!({name} in variables.protectedSecrets) && ({ok}))" if kind == "Secret" else f"({ok})"


def _each(items: str, path: str, kind: str, depth: int = 0) -> tuple[str, str]:
    """CEL over the list `items`: (every item names only what a run may, the first name it may not)."""
    x = "xyz"[depth]
    head, nested, rest = path.partition("[].")
    if nested:
        inner, _ = _each(f"{x}.{head}", rest, kind, depth + 1)
        ok = f"!({_present(x, head)}) || {inner}"
        _, shown = _each(f"{items}.filter({x}, !({ok}))[0].{head}", rest, kind, depth + 1)
        return f"{items}.all({x}, {ok})", shown
    name = f"{x}.{path}" if path else x
    ok = f"!({_present(x, path)}) || {_may_name(kind, name)}" if path else _may_name(kind, name)
    return f"{items}.all({x}, {ok})", f"{items}.filter({x}, !({ok}))[0]" + (f".{path}" if path else "")


def _reference_rule(shown_at: str, at: str, items: str | None, path: str, kind: str) -> dict:
    """The rule for one field that names a `kind`; `items`: the list it is in (None: a field)."""
    if items is None:
        name = f"{at}.{path}"
        expression, offender = f"!({_present(at, path)}) || {_may_name(kind, name)}", name
    else:
        expression, offender = _each(items, path, kind)
        expression = f"!has({items}) || {expression}"
    own = f"<run>-{OWN[kind]}"
    why = f"is not the run's own ({own}) nor one the cluster admin allows (guardrails.{ALLOWED[kind]})"
    field = shown_at + "." + (path if items is None else f"{items.rsplit('.', 1)[1]}[].{path}".rstrip("."))
    shown = why.replace("'", "\\'")
    return _rule(expression, f"{field}: a {kind} that {why}", f"'{field}: {kind} ' + {offender} + ' {shown}'")


def _node_label(key: str, value: str) -> str:
    return f"variables.allowedNodeLabels.exists(a, a == '*' || a == {key} || a == {key} + '=' + {value})"


def _node_terms(terms: str) -> str:
    """CEL: NodeSelectorTerms (or preferences) name only node labels the admin allows."""
    expression = (f"(!has(e.values) || e.operator != 'In' || size(e.values) == 0 ? {_node_label('e.key', 'e.key')} : "
                  f"e.values.all(v, {_node_label('e.key', 'v')}))")
    return (f"{terms}.all(t, (!has(t.matchFields) || t.matchFields.all(e, {_node_label('e.key', 'e.key')}))"
            f" && (!has(t.matchExpressions) || t.matchExpressions.all(e, {expression})))")


def _pod_rules(path: str, ref: str, is_set: str) -> list[dict]:
    """What a component's `pod` section (or the run-level `scheduling`) may ask for."""
    at = f"!({is_set}) || "
    rules = [_name_list_rules(path, ref, is_set, "priorityClassName", "allowedPriorityClasses"),
             _name_list_rules(path, ref, is_set, "schedulerName", "allowedSchedulers")]
    tolerations = f"!has({ref}.tolerations) || {ref}.tolerations"
    untolerated = f"!has(t.key) || t.key == '' || {_listed('allowedTolerations', 't.key')}"
    selector = f"{ref}.nodeSelector"
    unselected = _node_label("k", f"{selector}[k]")
    rules += [
        _rule(f"variables.allowTolerateAll || {at}{tolerations}.all(t, !has(t.operator) || t.operator != 'Exists'"
              " || (has(t.key) && t.key != ''))",
              f"{path}.tolerations: a toleration with operator Exists and no key tolerates every taint (the control "
              "plane's, NoExecute evictions); name the taint's key (guardrails.allowTolerateAll lets it)"),
        _rule(f"{at}{tolerations}.all(t, {untolerated})",
              f"{path}.tolerations: a toleration of a taint the cluster admin does not allow (guardrails."
              "allowedTolerations): a taint keeps a node pool for others",
              f"'{path}.tolerations: a toleration of taint ' + {ref}.tolerations.filter(t, !({untolerated}))[0].key"
              " + ', which the cluster admin does not allow (guardrails.allowedTolerations): a taint keeps a node "
              "pool for others'"),
        _rule(f"{at}!has({selector}) || {selector}.all(k, {unselected})",
              f"{path}.nodeSelector: a node label the cluster admin does not allow (guardrails.allowedNodeLabels)",
              f"'{path}.nodeSelector: node label ' + {selector}.filter(k, !({unselected}))[0] + ' is not allowed by "
              "the cluster admin (guardrails.allowedNodeLabels): it chooses a node pool or a node'"),
    ]
    if path == "spec.scheduling":
        return rules
    node = f"{ref}.affinity.nodeAffinity"
    required, preferred = (f"{node}.requiredDuringSchedulingIgnoredDuringExecution",
                           f"{node}.preferredDuringSchedulingIgnoredDuringExecution")
    volumes = f"!has({ref}.volumes) || {ref}.volumes"
    offending_volume = f"{ref}.volumes.filter(v, !v.all(k, k == 'name' || k in variables.allowedVolumeTypes))[0]"
    no_node = f"{at}!has({ref}.affinity) || !has({node})"
    labels = "variables.allowedLabelPrefixes.exists(p, p == '*' || k.startsWith(p))"
    annotation = ("variables.allowedAnnotations.exists(a, a == k) || (!variables.confiningAnnotations.exists(p, "
                  "k.startsWith(p)) && variables.allowedAnnotations.exists(a, a == '*' || (a.endsWith('/') && "
                  "k.startsWith(a))))")
    rules += [
        _name_list_rules(path, ref, is_set, "serviceAccountName", "allowedServiceAccounts"),
        _name_list_rules(path, ref, is_set, "runtimeClassName", "allowedRuntimeClasses"),
        _rule(f"{no_node} || ((!has({required}) || !has({required}.nodeSelectorTerms) || "
              f"{_node_terms(f'{required}.nodeSelectorTerms')}) && (!has({preferred}) || "
              f"{_node_terms(f'{preferred}.map(p, p.preference)')}))",
              f"{path}.affinity.nodeAffinity: a node label or field the cluster admin does not allow "
              "(guardrails.allowedNodeLabels): it chooses a node pool or a node"),
        _rule(f"variables.allowPodAffinity || {at}!has({ref}.affinity) || (!has({ref}.affinity.podAffinity) && "
              f"!has({ref}.affinity.podAntiAffinity))",
              f"{path}.affinity: podAffinity and podAntiAffinity place the pods by other workloads' pods, which "
              "the cluster admin does not allow (guardrails.allowPodAffinity)"),
        _rule(f"{at}!has({ref}.labels) || {ref}.labels.all(k, {labels})",
              f"{path}.labels: a label key outside the prefixes the cluster admin allows "
              "(guardrails.allowedLabelPrefixes)",
              f"'{path}.labels: label ' + {ref}.labels.filter(k, !({labels}))[0] + ' is outside the prefixes the "
              "cluster admin allows (guardrails.allowedLabelPrefixes): it could match other workloads\\' "
              "selectors'"),
        _rule(f"{at}!has({ref}.annotations) || {ref}.annotations.all(k, {annotation})",
              f"{path}.annotations: an annotation the cluster admin does not allow (guardrails.allowedAnnotations)",
              f"'{path}.annotations: annotation ' + {ref}.annotations.filter(k, !({annotation}))[0] + ' is not "
              "allowed by the cluster admin (guardrails.allowedAnnotations; AppArmor, seccomp and mesh "
              "injection keys only by their exact key)'"),
        _rule(f"{at}{volumes}.all(v, v.all(k, k == 'name' || k in variables.allowedVolumeTypes))",
              f"{path}.volumes: a volume of a type the cluster admin does not allow (guardrails.allowedVolumeTypes)",
              f"'{path}.volumes: volume ' + {offending_volume}.name + ' is a ' + {offending_volume}.filter(k, "
              "k != 'name' && !(k in variables.allowedVolumeTypes))[0] + ' volume, a type the cluster admin does "
              "not allow (guardrails.allowedVolumeTypes)'"),
        _rule(f"variables.allowServiceAccountTokens || {at}{volumes}.all(v, !has(v.projected) || "
              "!has(v.projected.sources) || v.projected.sources.all(s, !has(s.serviceAccountToken)))",
              f"{path}.volumes: a projected serviceAccountToken is a token for the pods' service account, which the "
              "cluster admin does not allow (guardrails.allowServiceAccountTokens)"),
    ]
    rules += [{**r, "expression": f"{at}{r['expression']}"}
              for r in (_reference_rule(path, ref, f"{ref}.{items}", item, kind)
                        for items, item, kind in POD_REFERENCES)]
    return rules


def _resource_rules(component: str) -> dict:
    """A component's `resources` ask only for what the admin allows."""
    resources = f"object.spec.{component}.resources"
    extra = ("k in variables.standardResources || k.startsWith('hugepages-') || "
             f"{_listed('allowedExtendedResources', 'k')}")
    fine = {f: f"(!has({resources}.{f}) || {resources}.{f}.all(k, {extra}))" for f in ("requests", "limits")}
    first = {f: f"{resources}.{f}.filter(k, !({extra}))[0]" for f in fine}
    return _rule(f"!has(object.spec.{component}) || !has({resources}) || ({fine['requests']} && {fine['limits']})",
                 f"spec.{component}.resources: a resource the cluster admin does not allow "
                 "(guardrails.allowedExtendedResources)",
                 f"'spec.{component}.resources: ' + ({fine['requests']} ? {first['limits']} : {first['requests']}) + "
                 "' is not allowed by the cluster admin (guardrails.allowedExtendedResources)'")


def _run_rules() -> list[dict]:
    """What the run-level fields may ask for."""
    spec = "object.spec"
    rules = [
        _rule(f"variables.allowedImageRegistries.exists(r, r == '*' || {spec}.image.startsWith(r))",
              "spec.image is not from a registry the cluster admin allows (guardrails.allowedImageRegistries)",
              f"'spec.image ' + {spec}.image + ' is not from a registry the cluster admin allows "
              "(guardrails.allowedImageRegistries)'"),
        _name_list_rules("spec", spec, "true", "serviceAccountName", "allowedServiceAccounts"),
        _name_list_rules("spec.queue", f"{spec}.queue", f"has({spec}.queue)", "priorityClassName",
                         "allowedQueuePriorityClasses"),
    ]
    for path, kind in RUN_REFERENCES:
        listed, _, _ = path.partition("[]")
        rules.append(_reference_rule("spec", spec, f"{spec}.{listed}", "", kind) if path.endswith("[]")
                     else _reference_rule("spec", spec, None, path, kind))
    rules += [_resource_rules(c) for c in COMPONENTS]
    egress = f"{spec}.network.egress"
    allowed = ("variables.allowedEgress.exists(a, a.cidr == d.cidr && (!has(a.ports) || size(a.ports) == 0 || "
               "(has(d.ports) && size(d.ports) > 0 && d.ports.all(p, p in a.ports))))")
    rules.append(_rule(f"!has({spec}.network) || !has({egress}) || {egress}.all(d, {allowed})",
                       "spec.network.egress: a destination the cluster admin does not allow (guardrails.allowedEgress)",
                       f"'spec.network.egress: ' + {egress}.filter(d, !({allowed}))[0].cidr + ' (on those ports) is "
                       "not a destination the cluster admin allows (guardrails.allowedEgress)'"))
    context = f"{spec}.securityContext"
    rules.append(_rule(f"variables.allowRoot || !has({context}) || !has({context}.runAsNonRoot) || "
                       f"{context}.runAsNonRoot != false",
                       "spec.securityContext.runAsNonRoot: false lets the pods run as root, which the cluster admin "
                       "does not allow (guardrails.allowRoot)"))
    rules += [_rule(f"variables.allowRoot || !has({context}) || !has({context}.{f}) || {context}.{f} != 0",
                    f"spec.securityContext.{f}: 0 is root, which the cluster admin does not allow (guardrails.allowRoot)")
              for f in ("runAsUser", "runAsGroup", "fsGroup")]
    rules.append(_rule(f"variables.allowUnconfinedSeccomp || !has({context}) || !has({context}.seccompProfile) || "
                       f"{context}.seccompProfile.type != 'Unconfined'",
                       "spec.securityContext.seccompProfile.type: Unconfined runs the pods without a seccomp profile, "
                       "which the cluster admin does not allow (guardrails.allowUnconfinedSeccomp)"))
    return rules


VALIDATIONS = [*_run_rules(), *(r for place in _places() for r in _pod_rules(*place))]
"""The rules, in the order the policy lists them."""


def chart_file() -> dict:
    """`helm/rlkube/files/guardrails.yaml`: what the chart's policy takes from this module."""
    return {"variables": DERIVED, "validations": VALIDATIONS}


class GuardrailError(Exception):
    """A guardrail's expression failed to evaluate (the API server then refuses the request)."""


@functools.cache
def _program(expression: str):
    import celpy

    env = celpy.Environment()
    return env.program(env.compile(expression))


def _evaluate(expression: str, activation: dict):
    import celpy

    value = _program(expression).evaluate(activation)
    if isinstance(value, celpy.CELEvalError):
        raise GuardrailError(f"guardrail {expression!r} failed to evaluate: {value}")
    return value


def refusals(run: dict, guardrails: Guardrails) -> list[str]:
    """The message of each guardrail `run` (the object as stored: kind, metadata, spec with
    the CRD's defaults) breaks; empty when it breaks none."""
    import celpy

    activation = {"object": celpy.json_to_cel(run)}
    variables = {}
    for variable in guardrails.variables():
        activation["variables"] = celpy.celtypes.MapType(variables)
        variables[variable["name"]] = _evaluate(variable["expression"], activation)
    activation["variables"] = celpy.celtypes.MapType(variables)
    out = []
    for rule in VALIDATIONS:
        if not _evaluate(rule["expression"], activation):
            try:
                out.append(str(_evaluate(rule["messageExpression"], activation)) if "messageExpression" in rule
                           else rule["message"])
            except GuardrailError:  # as the API server does: the static message instead
                out.append(rule["message"])
    return out
