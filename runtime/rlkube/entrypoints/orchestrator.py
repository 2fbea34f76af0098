"""`rlkube orchestrator @ orchestrator.toml`: environments, rollouts and batches for the trainer.

    rlkube orchestrator @ outputs/run/configs/orchestrator.toml
"""

import sys

from rlkube.config import OrchestratorConfig, parse_cli, to_toml


def main(argv: list[str] | None = None) -> int:
    config, dry_run = parse_cli(OrchestratorConfig, "orchestrator", argv)
    if dry_run:
        print(to_toml(config))
        return 0
    import asyncio

    from rlkube.logs import setup_logging
    from rlkube.orchestrator.app import serve

    setup_logging(config.log.level)  # `rlkube rl` and the pods capture the console
    asyncio.run(serve(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
