"""Remember the token ids of the assistant header that renderers look for in every response.

`renderers.reasoning._after_header` (renderers 0.1.12) skips an assistant header such as
`<|im_start|>assistant\\n` at the start of a token sequence, and tokenizes the header text to
find it: `tokenizer.encode(header)`, on every call. Parsing one response calls it up to three
times (the prompt's tail for reasoning left open by the prompt, then the completion), each a
fast-tokenizer round trip of ~70 us on the event loop, ~4% of the lean path's CPU per rollout
(docs/orchestrator.md).

The ids depend only on the tokenizer and the header text, so they are computed once per
(tokenizer, header, vocabulary size): `_after_header` runs unchanged on a view of the tokenizer
whose `encode` answers from that memo and which passes everything else (`decode`, ...) to the
tokenizer. A tokenizer that cannot be weakly referenced is used as before.
"""

from typing import Any
from weakref import WeakKeyDictionary

from renderers import reasoning

_original_after_header = reasoning._after_header
_views: "WeakKeyDictionary[Any, _RememberedEncodings]" = WeakKeyDictionary()


class _RememberedEncodings:
    """A tokenizer whose `encode` remembers its answers (see the module docstring)."""

    def __init__(self, tokenizer: Any):
        self._tokenizer = tokenizer
        self._encoded: dict[tuple, list[int]] = {}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        try:
            vocabulary = len(self._tokenizer)
        except TypeError:
            vocabulary = None
        key = (text, add_special_tokens, vocabulary)
        ids = self._encoded.get(key)
        if ids is None:
            ids = self._encoded[key] = list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens))
        return list(ids)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


def _after_header(tokenizer: Any, ids: list[int], header: str, *, last: bool = False) -> list[int]:
    try:
        view = _views.get(tokenizer)
        if view is None:
            view = _views[tokenizer] = _RememberedEncodings(tokenizer)
    except TypeError:  # not weakly referenceable or unhashable
        view = tokenizer
    return _original_after_header(view, ids, header, last=last)


def remember_header_ids() -> None:
    """Install the memo in renderers (idempotent; process-wide)."""
    reasoning._after_header = _after_header
