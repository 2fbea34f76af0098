"""`rlkube inference @ inference.toml`: one vLLM server with rlkube's weight updates.

    rlkube inference --model.name outputs/tiny-model --port 8000 --kv-cache-space-gb 2

See `rlkube.inference.server` for the routes it serves.
"""

import sys

from rlkube.config import InferenceConfig, parse_cli, to_toml
from rlkube.entrypoints.checks import check_references


def main(argv: list[str] | None = None) -> int:
    config, dry_run = parse_cli(InferenceConfig, "inference", argv, check=check_references)
    if dry_run:
        print(to_toml(config))
        return 0
    from rlkube.inference.server import serve

    return serve(config)


if __name__ == "__main__":
    sys.exit(main())
