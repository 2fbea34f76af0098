"""Reverse-text scored by a judge: the example of an environment whose reward is an LLM's verdict.

The tasks are reverse-text's (`rlkube.envs.reverse_text`: the same generated strings and
splits); the task has no reward of its own. It plugs verifiers' built-in reference judge
(`verifiers.v1.judges.ReferenceJudge`, id `reference`): the judge model reads the prompt, the
true reversal (`answer`) and the model's last reply and answers "yes" or "no", and the reward is
1.0 for "yes", 0.0 for "no" (an empty reply scores 0.0 without a call). A verdict the judge does
not give fails the rollout rather than scoring it.

The judge config here names no endpoint: a run points it at its own judge
(`[judge]` / `orchestrator.judge`, `rlkube.envs.judge`). examples/reverse_text/judge.toml serves
the tiny example model as the judge, its answer constrained to the two labels, so the scores
mean nothing but every call is a real one.

    rlkube rl @ examples/reverse_text/rl.toml @ examples/reverse_text/judge.toml
"""

import sys
from collections.abc import Iterator
from typing import Literal

import verifiers.v1 as vf
from verifiers.v1.judges import ReferenceJudgeConfig

from rlkube.envs.chat_harness import HARNESS_ID as CHAT_HARNESS_ID
from rlkube.envs.reverse_text import GeneratedStringsConfig, generate_strings

TASKSET_ID = "rlkube_judged_reverse_text"
sys.modules.setdefault(TASKSET_ID, sys.modules[__name__])  # verifiers resolves a taskset id by module


class JudgedReverseTextData(vf.TaskData):
    answer: str
    """The true reversal: the reference the judge compares the reply with."""


class JudgedReverseTextTask(vf.Task[JudgedReverseTextData, vf.State, vf.TaskConfig]):
    """No `@reward`: the plugged judge's verdict is the reward."""


class JudgedReverseTextTaskset(vf.Taskset[JudgedReverseTextTask, GeneratedStringsConfig]):
    def load(self) -> Iterator[JudgedReverseTextTask]:
        c = self.config
        for i, text in enumerate(generate_strings(c.split, c.num_examples, c.seed, c.min_len, c.max_len)):
            yield JudgedReverseTextTask(
                JudgedReverseTextData(id=f"{c.split}-{c.seed}-{i}", prompt=text, answer=text[::-1]), c.task)


def load_environment(
    split: Literal["train", "test"] = "train",
    num_examples: int | None = None,
    seed: int = 0,
    min_len: int = 5,
    max_len: int = 20,
) -> vf.SingleAgentEnv:
    """The judged reverse-text env: one chat turn per task, in-process, scored by the reference
    judge. `num_examples` defaults to 10,000 for `train` and 500 for `test`."""
    if num_examples is None:
        num_examples = 10_000 if split == "train" else 500
    taskset = GeneratedStringsConfig(
        id=TASKSET_ID, split=split, num_examples=num_examples, seed=seed, min_len=min_len, max_len=max_len,
        task=vf.TaskConfig(judges=[ReferenceJudgeConfig(answer_field="answer")]),
    )
    config = vf.SingleAgentEnvConfig(
        taskset=taskset,
        agent={"harness": {"id": CHAT_HARNESS_ID}, "runtime": {"type": "subprocess"}},
    )
    return vf.SingleAgentEnv(config)


__all__ = ["JudgedReverseTextData", "JudgedReverseTextTask", "JudgedReverseTextTaskset"]
