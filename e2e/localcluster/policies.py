"""ValidatingAdmissionPolicies (admissionregistration.k8s.io/v1), evaluated with cel-python as
kube-apiserver does on a write: a policy applies through each of its bindings whose
`matchResources` take the object's namespace; its `matchConstraints.resourceRules` must take the
resource and operation and its `matchConditions` must all hold; then its `variables` are
computed in order and every validation that is false denies the request with its
`messageExpression` (or `message`), when the binding's `validationActions` include Deny.

The object is seen with its schema's defaults applied, as the API server defaults before it
admits. Not emulated: `paramKind`/`paramRef`, `auditAnnotations`, `excludeResourceRules`,
`objectSelector`, `namespaceSelector` beyond `kubernetes.io/metadata.name` and the namespace's
own labels, type checking, and the cost limits."""

import functools
from dataclasses import dataclass

import celpy

NAME_LABEL = "kubernetes.io/metadata.name"


@functools.cache
def _program(expression: str):
    env = celpy.Environment()
    return env.program(env.compile(expression))


def _value(expression: str, activation: dict):
    result = _program(expression).evaluate(activation)
    if isinstance(result, celpy.CELEvalError):
        raise PolicyError(f"{expression}: {result}")
    return result


class PolicyError(Exception):
    """A policy's expression failed to evaluate (`failurePolicy: Fail` refuses the request)."""


@dataclass(frozen=True)
class Denial:
    policy: str
    binding: str
    message: str
    reason: str

    def __str__(self) -> str:
        return (f"ValidatingAdmissionPolicy '{self.policy}' with binding '{self.binding}' denied request: "
                f"{self.message}")


def selects(selector: dict | None, labels: dict[str, str]) -> bool:
    """Whether a LabelSelector (`matchLabels`, `matchExpressions`) takes these labels; an empty
    or missing one takes every object."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        value, values = labels.get(expr["key"]), expr.get("values") or []
        ok = {"In": value in values, "NotIn": value not in values, "Exists": value is not None,
              "DoesNotExist": value is None}[expr["operator"]]
        if not ok:
            return False
    return True


def _rule_takes(rule: dict, group: str, version: str, plural: str, operation: str) -> bool:
    def has(values, value):
        return "*" in values or value in values

    return (has(rule.get("apiGroups", []), group) and has(rule.get("apiVersions", []), version)
            and has(rule.get("resources", []), plural) and has(rule.get("operations", []), operation))


def evaluate(policy: dict, request: dict, obj: dict, old: dict | None) -> list[tuple[str, str]]:
    """(message, reason) of each validation of `policy` that the request fails; nothing where
    its matchConditions do not hold."""
    spec = policy["spec"]
    activation = {"object": celpy.json_to_cel(obj), "oldObject": celpy.json_to_cel(old),
                  "request": celpy.json_to_cel(request)}
    if not all(_value(c["expression"], activation) for c in spec.get("matchConditions") or []):
        return []
    variables = {}
    for variable in spec.get("variables") or []:
        activation["variables"] = celpy.celtypes.MapType(variables)
        variables[variable["name"]] = _value(variable["expression"], activation)
    activation["variables"] = celpy.celtypes.MapType(variables)
    out = []
    for validation in spec.get("validations") or []:
        if _value(validation["expression"], activation):
            continue
        message = validation.get("message") or f"failed expression: {validation['expression']}"
        if "messageExpression" in validation:
            try:
                message = str(_value(validation["messageExpression"], activation))
            except PolicyError:
                pass  # as the API server does: the static message instead
        out.append((message, validation.get("reason", "Invalid")))
    return out


def denials(policies: list[dict], bindings: list[dict], *, group: str, version: str, plural: str,
            operation: str, obj: dict, old: dict | None, namespace_labels: dict[str, str] | None) -> list[Denial]:
    """What the bound policies deny of one write (`namespace_labels`: None for a cluster-scoped
    object)."""
    out = []
    by_name = {p["metadata"]["name"]: p for p in policies}
    request = {"operation": operation, "namespace": (namespace_labels or {}).get(NAME_LABEL, ""),
               "name": obj["metadata"]["name"], "resource": {"group": group, "version": version, "resource": plural}}
    for binding in bindings:
        spec = binding["spec"]
        policy = by_name.get(spec["policyName"])
        if policy is None or "Deny" not in spec.get("validationActions", []):
            continue
        rules = (policy["spec"].get("matchConstraints") or {}).get("resourceRules") or []
        if not any(_rule_takes(r, group, version, plural, operation) for r in rules):
            continue
        if namespace_labels is not None and not selects((spec.get("matchResources") or {}).get("namespaceSelector"),
                                                         namespace_labels):
            continue
        out += [Denial(policy["metadata"]["name"], binding["metadata"]["name"], message, reason)
                for message, reason in evaluate(policy, request, obj, old)]
    return out
