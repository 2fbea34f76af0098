"""Environments' judges, pointed at the run's judge.

verifiers 0.4 plugs judges into a task's config (`TaskConfig.judges`: `reference`, `rubric`,
or an installed judge plugin), each a `JudgeConfig` naming an OpenAI-style endpoint (its
`base_url`, `model`, `api_key_var`, `sampling`; by default Prime's hosted API, which a cluster
run cannot reach). `point_judges` rewrites every plugged judge of an environment to call the
run's judge instead (`JudgeTarget`: the loopback endpoint of the process running the rollouts,
`rlkube.orchestrator.judge`, and the served model's name), keeping the rest of its config (its
prompt, criteria, choices, weight). The environment gets no key: the endpoint adds the run's
token, which environment code never sees (`rlkube.withheld`).

Tasks share their taskset's `config.task` (verifiers' tasksets build each with it, and read
the judges from it when they score), so rewriting that one object points every task.
"""

from dataclasses import dataclass, field
from typing import Any

NO_KEY_VAR = "RLKUBE_JUDGE_API_KEY"
"""The `api_key_var` of a pointed judge: unset, so the SDK sends a placeholder key; the loopback
endpoint does not read it (it adds the run's token itself)."""


@dataclass(frozen=True)
class JudgeTarget:
    base_url: str
    """The loopback endpoint, `http://127.0.0.1:<port>/v1`."""
    model: str
    """The served judge's model name."""
    sampling: dict[str, Any] = field(default_factory=dict)
    """Sampling keys that override the environment's own judge sampling."""


def point_judges(env: Any, target: JudgeTarget) -> int:
    """Point every judge `env`'s tasks plug at `target`; returns how many."""
    config = env.taskset.config.task
    config.judges = [pointed_judge(judge, target) for judge in config.judges]
    return len(config.judges)


def pointed_judge(judge: Any, target: JudgeTarget) -> Any:
    """`judge` (a verifiers `JudgeConfig`) calling `target`, its sampling overridden by the
    target's."""
    from verifiers.v1.types import SamplingConfig

    sampling = SamplingConfig.model_validate(judge.sampling.model_dump(exclude_none=True) | target.sampling)
    return judge.model_copy(update={
        "base_url": target.base_url, "model": target.model, "api_key_var": NO_KEY_VAR,
        "headers": {}, "headers_from_env": {}, "sampling": sampling,
    })
