"""The memory check of `rlkube rl` and `rlkube sft` (`rlkube.trainer.memory`): `--dry-run`
prints the estimate per GPU, and a config that names its `gpu` is refused before anything
starts when the estimate does not fit it, with the numbers."""

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from rlkube.config import RLConfig, SFTConfig

if TYPE_CHECKING:
    from rlkube.trainer.memory import MemoryReport


def check_memory(estimate: Callable[[], "MemoryReport"], config: RLConfig | SFTConfig, dry_run: bool,
                 prefix: str = "") -> bool:
    """False when the run must not start. `estimate` runs on `--dry-run` and whenever the
    config names its `gpu`; its lines are printed on `--dry-run`, each after `prefix`."""
    if not dry_run and config.gpu is None:
        return True
    try:
        report = estimate()
    except (OSError, ValueError, KeyError) as e:  # an architecture that cannot be read offline
        print(f"{prefix}memory estimate: skipped ({type(e).__name__}: {e})")
        return True
    if dry_run:
        print("\n".join(prefix + line for line in report.lines))
    if report.problems:
        print(f"invalid config: gpu '{config.gpu}' has too little memory for it:\n"
              + "\n".join(f"  {problem}" for problem in report.problems), file=sys.stderr)
        return False
    return True
