"""`rlkube pool-trainer @ pool.toml`: one trainer for many runs' LoRA adapters (run under
`torchrun` for several ranks); member orchestrators attach to it.

    torchrun --nproc-per-node 2 -m rlkube.entrypoints.pool_trainer @ pool.toml
"""

import sys

from rlkube.config import parse_cli, to_toml
from rlkube.config.pool import PoolTrainerConfig

CONFIG, COMMAND = PoolTrainerConfig, "pool-trainer"


def main(argv: list[str] | None = None) -> int:
    config, dry_run = parse_cli(CONFIG, COMMAND, argv)
    if dry_run:
        print(to_toml(config))
        return 0
    import os

    from rlkube.logs import setup_logging
    from rlkube.trainer.pool.run import run

    setup_logging(config.log.level if int(os.environ.get("RANK", "0")) == 0 else "warning")
    run(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
