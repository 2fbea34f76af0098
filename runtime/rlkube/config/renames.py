"""Other spellings of rlkube's keys: prime-rl's current names, read as rlkube's with a warning.

A config model lists them in `RENAMED` (`{"train.env": "envs"}`: the key path it reads, relative
to the model, and rlkube's path of the same setting) and in `UNSUPPORTED` (a key and why rlkube
has no equivalent). `Config`'s validator moves each renamed key to rlkube's before validation
and warns with a `RenamedKeyWarning` naming the key to write; an unsupported key stays an
unknown field, whose error gives the reason (`rlkube.config.cli.format_validation_error`). The CLI prints the warnings (`parse_cli`), the flags and the TOML accept the
renamed paths (`--orchestrator.train.sampling.max-completion-tokens 64`), and the CRD schema
carries them (`renamed_properties`), so an RLRun's `spec.config` takes them too.
"""

import copy
import warnings
from typing import Any


class RenamedKeyWarning(FutureWarning):
    """A key spelled as another project spells it; the message names rlkube's key."""


def _lookup(data: dict, parts: list[str]) -> tuple[bool, Any]:
    for part in parts:
        if not isinstance(data, dict) or part not in data:
            return False, None
        data = data[part]
    return True, data


def _pop(data: dict, parts: list[str]) -> tuple[bool, Any]:
    """Remove the value at `parts`, and the tables it leaves empty."""
    found, parent = _lookup(data, parts[:-1])
    if not found or not isinstance(parent, dict) or parts[-1] not in parent:
        return False, None
    value = parent.pop(parts[-1])
    if len(parts) > 1 and not parent:
        _pop(data, parts[:-1])
    return True, value


def _set(data: dict, parts: list[str], value: Any) -> None:
    for part in parts[:-1]:
        data = data.setdefault(part, {})
    data[parts[-1]] = value


def _same_setting(ours: Any, theirs: Any, alias: str, target: str) -> Any:
    """Both spellings given: one table of both (as the CLI gives a flag over a file's table),
    or one value given twice; two different values are an error."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        merged = dict(ours)
        for key, value in theirs.items():
            merged[key] = _same_setting(ours[key], value, f"{alias}.{key}", f"{target}.{key}") if key in ours else value
        return merged
    if ours != theirs:
        raise ValueError(f"'{alias}' and '{target}' are one setting, given two values ({theirs!r} and {ours!r}): set one")
    return ours


def rename_keys(data: Any, renamed: dict[str, str], where: str = "") -> Any:
    """`data` with each key of `renamed` moved to rlkube's path, one warning each. `where`: the
    table the keys are in (`orchestrator`), for the warning."""
    if not isinstance(data, dict) or not any(_lookup(data, a.split("."))[0] for a in renamed):
        return data
    data = copy.deepcopy(data)
    for alias, target in renamed.items():
        found, value = _pop(data, alias.split("."))
        if not found:
            continue
        prefix = f"{where}." if where else ""
        warnings.warn(f"'{prefix}{alias}' is prime-rl's name: rlkube reads it as '{prefix}{target}' (write that)",
                      RenamedKeyWarning, stacklevel=2)
        has_ours, ours = _lookup(data, target.split("."))
        _set(data, target.split("."), _same_setting(ours, value, alias, target) if has_ours else value)
    return data


def target_path(renamed: dict[str, str], path: list[str]) -> list[str] | None:
    """rlkube's path of a key path that starts with a renamed key (`train.env.0.id` →
    `envs.0.id`), else None."""
    for alias, target in renamed.items():
        parts = alias.split(".")
        if path[: len(parts)] == parts:
            return target.split(".") + path[len(parts):]
    return None


def renamed_properties(schema: dict, renamed: dict[str, str]) -> None:
    """Add the renamed keys to a model's JSON schema (the CRD's is made from it): each has the
    schema of rlkube's key where that is a property of the same model, and is free-form (the
    runtime validates it) where it lies deeper."""
    properties = schema.setdefault("properties", {})
    for alias, target in renamed.items():
        *tables, key = alias.split(".")
        node = properties
        for table in tables:
            node = node.setdefault(table, {"type": "object", "additionalProperties": False, "properties": {},
                                           "description": "prime-rl's table; rlkube reads its keys as named below."})
            node = node["properties"]
        ours = {k: v for k, v in properties.get(target, {}).items() if k not in ("default", "title")} if "." not in target else {}
        node[key] = {**copy.deepcopy(ours), "description": f"prime-rl's name of `{target}`: read as `{target}`, "
                                                           "with a warning to write that."}
