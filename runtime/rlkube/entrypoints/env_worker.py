"""`rlkube env-worker @ orchestrator.toml`: run the orchestrator's rollouts in another process.

    rlkube env-worker @ outputs/run/configs/orchestrator.toml [--rollouts.host orchestrator]

The orchestrator's own config (`orchestrator.env_workers > 0`); `rollouts.host`/`rollouts.port`
is where it dials the orchestrator. See rlkube.orchestrator.env_worker.
"""

import sys

from rlkube.config import OrchestratorConfig, parse_cli, to_toml


def main(argv: list[str] | None = None) -> int:
    config, dry_run = parse_cli(OrchestratorConfig, "env-worker", argv)
    if dry_run:
        print(to_toml(config))
        return 0
    import asyncio

    from rlkube.logs import setup_logging
    from rlkube.orchestrator.env_worker import serve

    setup_logging(config.log.level)  # `rlkube rl` and the pods capture the console
    asyncio.run(serve(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
