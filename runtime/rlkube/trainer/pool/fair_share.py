"""Which ready member trains next: weighted fair share of trained tokens.

Each member's virtual time is its trained tokens over its weight; of the members whose next
batch is ready, the one furthest behind trains next (ties by name). A member with four times
the batch trains a quarter as often, so trained tokens stay within one batch of equal shares;
a member whose batch is not ready is skipped, and catches up (up to its share) once it is.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    name: str
    tokens: int
    weight: float


def pick(ready: list[Candidate]) -> str | None:
    """The ready member with the least tokens per unit of weight, or None when none is ready."""
    if not ready:
        return None
    return min(ready, key=lambda c: (c.tokens / c.weight, c.name)).name


def shares(tokens: dict[str, int]) -> dict[str, float]:
    """Each member's fraction of all tokens trained (0 for all before any)."""
    total = sum(tokens.values())
    return {name: (count / total if total else 0.0) for name, count in tokens.items()}
