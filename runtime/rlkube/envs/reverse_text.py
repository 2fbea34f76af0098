"""Reverse-text: the model reads a string of letters and must write it backwards.

A `verifiers` (0.4.0, `verifiers.v1`) taskset whose data is generated from a seed, so it
needs no download. Reward: `difflib.SequenceMatcher` ratio between the parsed answer and the
true reversal, so partial answers earn partial credit (a good RL signal).

Splits are disjoint by construction: a string belongs to `test` when a hash of it falls in
one tenth of the hash space, else to `train`, whatever the seed or size asked for. The same
generator produces the SFT dataset (`sft_examples`, chat `messages` format).

    from rlkube.envs.reverse_text import load_environment
    env = load_environment(split="test", num_examples=100)
"""

import difflib
import hashlib
import random
import re
import string
import sys
from collections.abc import Iterator
from typing import Literal

import verifiers.v1 as vf
from pydantic import Field, model_validator

from rlkube.envs.chat_harness import HARNESS_ID as CHAT_HARNESS_ID

INSTRUCTION = "Reverse this text."
"""The optional system prompt (`instruction`). Off by default: the tiny example model does not
read, and the ~28 extra tokens it adds to every sample made SFT need ~3x more steps before the
model started to reverse (loss 2.07 vs 0.51 at step 150, docs/training.md)."""

# verifiers resolves a taskset id by importing a top-level module of that name (its plugin
# convention: one installed package per environment); a dotted path does not resolve. This
# module registers itself under TASKSET_ID, so the id resolves in any process that imported
# rlkube.envs.reverse_text (as `rlkube.envs.load_env` does).
TASKSET_ID = "rlkube_reverse_text"
sys.modules.setdefault(TASKSET_ID, sys.modules[__name__])
TEST_SHARE = 10  # one string in TEST_SHARE belongs to the test split

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def split_of(text: str) -> Literal["train", "test"]:
    """The split a string belongs to: fixed by its content, so splits never overlap."""
    digest = hashlib.sha256(text.encode()).digest()
    return "test" if int.from_bytes(digest[:4], "big") % TEST_SHARE == 0 else "train"


def generate_strings(
    split: Literal["train", "test"], num_examples: int, seed: int = 0, min_len: int = 5, max_len: int = 20
) -> list[str]:
    """`num_examples` distinct lowercase strings of `split`, the same for the same arguments."""
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len (got min_len={min_len}, max_len={max_len})")
    rng = random.Random(f"reverse_text/{seed}")
    seen: set[str] = set()
    out: list[str] = []
    attempts = 0
    while len(out) < num_examples:
        attempts += 1
        if attempts > 100 * num_examples + 10_000:
            raise ValueError(
                f"cannot draw {num_examples} distinct {split} strings of length {min_len}-{max_len}"
            )
        text = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(min_len, max_len)))
        if text in seen or split_of(text) != split:
            continue
        seen.add(text)
        out.append(text)
    return out


def parse_answer(completion: str) -> str:
    """The answer in a completion: any `<think>` block dropped, surrounding whitespace stripped."""
    return _THINK.sub("", completion).strip()


def reward(completion: str, text: str) -> float:
    """SequenceMatcher ratio between the parsed answer and `text` reversed (1.0 is exact)."""
    return difflib.SequenceMatcher(None, parse_answer(completion), text[::-1]).ratio()


def sft_examples(
    split: Literal["train", "test"] = "train",
    num_examples: int = 10_000,
    seed: int = 0,
    min_len: int = 5,
    max_len: int = 20,
    instruction: str | None = None,
) -> list[dict]:
    """The SFT dataset: one `{"messages": [user, assistant]}` row per string, with a system
    turn first when `instruction` is given."""
    system = [{"role": "system", "content": instruction}] if instruction else []
    return [
        {"messages": [*system, {"role": "user", "content": text}, {"role": "assistant", "content": text[::-1]}]}
        for text in generate_strings(split, num_examples, seed, min_len, max_len)
    ]


class GeneratedStringsConfig(vf.TasksetConfig):
    """Which generated strings (`generate_strings`) a taskset yields."""

    split: Literal["train", "test"] = "train"
    """`train` or the held-out `test` split (disjoint by construction)."""
    num_examples: int = Field(10_000, ge=1)
    """How many distinct strings."""
    seed: int = 0
    """Generator seed."""
    min_len: int = Field(5, ge=1)
    """Shortest string."""
    max_len: int = Field(20, ge=1)
    """Longest string."""

    @model_validator(mode="after")
    def _lengths_ordered(self):
        if self.min_len > self.max_len:
            raise ValueError(f"min_len ({self.min_len}) must be <= max_len ({self.max_len})")
        return self


class ReverseTextConfig(GeneratedStringsConfig):
    """Which strings the taskset yields."""

    instruction: str | None = None
    """System prompt of every task (e.g. `INSTRUCTION`); none by default."""


class ReverseTextData(vf.TaskData):
    text: str
    """The string to reverse (the user prompt)."""


class ReverseTextTask(vf.Task[ReverseTextData, vf.State, vf.TaskConfig]):
    @property
    def hash(self) -> str:
        """verifiers' content hash of the task's data (a JSON dump and a SHA-256, ~25 us),
        remembered for the data object it was computed from: verifiers reads it four times per
        rollout (`hash` and `key`, for the episode and for the agent's trace). Task data is a
        frozen model that verifiers replaces (`with_data`) rather than edits, so the same
        object has the same hash."""
        remembered = self.__dict__.get("_hash_of")
        if remembered is not None and remembered[0] is self.data:
            return remembered[1]
        digest = super().hash
        self._hash_of = (self.data, digest)
        return digest

    @vf.reward
    async def reversed_ratio(self, trace: vf.Trace) -> float:
        """SequenceMatcher ratio of the model's last reply against the reversal."""
        return reward(trace.last_reply, self.data.text)


class ReverseTextTaskset(vf.Taskset[ReverseTextTask, ReverseTextConfig]):
    def load(self) -> Iterator[ReverseTextTask]:
        c = self.config
        for i, text in enumerate(generate_strings(c.split, c.num_examples, c.seed, c.min_len, c.max_len)):
            data = ReverseTextData(
                id=f"{c.split}-{c.seed}-{i}", prompt=text, system_prompt=c.instruction, text=text
            )
            yield ReverseTextTask(data, c.task)


def load_environment(
    split: Literal["train", "test"] = "train",
    num_examples: int | None = None,
    seed: int = 0,
    min_len: int = 5,
    max_len: int = 20,
    instruction: str | None = None,
) -> vf.SingleAgentEnv:
    """The reverse-text env: one chat turn per task, played in-process (no sandbox, no tools,
    no subprocess: rlkube's in-process chat harness).

    `num_examples` defaults to 10,000 for `train` and 500 for `test`.
    """
    if num_examples is None:
        num_examples = 10_000 if split == "train" else 500
    taskset = ReverseTextConfig(
        id=TASKSET_ID, split=split, num_examples=num_examples, seed=seed, min_len=min_len, max_len=max_len,
        instruction=instruction,
    )
    config = vf.SingleAgentEnvConfig(
        taskset=taskset,
        agent={"harness": {"id": CHAT_HARNESS_ID}, "runtime": {"type": "subprocess"}},
    )
    return vf.SingleAgentEnv(config)


__all__ = ["ReverseTextConfig", "ReverseTextData", "ReverseTextTask", "ReverseTextTaskset"]
