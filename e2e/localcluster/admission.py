"""Admission for custom resources: the CRD schema's CEL rules (`x-kubernetes-validations`),
evaluated with cel-python on the object with the schema's defaults applied, as the API server
does before it stores a write. Transition rules (those reading `oldSelf`) run on an update, for
a node the old object has too (reached through properties, and through the items of
`x-kubernetes-list-type: map` lists by their keys, as the API server correlates them); schema
types and formats are not checked; defaults are used for the check and not stored."""

import functools

import celpy


@functools.cache
def _program(rule: str):
    env = celpy.Environment()
    return env.program(env.compile(rule))


def with_defaults(schema: dict, value):
    if isinstance(value, dict) and "properties" in schema:
        value = dict(value)
        for key, sub in schema["properties"].items():
            if key not in value and "default" in sub:
                value[key] = sub["default"]
            if key in value:
                value[key] = with_defaults(sub, value[key])
    elif isinstance(value, list) and "items" in schema:
        value = [with_defaults(schema["items"], item) for item in value]
    return value


_ABSENT = object()
"""No old value: a create, or a node the old object does not have."""


def _old_item(schema: dict, item, old_items) -> object:
    """The old list item an item is correlated with: by the map keys of a `map` list, else none."""
    keys = schema.get("x-kubernetes-list-map-keys") or []
    if schema.get("x-kubernetes-list-type") != "map" or not keys or not isinstance(old_items, list):
        return _ABSENT
    match = [o for o in old_items if isinstance(o, dict) and isinstance(item, dict)
             and all(o.get(k) == item.get(k) for k in keys)]
    return match[0] if match else _ABSENT


def violations(schema: dict, value, path: str = "", old=_ABSENT) -> list[str]:
    """`<path>: <message>` for every CEL rule that `value` breaks (as an update of `old`), depth first."""
    out = []
    for rule in schema.get("x-kubernetes-validations") or []:
        transition = "oldSelf" in rule["rule"]
        if transition and old is _ABSENT:
            continue
        activation = {"self": celpy.json_to_cel(value)}
        if transition:
            activation["oldSelf"] = celpy.json_to_cel(old)
        try:
            result = _program(rule["rule"]).evaluate(activation)
        except celpy.CELEvalError as e:
            result = e
        where = (path + rule.get("fieldPath", "")).lstrip(".") or "<root>"
        if isinstance(result, celpy.CELEvalError):
            out.append(f"{where}: {rule['rule']}: {result}")
        elif not result:
            out.append(f"{where}: {rule.get('message') or 'failed rule: ' + rule['rule']}")
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value and value[key] is not None:
                old_value = old.get(key, _ABSENT) if isinstance(old, dict) else _ABSENT
                out += violations(sub, value[key], f"{path}.{key}" if path else key,
                                  _ABSENT if old_value is None else old_value)
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            out += violations(schema["items"], item, f"{path}[{i}]", _old_item(schema, item, old))
    return out


def check(schema: dict | None, obj: dict, old: dict | None = None) -> list[str]:
    """The rules `obj` breaks; with `old`, as an update of `old` (transition rules too)."""
    if not schema:
        return []
    previous = _ABSENT if old is None else with_defaults(schema, old)
    return violations(schema, with_defaults(schema, obj), old=previous)


# --- built-in kinds: the fields an update may not change ------------------------------------------

STATEFULSET_MUTABLE = ("replicas", "ordinals", "template", "updateStrategy", "persistentVolumeClaimRetentionPolicy",
                       "minReadySeconds")
SUSPENDED_JOB_MUTABLE = {"metadata": ("labels", "annotations"), "spec": ("nodeSelector", "tolerations", "schedulingGates")}
"""What a suspended Job that never started may change in its pod template (Kueue's flavours)."""


def _get(obj: dict, path: str):
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def _without(obj: dict | None, keys) -> dict:
    return {k: v for k, v in (obj or {}).items() if k not in keys}


def _job_template_changed(old: dict, new: dict) -> bool:
    before, after = _get(old, "spec.template") or {}, _get(new, "spec.template") or {}
    if before == after:
        return False
    if not (_get(old, "spec.suspend") and not _get(old, "status.startTime")):
        return True
    return any(_without(before.get(part), keys) != _without(after.get(part), keys)
               for part, keys in SUSPENDED_JOB_MUTABLE.items()) or _without(before, SUSPENDED_JOB_MUTABLE) != \
        _without(after, SUSPENDED_JOB_MUTABLE)


def immutable_violations(kind: str, old: dict, new: dict) -> list[str]:
    """`<field>: <why>` for each field of a built-in kind that this update changes and the
    API server's validation refuses to (the kinds the operator writes, and Pod's binding aside)."""
    def changed(path: str) -> bool:
        return _get(old, path) != _get(new, path)

    spec_old, spec_new = old.get("spec") or {}, new.get("spec") or {}
    out = []
    if kind == "Job":
        out += [f"spec.{f}: field is immutable" for f in ("selector", "completionMode", "podFailurePolicy",
                                                          "backoffLimitPerIndex", "managedBy") if changed(f"spec.{f}")]
        if _job_template_changed(old, new):
            out.append("spec.template: field is immutable")
    elif kind in ("Deployment", "ReplicaSet", "DaemonSet") and changed("spec.selector"):
        out.append("spec.selector: field is immutable")
    elif kind == "StatefulSet" and _without(spec_old, STATEFULSET_MUTABLE) != _without(spec_new, STATEFULSET_MUTABLE):
        out.append("spec: Forbidden: updates to statefulset spec for fields other than "
                   f"{', '.join(repr(f) for f in STATEFULSET_MUTABLE)} are forbidden")
    elif kind == "PersistentVolumeClaim" and (
            _without(spec_old, ("resources", "volumeAttributesClassName"))
            != _without(spec_new, ("resources", "volumeAttributesClassName"))
            or _without(spec_old.get("resources"), ("requests",)) != _without(spec_new.get("resources"), ("requests",))):
        out.append("spec: Forbidden: spec is immutable after creation except resources.requests and "
                   "volumeAttributesClassName for bound claims")
    elif kind == "Service" and spec_old.get("clusterIP") and changed("spec.clusterIP"):
        out.append(f"spec.clusterIP: Invalid value: {spec_new.get('clusterIP')!r}: field is immutable")
    elif kind in ("ConfigMap", "Secret") and old.get("immutable"):
        out += [f"{f}: Forbidden: field is immutable when `immutable` is set"
                for f in ("immutable", "data", "binaryData") if changed(f)]
    return out
