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

    allowed_shared_names: list[str] = Field(default_factory=list)
    """Claims named `*-data` and Secrets named `*-token` (the names of the claim and token Secret
    the operator makes for a run) that a run may still use although they are not its own."""

    allow_service_account_tokens: bool = False
    """Let runs mount a `projected` `serviceAccountToken` (a token for the pods' service account,
    whatever `automountServiceAccountToken` says)."""

    allow_node_pinning: bool = False
    """Let runs tolerate the control plane's taints and choose nodes by name or control-plane
    role (`nodeSelector` or required node affinity on `PINNING_KEYS`)."""

    allow_root: bool = False
    """Let runs ask for root (`securityContext.runAsUser/runAsGroup/fsGroup: 0`,
    `runAsNonRoot: false`). Containers still drop every capability and never escalate."""

    allow_unconfined_seccomp: bool = False
    """Let runs ask for `securityContext.seccompProfile.type: Unconfined`."""

    allow_tolerate_all: bool = False
    """Let runs tolerate every taint (a toleration with `operator: Exists` and no key)."""

    def variables(self) -> list[dict]:
        """The policy's variables from these values, as the chart renders them, then `DERIVED`."""
        values = self.model_dump(by_alias=True, exclude={"validation_actions"})
        return [{"name": k, "expression": json.dumps(v, separators=(",", ":"))}  # Helm's toJson
                for k, v in sorted(values.items())] + DERIVED

    @property
    def enforced(self) -> bool:
        return "Deny" in self.validation_actions


CONTROL_PLANE_TAINTS = ["node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master"]
PINNING_KEYS = [*CONTROL_PLANE_TAINTS, "kubernetes.io/hostname"]
DERIVED = [
    {"name": "controlPlaneTaints", "expression": json.dumps(CONTROL_PLANE_TAINTS)},
    {"name": "pinningKeys", "expression": json.dumps(PINNING_KEYS)},
    {"name": "ownNames", "expression": (
        "['data', 'token'].map(c, object.metadata.name + '-' + (object.kind == 'SFTRun' ? 'sft-' : '') + c)")},
]
"""Variables that come from the run, not from the values."""

COMPONENTS = ("inference", "orchestrator", "trainer", "envWorkers", "teacher", "judge")


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


def _foreign(name: str) -> str:
    """CEL: `name` is another run's claim or token Secret (by the names the operator gives them)."""
    return (f"(({name}).endsWith('-data') || ({name}).endsWith('-token')) && !(({name}) in variables.ownNames)"
            f" && !{_listed('allowedSharedNames', name)}")


SHARED = ("is named like another run's claim (<run>-data) or token Secret (<run>-token); "
          "rename it, or the cluster admin lists it in guardrails.allowedSharedNames")


def _pod_rules(path: str, ref: str, is_set: str) -> list[dict]:
    """What a component's `pod` section (or the run-level `scheduling`) may ask for."""
    at = f"!({is_set}) || "
    rules = [_name_list_rules(path, ref, is_set, "priorityClassName", "allowedPriorityClasses"),
             _name_list_rules(path, ref, is_set, "schedulerName", "allowedSchedulers")]
    tolerations = f"!has({ref}.tolerations) || {ref}.tolerations"
    rules += [
        _rule(f"variables.allowTolerateAll || {at}{tolerations}.all(t, !has(t.operator) || t.operator != 'Exists'"
              " || (has(t.key) && t.key != ''))",
              f"{path}.tolerations: a toleration with operator Exists and no key tolerates every taint (the control "
              "plane's, NoExecute evictions); name the taint's key (guardrails.allowTolerateAll lets it)"),
        _rule(f"variables.allowNodePinning || {at}{tolerations}.all(t, !has(t.key) || !(t.key in "
              "variables.controlPlaneTaints))",
              f"{path}.tolerations: a toleration of the control plane's taint lets the pods onto control-plane nodes "
              "(guardrails.allowNodePinning)"),
        _rule(f"variables.allowNodePinning || {at}!has({ref}.nodeSelector) || {ref}.nodeSelector.all(k, !(k in "
              "variables.pinningKeys))",
              f"{path}.nodeSelector: choosing nodes by name or control-plane role is not allowed by the cluster admin "
              "(guardrails.allowNodePinning)"),
    ]
    if path == "spec.scheduling":
        return rules
    required = f"{ref}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    volumes = f"!has({ref}.volumes) || {ref}.volumes"
    offending_volume = f"{ref}.volumes.filter(v, !v.all(k, k == 'name' || k in variables.allowedVolumeTypes))[0]"
    rules += [
        _name_list_rules(path, ref, is_set, "serviceAccountName", "allowedServiceAccounts"),
        _name_list_rules(path, ref, is_set, "runtimeClassName", "allowedRuntimeClasses"),
        _rule(f"variables.allowNodePinning || {at}!has({ref}.affinity) || !has({ref}.affinity.nodeAffinity) || "
              f"!has({required}) || !has({required}.nodeSelectorTerms) || {required}.nodeSelectorTerms.all(t, "
              "!has(t.matchFields) && (!has(t.matchExpressions) || t.matchExpressions.all(e, !(e.key in "
              "variables.pinningKeys))))",
              f"{path}.affinity.nodeAffinity: choosing nodes by name or control-plane role is not allowed by the "
              "cluster admin (guardrails.allowNodePinning)"),
        _rule(f"{at}{volumes}.all(v, v.all(k, k == 'name' || k in variables.allowedVolumeTypes))",
              f"{path}.volumes: a volume of a type the cluster admin does not allow (guardrails.allowedVolumeTypes)",
              f"'{path}.volumes: volume ' + {offending_volume}.name + ' is a ' + {offending_volume}.filter(k, "
              "k != 'name' && !(k in variables.allowedVolumeTypes))[0] + ' volume, a type the cluster admin does "
              "not allow (guardrails.allowedVolumeTypes)'"),
        _rule(f"variables.allowServiceAccountTokens || {at}{volumes}.all(v, !has(v.projected) || "
              "!has(v.projected.sources) || v.projected.sources.all(s, !has(s.serviceAccountToken)))",
              f"{path}.volumes: a projected serviceAccountToken is a token for the pods' service account, which the "
              "cluster admin does not allow (guardrails.allowServiceAccountTokens)"),
        _rule(f"{at}{volumes}.all(v, (!has(v.persistentVolumeClaim) || !({_foreign('v.persistentVolumeClaim.claimName')}))"
              f" && (!has(v.secret) || !has(v.secret.secretName) || !({_foreign('v.secret.secretName')}))"
              " && (!has(v.projected) || !has(v.projected.sources) || v.projected.sources.all(s, !has(s.secret) || "
              f"!has(s.secret.name) || !({_foreign('s.secret.name')}))))",
              f"{path}.volumes: a claim or Secret {SHARED}"),
        _rule(f"{at}(!has({ref}.env) || {ref}.env.all(e, !has(e.valueFrom) || !has(e.valueFrom.secretKeyRef) || "
              f"!has(e.valueFrom.secretKeyRef.name) || !({_foreign('e.valueFrom.secretKeyRef.name')}))) && "
              f"(!has({ref}.envFrom) || {ref}.envFrom.all(e, !has(e.secretRef) || !has(e.secretRef.name) || "
              f"!({_foreign('e.secretRef.name')})))",
              f"{path}.env/envFrom: a Secret {SHARED}"),
    ]
    return rules


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
        _rule(f"!has({spec}.storage) || ((!has({spec}.storage.pvc) || !has({spec}.storage.pvc.claimName) || "
              f"!({_foreign(f'{spec}.storage.pvc.claimName')})) && (!has({spec}.storage.objectStore) || "
              f"['secretName', 'readOnlySecretName'].all(f, !(f in {spec}.storage.objectStore) || "
              f"!({_foreign(f'{spec}.storage.objectStore[f]')}))))",
              f"spec.storage: a claim or Secret {SHARED}"),
    ]
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
