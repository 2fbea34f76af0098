"""Standard conditions (metav1.Condition) kept by type, never by list position."""


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
        "reason": reason,
        "message": message,
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
