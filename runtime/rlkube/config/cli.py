"""Turn `@ a.toml @ b.toml --section.field value` into a validated config.

TOML files merge left to right (tables deep-merge, lists replace), then dotted flags win.
Keys may be kebab- or snake-case. Every error names the field path and the reason.

Every TOML rlkube writes starts with `# written by rlkube <version>`: a runtime that meets a
field it does not know (a file from a newer operator or launcher) names both versions in its
error, and leaves that error in the container's termination message for the operator to show.
"""

import contextlib
import importlib.metadata
import json
import sys
import tomllib
import types
import typing
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args, get_origin

import tomli_w
from pydantic import BaseModel, ValidationError

from rlkube.config.base import Config
from rlkube.config.renames import RenamedKeyWarning, target_path


class ConfigError(ValueError):
    """Invalid configuration input; the message names the field and the reason."""


def _installed_version() -> str:
    try:
        return importlib.metadata.version("rlkube")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


RLKUBE_VERSION = _installed_version()
WRITER_PREFIX = "# written by rlkube "
VERSION_SKEW = "the config was written by rlkube"
"""Starts the reason of a field this runtime does not know in a file a (newer) rlkube wrote;
the operator looks for it in termination messages."""
TERMINATION_LOG = Path("/dev/termination-log")
"""Where Kubernetes reads a container's termination message (its `terminationMessagePath`)."""
EXIT_INVALID = 2
"""The exit code of a failure no restart fixes (an invalid config, a missing model): the
operator fails the run at once (the trainer Job's `podFailurePolicy` included), `rlkube rl`
stops. Any other exit is retriable."""


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (`Foo`, `Foo | None`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in get_args(annotation):
            if (model := _model_in(arg)) is not None:
                return model
    return None


def _list_item_model(annotation: Any) -> type[BaseModel] | None:
    if get_origin(annotation) is list and get_args(annotation):
        return _model_in(get_args(annotation)[0])
    return None


def _is_optional(annotation: Any) -> bool:
    return get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in get_args(
        annotation
    )


def normalize_keys(data: dict, model: type[BaseModel], renamed_from: list[str] | None = None) -> dict:
    """Snake-case the keys that name fields, or another name of one (`Config.RENAMED`), guided
    by the model (free-form dicts are kept). `renamed_from`: the path, in `model`, of a table of
    renamed keys `data` is (`["train"]` for prime-rl's `[orchestrator.train]`)."""
    out = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        path = [*(renamed_from or []), name]
        if renamed_from is None and name in model.model_fields:
            field = model.model_fields[name]
        elif (target := target_path(getattr(model, "RENAMED", {}), path)) is not None:
            field = _field_at(model, target, ".".join(path))
        elif isinstance(value, dict) and any(a.startswith(".".join(path) + ".") for a in getattr(model, "RENAMED", {})):
            out[name] = normalize_keys(value, model, path)
            continue
        else:
            out[key] = value  # left for pydantic to reject with its path
            continue
        out[name] = _normalize_value(value, field)
    return out


def _normalize_value(value: Any, field) -> Any:
    if field is None:
        return value
    if isinstance(value, dict) and (sub := _model_in(field.annotation)) is not None:
        return normalize_keys(value, sub)
    if isinstance(value, list) and (item := _list_item_model(field.annotation)) is not None:
        return [normalize_keys(v, item) if isinstance(v, dict) else v for v in value]
    return value


def deep_merge(base: dict, override: dict) -> dict:
    """Tables merge recursively; anything else (lists included) is replaced."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_toml(path: str | Path) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None


def written_by(path: str | Path) -> str | None:
    """The rlkube version on the file's `# written by rlkube <version>` first line, if any."""
    with open(path, encoding="utf-8") as f:
        first = f.readline()
    return first.removeprefix(WRITER_PREFIX).split()[0] if first.startswith(WRITER_PREFIX) else None


def _parse_value(text: str) -> Any:
    """A flag value as TOML would read it (`3`, `1e-3`, `true`, `[1, 2]`), else the string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        try:
            return json.loads(text)
        except ValueError:
            return text


def _field_at(model: type[BaseModel], path: list[str], flag: str):
    """The field a dotted flag names, or a ConfigError naming where the path breaks. None for a
    key inside a free-form table (`--env.args.split test`): it takes any value."""
    field = None
    for i, part in enumerate(path):
        if model is None:
            if field is not None and get_origin(field.annotation) is dict:
                return None
            raise ConfigError(f"{flag}: '{'.'.join(path[:i])}' has no sub-fields")
        field = model.model_fields.get(part)
        if field is None and (target := target_path(getattr(model, "RENAMED", {}), path[i:])) is not None:
            return _field_at(model, target, flag)  # another name of a field: the flag keeps it, the model renames it
        if field is None:
            known = ", ".join(sorted(model.model_fields))
            raise ConfigError(
                f"{flag}: unknown field '{'.'.join(path[: i + 1])}' (known here: {known})"
            )
        model = _model_in(field.annotation)
    return field


def _set_path(data: dict, path: list[str], value: Any) -> None:
    for part in path[:-1]:
        node = data.get(part)
        if not isinstance(node, dict):
            node = data[part] = {}
        data = node
    data[path[-1]] = value


def parse_flags(args: list[str], model: type[BaseModel]) -> dict:
    """Dotted flags into a nested dict. `--x` sets a boolean or enables an optional section;
    `--no-x` clears it."""
    data: dict = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            raise ConfigError(f"unexpected argument '{arg}' (config files go after '@ ')")
        flag, _, inline = arg[2:].partition("=")
        negate = flag.startswith("no-") and "=" not in arg
        path = [p.replace("-", "_") for p in (flag[3:] if negate else flag).split(".")]
        try:
            field = _field_at(model, path, f"--{flag}")
        except ConfigError:
            if not negate:
                raise
            negate, path = False, [p.replace("-", "_") for p in flag.split(".")]
            field = _field_at(model, path, f"--{flag}")
        takes_no_value = field is not None and (field.annotation is bool or (
            _model_in(field.annotation) is not None and _is_optional(field.annotation)
        ))
        if negate:
            if not takes_no_value:
                raise ConfigError(f"--{flag}: only booleans and optional sections can be negated")
            value = False if field.annotation is bool else None
        elif inline or "=" in arg:
            value = _parse_value(inline)
        elif takes_no_value and (i + 1 == len(args) or args[i + 1].startswith("--")):
            value = True if field.annotation is bool else {}
        else:
            if i + 1 == len(args):
                raise ConfigError(f"--{flag}: missing value")
            i += 1
            value = _parse_value(args[i])
        if isinstance(value, dict):
            existing = data
            for part in path:
                existing = existing.get(part, {}) if isinstance(existing, dict) else {}
            value = deep_merge(existing if isinstance(existing, dict) else {}, value)
        _set_path(data, path, value)
        i += 1
    return data


def _model_at(model: type[BaseModel] | None, loc: tuple) -> type[BaseModel] | None:
    """The model that holds the field at `loc` (a validation error's path) under `model`."""
    for part in loc[:-1]:
        if model is None:
            return None
        if isinstance(part, str):
            field = model.model_fields.get(part)
            model = None if field is None else (_model_in(field.annotation) or _list_item_model(field.annotation))
    return model


def format_validation_error(error: ValidationError, writer: str | None = None,
                            model: type[BaseModel] | None = None) -> str:
    """One line per field: its path and the reason. `writer`: the rlkube version that wrote the
    config, named with this runtime's own in the reason of a field this runtime does not know.
    `model`: the model validated, whose `UNSUPPORTED` keys (prime-rl's) say why they are refused."""
    lines = []
    for e in error.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        reason = e["msg"].removeprefix("Value error, ")
        holder = _model_at(model, e["loc"]) if e["type"] == "extra_forbidden" and e["loc"] else None
        if holder is not None and (why := getattr(holder, "UNSUPPORTED", {}).get(str(e["loc"][-1]))) is not None:
            reason = f"not supported: {why}"
        elif e["type"] == "extra_forbidden":
            reason = "unknown field"
            if writer is not None:
                reason += (f": {VERSION_SKEW} {writer} and this runtime is rlkube {RLKUBE_VERSION}"
                           f" (run an image of rlkube {writer}, or leave the field unset)")
        elif "input" in e and not isinstance(e["input"], (dict, list)):
            reason += f" (got {e['input']!r})"
        lines.append(f"  {where}: {reason}")
    return "invalid config:\n" + "\n".join(lines)


def validate(model: type[Config], data: dict, writer: str | None = None) -> Config:
    try:
        return model.model_validate(normalize_keys(data, model))
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, writer, model)) from None


def split_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """Separate `@ file.toml` (or `@file.toml`) references from flags, keeping order."""
    files, flags = [], []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "@":
            if i + 1 == len(argv):
                raise ConfigError("'@' must be followed by a config file")
            files.append(argv[i + 1])
            i += 2
            continue
        if arg.startswith("@"):
            files.append(arg[1:])
        else:
            flags.append(arg)
        i += 1
    return files, flags


def load_config(model: type[Config], argv: list[str]) -> Config:
    """Files merged left to right, then flags; validated against `model`."""
    files, flags = split_args(argv)
    data: dict = {}
    for path in files:
        data = deep_merge(data, normalize_keys(load_toml(path), model))
    data = deep_merge(data, parse_flags(flags, model))
    writers = sorted({w for path in files if (w := written_by(path)) is not None})
    return validate(model, data, ", ".join(writers) or None)


def to_toml(config: BaseModel, *, exclude_unset: bool = False) -> str:
    """The config as TOML under a `# written by rlkube <version>` line. `exclude_unset`: only the
    fields that were set, so a runtime reading it applies its own defaults (and an older one is
    never handed a field it does not know unless someone set it)."""
    body = tomli_w.dumps(config.model_dump(mode="json", exclude_none=True, exclude_unset=exclude_unset))
    return f"{WRITER_PREFIX}{RLKUBE_VERSION}\n{body}"


def write_toml(config: BaseModel, path: Path) -> None:
    """Atomically, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(to_toml(config))
    tmp.replace(path)


def _type_name(annotation: Any) -> str:
    if annotation is bool:
        return ""
    name = getattr(annotation, "__name__", None)
    if name and get_origin(annotation) is None:
        return name.upper()
    return str(annotation).replace("typing.", "").replace("pathlib.", "")


def help_lines(model: type[BaseModel], prefix: str = "") -> list[str]:
    lines = []
    for name, field in model.model_fields.items():
        flag = "--" + prefix + name.replace("_", "-")
        sub = _model_in(field.annotation)
        doc = " ".join((field.description or "").split())
        if sub is not None:
            suffix = f"  [{flag} enables, --no-{flag[2:]} disables]" if _is_optional(field.annotation) else ""
            lines.append(f"{flag}  {doc}{suffix}")
            lines.extend(help_lines(sub, prefix + name.replace("_", "-") + "."))
            continue
        if field.is_required():
            lines.append(f"{flag} {_type_name(field.annotation)}".rstrip() + f"  {doc} (required)")
            continue
        default = field.get_default(call_default_factory=True)
        shown = json.dumps(default, default=str) if default is not None else "unset"
        lines.append(f"{flag} {_type_name(field.annotation)}".rstrip() + f"  {doc} (default: {shown})")
    return lines


def print_help(model: type[BaseModel], command: str) -> None:
    doc = " ".join((model.__doc__ or "").split())
    print(f"usage: rlkube {command} [@ FILE.toml ...] [--field.path VALUE ...] [--dry-run]\n")
    print(doc + "\n")
    print("Config files merge left to right; flags win. Kebab- and snake-case keys both work.\n")
    print("\n".join(help_lines(model)))


def parse_cli(
    model: type[Config], command: str, argv: list[str] | None = None, check: Callable[[Config], None] | None = None,
) -> tuple[Config, bool]:
    """(config, dry_run). Prints help or a field-level error and exits on bad input, including
    what `check` refuses with a `ConfigError` (the runtime's entry points pass
    `rlkube.entrypoints.checks.check_references`: model directories and environments the
    config names that are not there)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--help" in argv or "-h" in argv:
        print_help(model, command)
        sys.exit(0)
    dry_run = "--dry-run" in argv
    argv = [a for a in argv if a != "--dry-run"]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RenamedKeyWarning)
            config = load_config(model, argv)
        for warning in caught:
            if issubclass(warning.category, RenamedKeyWarning):
                print(f"rlkube {command}: warning: {warning.message}", file=sys.stderr)
            else:
                warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)
        if check is not None:
            check(config)
        return config, dry_run
    except ConfigError as e:
        sys.exit(exit_invalid(command, e))


FINISHED_STEP = "rlkube_finished_step"
"""The key of the termination message a trainer leaves when it trained its last step."""


def write_finished_step(step: int) -> None:
    """A trainer's rank 0 that trained its last step says which in its termination message
    (`{"rlkube_finished_step": N}`): the operator takes a finished run's final step from the
    pod, where the status servers it reads while the run trains (the SFT trainer's own, the
    orchestrator's) may be gone by the time it looks."""
    write_termination_message(json.dumps({FINISHED_STEP: step}))


def read_finished_step(message: str) -> int | None:
    """The step a `write_finished_step` message holds; None for any other message."""
    try:
        step = json.loads(message).get(FINISHED_STEP)
    except (ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None


def exit_invalid(command: str, error: Exception) -> int:
    """A failure no restart fixes (an invalid config, a checkpoint refused by its manifest): the
    error on stderr and in the termination message; returns `EXIT_INVALID` to exit with."""
    message = f"rlkube {command}: error: {error}"
    print(message, file=sys.stderr)
    write_termination_message(message)
    return EXIT_INVALID


def write_termination_message(message: str) -> None:
    """In a Kubernetes container (the file exists there), the error becomes the container's
    termination message: the operator reads it from the pod's status."""
    with contextlib.suppress(OSError):  # unwritable: the error is on stderr all the same
        if TERMINATION_LOG.exists():
            TERMINATION_LOG.write_text(message)  # the kubelet keeps its first 4096 bytes
