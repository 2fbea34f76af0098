"""The Secrets, claims and ConfigMaps a run names, checked where the admission policy cannot look.

The guardrails' CEL (`guardrails.py`) refuses, by name, any a run does not own and the admin does
not list. Two things need the object itself, so the operator checks them before it creates
anything: a name allowed by its labels (`allowedReferenceLabels`), and a Secret's type (a
`kubernetes.io/service-account-token` Secret is a service account's credential whatever its
name, refused unless `allowServiceAccountTokens`).
"""

from rlkube_operator.guardrails import (
    ALLOWED,
    COMPONENTS,
    OWN,
    POD_REFERENCES,
    RUN_REFERENCES,
    Guardrails,
)
from rlkube_operator.names import RunRef

SERVICE_ACCOUNT_TOKEN = "kubernetes.io/service-account-token"


def _at(node, path: str):
    for step in path.split(".") if path else ():
        node = node.get(step) if isinstance(node, dict) else None
    return node


def _names(node, path: str):
    """The strings at `path` under `node` (`[]` steps into each item of a list)."""
    head, nested, rest = path.partition("[]")
    if not nested:
        if isinstance(value := _at(node, path), str):
            yield value
        return
    for item in _at(node, head.rstrip(".")) or []:
        yield from _names(item, rest.lstrip("."))


def named(spec: dict) -> list[tuple[str, str, str]]:
    """(field, kind, name) of every Secret, claim and ConfigMap `spec` (as stored: camelCase)
    names, in the fields the guardrails check."""
    out = [(f"spec.{path}", kind, name) for path, kind in RUN_REFERENCES for name in _names(spec, path)]
    for component in COMPONENTS:
        if isinstance(pod := (spec.get(component) or {}).get("pod"), dict):
            out += [(f"spec.{component}.pod.{items}[].{path}", kind, name)
                    for items, path, kind in POD_REFERENCES for name in _names(pod, f"{items}[].{path}")]
    return out


def refusals(kube, run: RunRef, spec: dict, guardrails: Guardrails) -> list[str]:
    """Why the objects `spec` names are refused, beyond what the CEL refuses by name: each field
    with the name and the reason."""
    out, seen, values = [], {}, guardrails.model_dump(by_alias=True)
    for field, kind, name in named(spec):
        if name == run.child(OWN[kind]):
            continue
        listed = any(a in ("*", name) for a in values[ALLOWED[kind]])
        by_label = not listed and bool(guardrails.allowed_reference_labels)
        if name in guardrails.protected_secrets or not (by_label or listed and kind == "Secret"):
            continue  # refused by the CEL already, or allowed by name
        if (kind, name) not in seen:
            seen[kind, name] = kube.get(kind, run.namespace, name)
        obj = seen[kind, name]
        labels = (obj or {}).get("metadata", {}).get("labels") or {}
        if by_label and any(labels.get(k) != v for k, v in guardrails.allowed_reference_labels.items()):
            wanted = ", ".join(f"{k}={v}" for k, v in sorted(guardrails.allowed_reference_labels.items()))
            out.append(f"{field}: {kind} {name} is not the run's own, not listed (guardrails.{ALLOWED[kind]}) "
                       f"and {'does not exist' if obj is None else 'lacks the labels'} {wanted} "
                       "(guardrails.allowedReferenceLabels)")
        elif kind == "Secret" and obj is not None and obj.get("type") == SERVICE_ACCOUNT_TOKEN \
                and not guardrails.allow_service_account_tokens:
            out.append(f"{field}: Secret {name} is a service account's token (type {SERVICE_ACCOUNT_TOKEN}), "
                       "which the cluster admin does not allow (guardrails.allowServiceAccountTokens)")
    return out

