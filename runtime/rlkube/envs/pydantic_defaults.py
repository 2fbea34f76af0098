"""Remember whether a pydantic default factory takes the validated data.

`BaseModel.model_construct` fills every unset field that has a `default_factory`, and for each
one pydantic (2.14) asks `inspect.signature(factory)` whether it takes the validated data, on
every call (pydantic issue 13376). For a builtin factory such as `list` that means parsing its
text signature and copying `sys.modules`: about 1 ms in a process that imported torch. verifiers
builds its trace graph's nodes with `model_construct` (several per model call), so this was
~20% of the orchestrator's CPU per rollout (benchmarks/RESULTS.md).

The answer depends only on the factory, which a field keeps for its lifetime, so it is computed
once per factory. Unhashable factories are asked every time, as before.
"""

from collections.abc import Callable
from typing import Any

from pydantic._internal import _fields

_takes_validated_data = _fields.takes_validated_data_argument
_known: dict[Callable, bool] = {}


def _remembered(default_factory: Callable[..., Any]) -> bool:
    try:
        return _known[default_factory]
    except KeyError:
        answer = _known[default_factory] = _takes_validated_data(default_factory)
        return answer
    except TypeError:  # unhashable
        return _takes_validated_data(default_factory)


def remember_default_factory_signatures() -> None:
    """Install the memo in pydantic (idempotent; process-wide)."""
    _fields.takes_validated_data_argument = _remembered
