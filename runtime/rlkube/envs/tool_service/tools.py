"""The tools the service serves: pure functions of their JSON arguments, answering text.

`lookup(key)` walks a chain: a key of more than `VALUE_KEY_LEN` letters leads to another key
one letter shorter, and a key of `VALUE_KEY_LEN` letters holds a three-digit value. Both are
hashes of the key, so no model knows them without calling the tool, and a task key of `n`
letters takes `n - VALUE_KEY_LEN + 1` calls (`rlkube.envs.tool_chain`).
"""

import hashlib
import string

VALUE_KEY_LEN = 3


class ToolError(ValueError):
    """Arguments a tool refuses; the message is what the model reads."""


def _digest(key: str) -> bytes:
    return hashlib.sha256(f"tool_chain/{key}".encode()).digest()


def next_key(key: str) -> str:
    """The key `key` leads to (one letter shorter)."""
    digest = _digest(key)
    return "".join(string.ascii_lowercase[b % 26] for b in digest[: len(key) - 1])


def value_of(key: str) -> str:
    """The three-digit value under a key of `VALUE_KEY_LEN` letters."""
    return f"{int.from_bytes(_digest(key)[:4], 'big') % 1000:03d}"


def chain(key: str) -> list[str]:
    """The keys a solved episode looks up, from the task's key to the one holding the value."""
    keys = [key]
    while len(keys[-1]) > VALUE_KEY_LEN:
        keys.append(next_key(keys[-1]))
    return keys


def lookup(arguments: dict) -> str:
    key = arguments.get("key")
    if not (isinstance(key, str) and key.isascii() and key.isalpha() and key.islower() and len(key) >= VALUE_KEY_LEN):
        raise ToolError(f"no key {key!r}")
    return value_of(key) if len(key) == VALUE_KEY_LEN else next_key(key)


TOOLS = {"lookup": lookup}
