"""`rlkube sft @ sft.toml [--field value ...]`: supervised fine-tuning.

One process, or FSDP2 over several: `torchrun --nproc-per-node 2 -m rlkube.entrypoints.sft @ sft.toml`.
`--bench` trains on random tokens and prints tokens/s.
"""

import os
import sys

from rlkube.config import SFTConfig, parse_cli, to_toml
from rlkube.entrypoints.checks import check_references
from rlkube.entrypoints.memory import check_memory

CONFIG, COMMAND = SFTConfig, "sft"
"""What `rlkube torchrun` checks before it starts the ranks."""


def main(argv: list[str] | None = None) -> int:
    config, dry_run = parse_cli(CONFIG, COMMAND, argv, check=check_references)
    if dry_run:
        print(to_toml(config))

    def estimate():
        from rlkube.trainer.memory import sft_memory

        return sft_memory(config, int(os.environ.get("WORLD_SIZE", "1")))

    if not check_memory(estimate, config, dry_run, prefix="# "):  # TOML comments after the TOML
        return 2
    if dry_run:
        return 0
    from rlkube.config.cli import exit_invalid
    from rlkube.manifest import Refused
    from rlkube.trainer.sft.train import SFTTrainer

    trainer = SFTTrainer(config)
    try:
        trainer.run()
    except Refused as e:  # a checkpoint not written by this run's trainer: resuming cannot fix it
        return exit_invalid(COMMAND, e)
    finally:
        trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
