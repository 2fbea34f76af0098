"""Environments: rlkube's built-in `verifiers` environments and the loader for any other.

`load_env(EnvConfig)` is the one way processes get an environment: a built-in id
(`reverse_text`) maps to rlkube's module; any other id is an installed verifiers taskset
package, loaded through verifiers' own plugin loader with `args` as the taskset's config. With a
`judge`, every judge the environment plugs calls the run's judge (`rlkube.envs.judge`).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from verifiers.v1 import Env

    from rlkube.config import EnvConfig
    from rlkube.envs.judge import JudgeTarget

BUILTIN_ENVS = {"reverse_text": "rlkube.envs.reverse_text", "tool_lookup": "rlkube.envs.tool_lookup",
                "judged_reverse_text": "rlkube.envs.judged_reverse_text", "tool_chain": "rlkube.envs.tool_chain"}


def load_env(env_config: "EnvConfig", judge: "JudgeTarget | None" = None) -> "Env":
    """The `verifiers` environment `env_config` names, built with its `args`, its judges
    pointed at `judge` when given."""
    env = _build_env(env_config)
    if judge is not None:
        from rlkube.envs.judge import point_judges

        point_judges(env, judge)
    return env


def _build_env(env_config: "EnvConfig") -> "Env":
    import importlib

    from rlkube.envs.pydantic_defaults import remember_default_factory_signatures
    from rlkube.envs.reasoning_headers import remember_header_ids

    remember_default_factory_signatures()  # verifiers' rollouts build many pydantic models
    remember_header_ids()  # and parse every response for an assistant header
    if env_config.id in BUILTIN_ENVS:
        module = importlib.import_module(BUILTIN_ENVS[env_config.id])
        try:
            return module.load_environment(**env_config.args)
        except TypeError as e:  # unknown keyword argument
            raise ValueError(f"env '{env_config.id}': bad args {env_config.args}: {e}") from None
    return load_verifiers_env(env_config.id, env_config.args)


def load_verifiers_env(taskset_id: str, args: dict[str, Any]) -> "Env":
    """An installed verifiers taskset package as an environment (its own `Env` subclass,
    else `SingleAgentEnv`), `args` validated against the taskset's config."""
    from verifiers.v1 import Env as VfEnv
    from verifiers.v1 import EnvConfig as VfEnvConfig
    from verifiers.v1.utils.generic import concrete_type
    from verifiers.v1.utils.loaders import environment_class

    env_cls = environment_class(taskset_id)
    config_cls = concrete_type(env_cls, VfEnvConfig, origin=VfEnv) or VfEnvConfig
    return env_cls(config_cls.model_validate({"taskset": {**args, "id": taskset_id}}))
