"""`rlkube export --run DIR [--step N] [--out DIR] [--dtype D] [--lora merge|adapter]`: one step
of an RL or SFT run as a Hugging Face model directory (rlkube.trainer.export).

    rlkube export --run outputs/reverse_text/rl                  # newest checkpoint -> <run>/export/step_N
    rlkube eval --model.name outputs/reverse_text/rl/export/step_20
"""

import sys

from rlkube.config import ConfigError, parse_cli, to_toml
from rlkube.config.cli import exit_invalid
from rlkube.config.export import ExportConfig


def main(argv: list[str] | None = None) -> int:
    config, dry_run = parse_cli(ExportConfig, "export", argv)
    if dry_run:
        print(to_toml(config))
        return 0
    from rlkube.manifest import Refused
    from rlkube.trainer.export import export

    try:
        out = export(config)
    except (ConfigError, Refused) as e:  # a wrong field, or a checkpoint its trainer did not write
        return exit_invalid("export", e)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
