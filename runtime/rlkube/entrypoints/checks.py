"""Checks of what a config names outside itself, run by the CLI before anything starts
(`--dry-run` included): every environment id must resolve, every local model directory
must exist, LoRA's target modules must name linear layers of the local model they adapt
(built on the meta device from its `config.json`: no weights are read), and a custom
advantage or loss named by import path must import.

Not pydantic validators: the operator validates the same models where neither the
environments' packages nor the pods' volumes are, so only the runtime's CLI runs these. Each
entry point hands `check_references` to `rlkube.config.parse_cli`: the config package imports
neither the environments nor the trainer that these checks need.

A model name is a local directory when one exists there. Otherwise it is taken for a
Hugging Face hub id (`name` or `owner/name`) unless it reads as a path: it starts with `/`,
`./`, `../` or `~`, it has more than one `/`, or its first component is a local directory
(`outputs/tiny-model` while `outputs/` exists). Such a name is refused, rather than left for
vLLM to fail on minutes later trying to download it.
"""

import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel

from rlkube.config.cli import ConfigError
from rlkube.config.orchestrator import AdvantageConfig, EnvConfig
from rlkube.config.shared import ModelConfig
from rlkube.config.trainer import LoraConfig, LossConfig, TrainerCommonConfig

HUB_ID = re.compile(r"[\w.-]+(/[\w.-]+)?")


def check_references(config: BaseModel) -> None:
    """Raise a `ConfigError` naming each model path or environment id that cannot be used."""
    problems = [f"  {path}: {reason}" for path, reason in _problems(config, "")]
    if problems:
        raise ConfigError("invalid config:\n" + "\n".join(problems))


def _problems(node, path: str, model: ModelConfig | None = None) -> Iterator[tuple[str, str]]:
    """`model`: the model of the nearest enclosing config that names one (an RL config's
    `[trainer]` trains the top-level model)."""
    if isinstance(node, ModelConfig) and (reason := model_path_problem(node.name)):
        yield f"{path}name", reason
    if isinstance(node, EnvConfig) and (reason := env_id_problem(node.id)):
        yield f"{path}id", reason
    if isinstance(node, (AdvantageConfig, LossConfig)):  # user code by import path
        field = "custom" if isinstance(node, AdvantageConfig) else "custom_loss"
        if (target := getattr(node, field)) is not None and (reason := import_path_problem(target)):
            yield f"{path}{field}", reason
    if isinstance(node, BaseModel):
        if isinstance(own := getattr(node, "model", None), ModelConfig):
            model = own
        if isinstance(node, TrainerCommonConfig) and node.lora and model and (reason := lora_targets_problem(model, node.lora)):
            yield f"{path}lora.target_modules", reason
        for name in type(node).model_fields:
            yield from _problems(getattr(node, name), f"{path}{name}.", model)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _problems(item, f"{path}{i}.", model)


def import_path_problem(path: str) -> str | None:
    """None when `path` (`package.module:function`) imports to a callable, as the orchestrator
    and the trainer import it when they start."""
    from rlkube.plugins import import_callable

    try:
        import_callable(path, "")
    except (ValueError, TypeError) as e:
        return str(e).removeprefix(": ")
    return None


def model_path_problem(name: str) -> str | None:
    path = Path(name).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return None
        return f"'{name}' has no config.json: not a model directory (an export or `rlkube model init --out DIR` writes one)"
    if path.exists():
        return f"'{name}' is a file, not a model directory"
    reads_as_path = (
        name.startswith(("/", "./", "../", "~"))
        or not HUB_ID.fullmatch(name)
        or ("/" in name and Path(name.split("/")[0]).is_dir())
    )
    if reads_as_path:
        return (
            f"'{name}' does not exist (a local model directory; write one with `rlkube model "
            "init --out DIR`, or name a Hugging Face hub id such as Qwen/Qwen3-0.6B)"
        )
    return None


def env_id_problem(env_id: str) -> str | None:
    """None when `rlkube.envs.load_env` will find the environment. An installed top-level
    module of the id's name is found without importing anything; anything else goes through
    verifiers' own loader (slow: it imports verifiers), which also explains a miss."""
    from rlkube.envs import BUILTIN_ENVS

    if env_id in BUILTIN_ENVS:
        return None
    module = env_id.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()
    try:
        if importlib.util.find_spec(module) is not None:
            return None
    except (ImportError, ValueError):
        pass
    from verifiers.v1.utils.loaders import import_taskset

    try:
        import_taskset(env_id)
    except ImportError as e:
        return f"environment '{env_id}' does not resolve: not built in ({', '.join(BUILTIN_ENVS)}), {e}"
    return None


def lora_targets_problem(model: ModelConfig, lora: LoraConfig) -> str | None:
    """None unless `model` is a local directory and one of `lora.target_modules` names no
    linear layer of the model it describes (a hub id is checked when the trainer builds it)."""
    path = Path(model.name).expanduser()
    if not (path / "config.json").is_file():
        return None
    from rlkube.trainer.lora import unmatched_targets
    from rlkube.trainer.model import build_meta_model

    return unmatched_targets(build_meta_model(model), lora.target_modules)
