"""`rlkube orchestrator @ orchestrator.toml`: environments, rollouts and batches for the trainer.

    rlkube orchestrator @ outputs/run/configs/orchestrator.toml
"""

import sys

from rlkube.config import OrchestratorConfig, parse_cli, to_toml
from rlkube.entrypoints.checks import check_references


def serve_main(command: str, serve_module: str, argv: list[str] | None) -> int:
    """Parse an orchestrator config (`--dry-run` prints it) and run `serve_module.serve` on it:
    the orchestrator itself, or one of its env workers, which read the same file. Both run
    environments, so the run's secrets leave the environment first (`rlkube.withheld`)."""
    from rlkube.withheld import withhold

    withhold()
    config, dry_run = parse_cli(OrchestratorConfig, command, argv, check=check_references)
    withhold(tuple(c.api_key_env for c in (config.judge, config.teacher) if c is not None and c.api_key_env))
    if dry_run:
        print(to_toml(config))
        return 0
    import asyncio
    import importlib

    from rlkube.logs import setup_logging

    setup_logging(config.log.level)  # `rlkube rl` and the pods capture the console
    asyncio.run(importlib.import_module(serve_module).serve(config))
    return 0


def main(argv: list[str] | None = None) -> int:
    return serve_main("orchestrator", "rlkube.orchestrator.app", argv)


if __name__ == "__main__":
    sys.exit(main())
