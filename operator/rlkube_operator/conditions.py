"""Standard conditions (metav1.Condition) kept by type, never by list position, and the text
the operator writes into a run's status and Events."""

import re

_ESCAPES = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
"""Terminal escape sequences: CSI (colours, cursor moves, clearing the screen), OSC (window
titles, hyperlinks) and the two-byte ones."""
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]+")
"""C0 and C1 control characters (newline, carriage return, NUL, bell, escape) and the
bidirectional overrides that reorder what a terminal shows."""


def printable(text: str) -> str:
    """`text` as a run's status and Events carry it: escape sequences dropped, every run of other
    control characters one space. Much of it comes from the run's pods (termination messages,
    the log tail `FallbackToLogsOnError` makes one of, waiting messages), which run the
    tenant's image: kept as they were, they would rewrite the terminal of whoever runs
    `kubectl describe` or `kubectl get events`, or hide a line of the message."""
    return _CONTROLS.sub(" ", _ESCAPES.sub("", text))


def set_condition(
    conditions: list[dict],
    type_: str,
    ok: bool | None,
    reason: str,
    message: str,
    *,
    generation: int | None,
    now: str,
) -> list[dict]:
    """Conditions with `type_` replaced; `lastTransitionTime` moves only when the status does."""
    status = "Unknown" if ok is None else ("True" if ok else "False")
    old = next((c for c in conditions if c.get("type") == type_), None)
    since = old["lastTransitionTime"] if old and old.get("status") == status else now
    new = {
        "type": type_,
        "status": status,
        "reason": printable(reason),
        "message": printable(message),
        "lastTransitionTime": since,
        "observedGeneration": generation,
    }
    return [c for c in conditions if c.get("type") != type_] + [new]


def get_condition(conditions: list[dict], type_: str) -> dict | None:
    return next((c for c in conditions if c.get("type") == type_), None)


class Conditions:
    """A run's conditions being rewritten in one reconcile, for one generation at one time."""

    def __init__(self, conditions: list[dict], generation: int | None, now: str):
        self.items = list(conditions)
        self.generation = generation
        self.now = now

    def set(self, type_: str, ok: bool | None, reason: str, message: str) -> bool:
        """Set the condition; True when its status, reason or message changed."""
        old = get_condition(self.items, type_)
        self.items = set_condition(
            self.items, type_, ok, reason, message, generation=self.generation, now=self.now
        )
        new = get_condition(self.items, type_)
        return old is None or any(old.get(k) != new[k] for k in ("status", "reason", "message"))

    def drop(self, type_: str) -> None:
        """Remove the condition of a component the run no longer has."""
        self.items = [c for c in self.items if c.get("type") != type_]
