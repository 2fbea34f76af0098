"""What the lean path remembers between rollouts gives the answers verifiers and renderers
would compute, computed once: the assistant header's token ids, the chat harness's plugin
lookup, and the reverse-text task's content hash."""

import importlib.machinery

import pytest
from renderers import reasoning
from rlkube.envs import reasoning_headers

HEADER = "<|im_start|>assistant\n"


class Tokenizer:
    """Characters as token ids (specials and newlines included); counts `encode` calls."""

    def __init__(self):
        self.encoded, self.extra = [], 0

    def encode(self, text, add_special_tokens=True):
        self.encoded.append(text)
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(map(chr, ids))

    def convert_tokens_to_ids(self, token):
        return None

    def __len__(self):
        return 1000 + self.extra


def ids(text):
    return [ord(c) for c in text]


PROMPTS = [
    f"<|im_start|>user\nabc<|im_end|>\n{HEADER}",
    f"<|im_start|>user\nabc<|im_end|>\n{HEADER}<think>\nhmm",
    f"{HEADER}\n\nxyz",
    "no header at all",
    "",
]


@pytest.fixture
def installed(monkeypatch):
    monkeypatch.setattr(reasoning, "_after_header", reasoning_headers._original_after_header)
    monkeypatch.setattr(reasoning_headers, "_views", type(reasoning_headers._views)())
    reasoning_headers.remember_header_ids()
    assert reasoning._after_header is reasoning_headers._after_header


def test_header_ids_are_the_same_and_encoded_once_per_tokenizer(installed):
    original = reasoning_headers._original_after_header
    tokenizer, reference = Tokenizer(), Tokenizer()
    for _ in range(3):
        for prompt in PROMPTS:
            for last in (False, True):
                assert reasoning._after_header(tokenizer, ids(prompt), HEADER, last=last) == original(
                    reference, ids(prompt), HEADER, last=last
                )
            assert reasoning.prompt_ends_in_reasoning(tokenizer, ids(prompt)) == reasoning.prompt_ends_in_reasoning(
                reference, ids(prompt)
            )
    assert tokenizer.encoded == [HEADER]  # the original encodes it on every call
    assert len(reference.encoded) > 10


def test_header_ids_are_encoded_again_when_the_vocabulary_grows(installed):
    tokenizer = Tokenizer()
    reasoning._after_header(tokenizer, ids(PROMPTS[0]), HEADER, last=True)
    tokenizer.extra = 1  # tokens added: the header may tokenize differently
    reasoning._after_header(tokenizer, ids(PROMPTS[0]), HEADER, last=True)
    reasoning._after_header(tokenizer, ids(PROMPTS[0]), "<|im_start|>model\n", last=True)
    assert tokenizer.encoded == [HEADER, HEADER, "<|im_start|>model\n"]


def test_an_unhashable_tokenizer_is_asked_every_time(installed):
    class Unhashable(Tokenizer):
        __hash__ = None

    tokenizer = Unhashable()
    for _ in range(2):
        assert reasoning._after_header(tokenizer, ids(PROMPTS[2]), HEADER) == ids("xyz")
    assert tokenizer.encoded == [HEADER, HEADER]


def test_the_chat_harness_resolves_without_searching_verifiers_package(monkeypatch):
    from rlkube.envs.chat_harness import HARNESS_ID, InProcessChatHarness
    from verifiers.v1.utils.loaders import builtin_harness_ids, harness_class

    searched = []
    original = importlib.machinery.PathFinder.find_spec.__func__

    def find_spec(cls, name, path=None, target=None):
        searched.append(name)
        return original(cls, name, path, target)

    monkeypatch.setattr(importlib.machinery.PathFinder, "find_spec", classmethod(find_spec))
    for _ in range(3):
        assert harness_class(HARNESS_ID) is InProcessChatHarness
    assert searched == []
    assert HARNESS_ID not in builtin_harness_ids()  # listed from verifiers' package directory


def test_reverse_text_task_hash_is_verifiers_hash_computed_once_per_data(monkeypatch):
    import verifiers.v1 as vf
    from rlkube.envs.reverse_text import load_environment
    from verifiers.v1 import task as vf_task

    task = next(iter(load_environment(num_examples=3).taskset))
    expected = vf.Task.hash.fget(task)
    calls = []
    original = vf_task.task_key
    monkeypatch.setattr(vf_task, "task_key", lambda data: calls.append(data) or original(data))
    assert [task.hash, task.key, task.hash, task.key] == [expected] * 4
    assert len(calls) == 1
    other = task.with_data(prompt="zyx", text="zyx")  # a copy with new data hashes its own data
    assert other.hash == vf.Task.hash.fget(other) != expected and task.hash == expected
