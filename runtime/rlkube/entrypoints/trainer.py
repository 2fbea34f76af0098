"""`rlkube trainer @ trainer.toml`: the RL trainer (run under `torchrun` for several ranks).

    torchrun --nproc-per-node 2 -m rlkube.entrypoints.trainer @ outputs/run/configs/trainer.toml
"""

import sys

from rlkube.config import TrainerConfig, parse_cli, to_toml
from rlkube.entrypoints.checks import check_references

CONFIG, COMMAND = TrainerConfig, "trainer"
"""What `rlkube torchrun` checks before it starts the ranks."""


def main(argv: list[str] | None = None) -> int:
    config, dry_run = parse_cli(CONFIG, COMMAND, argv, check=check_references)
    if dry_run:
        print(to_toml(config))
        return 0
    import os

    from rlkube.config.cli import exit_invalid
    from rlkube.logs import setup_logging
    from rlkube.manifest import Refused
    from rlkube.trainer.rl.trainer import run

    rank = int(os.environ.get("RANK", "0"))
    setup_logging(config.log.level if rank == 0 else "warning")
    try:
        run(config)
    except Refused as e:  # a checkpoint not written by this run's trainer: resuming cannot fix it
        return exit_invalid(COMMAND, e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
