"""Admission for custom resources: the CRD schema's CEL rules (`x-kubernetes-validations`),
evaluated with cel-python on the object with the schema's defaults applied, as the API server
does before it stores a write. Transition rules (those using `oldSelf`) are skipped; schema
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


def violations(schema: dict, value, path: str = "") -> list[str]:
    """`<path>: <message>` for every CEL rule that `value` breaks, depth first."""
    out = []
    for rule in schema.get("x-kubernetes-validations") or []:
        if "oldSelf" in rule["rule"]:
            continue
        try:
            result = _program(rule["rule"]).evaluate({"self": celpy.json_to_cel(value)})
        except celpy.CELEvalError as e:
            result = e
        if isinstance(result, celpy.CELEvalError):
            out.append(f"{path or '<root>'}: {rule['rule']}: {result}")
        elif not result:
            out.append(f"{path or '<root>'}: {rule.get('message') or 'failed rule: ' + rule['rule']}")
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value and value[key] is not None:
                out += violations(sub, value[key], f"{path}.{key}" if path else key)
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            out += violations(schema["items"], item, f"{path}[{i}]")
    return out


def check(schema: dict | None, obj: dict) -> list[str]:
    return violations(schema, with_defaults(schema, obj)) if schema else []
