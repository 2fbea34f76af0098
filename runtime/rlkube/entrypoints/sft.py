"""`rlkube sft @ sft.toml [--field value ...]`: supervised fine-tuning.

One process, or FSDP2 over several: `torchrun --nproc-per-node 2 -m rlkube.entrypoints.sft @ sft.toml`.
`--bench` trains on random tokens and prints tokens/s.
"""

import sys

from rlkube.config import SFTConfig, parse_cli, to_toml
from rlkube.entrypoints.checks import check_references

CONFIG, COMMAND = SFTConfig, "sft"
"""What `rlkube torchrun` checks before it starts the ranks."""


def main(argv: list[str] | None = None) -> int:
    config, dry_run = parse_cli(CONFIG, COMMAND, argv, check=check_references)
    if dry_run:
        print(to_toml(config))
        return 0
    from rlkube.trainer.sft.train import SFTTrainer

    trainer = SFTTrainer(config)
    try:
        trainer.run()
    finally:
        trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
