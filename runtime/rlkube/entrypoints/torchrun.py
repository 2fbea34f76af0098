"""`rlkube torchrun [torchrun options] -m rlkube.entrypoints.trainer @ trainer.toml`: torchrun
that fails the way its ranks do.

torchrun exits 1 whatever its ranks exited with, so a rank's deterministic failure (exit code 2:
an invalid config, a missing model) would read as a crash worth a restart. This launcher parses
the ranks' config first (its error exits 2 before any rank starts, in the termination message),
then runs torchrun in this process and exits 2 when a rank exited 2. Any other failure exits 1,
as torchrun does.
"""

import importlib
import sys

from rlkube.config import parse_cli
from rlkube.config.cli import EXIT_INVALID
from rlkube.entrypoints.checks import check_references

RANK_ENTRYPOINTS = ("rlkube.entrypoints.trainer", "rlkube.entrypoints.sft")
"""Modules whose config the launcher checks: each names its `CONFIG` model and `COMMAND`."""


def check_rank_config(argv: list[str]) -> None:
    """Exit 2 with the field and the reason when the config the ranks will read is invalid."""
    flag = next((i for i, a in enumerate(argv) if a in ("-m", "--module")), None)
    if flag is None or flag + 1 >= len(argv) or argv[flag + 1] not in RANK_ENTRYPOINTS:
        return
    entrypoint = importlib.import_module(argv[flag + 1])
    parse_cli(entrypoint.CONFIG, entrypoint.COMMAND, argv[flag + 2:], check=check_references)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    check_rank_config(argv)  # before torch is imported: a config error answers in a second
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    try:
        run(parse_args(argv))
    except ChildFailedError as e:
        print(e.format_msg(), file=sys.stderr)
        codes = sorted({failure.exitcode for failure in e.failures.values()})
        if EXIT_INVALID in codes:
            print(f"rlkube torchrun: a rank exited with code {EXIT_INVALID} (no restart fixes it)", file=sys.stderr)
            return EXIT_INVALID
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
