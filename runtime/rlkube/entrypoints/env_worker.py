"""`rlkube env-worker @ orchestrator.toml`: run the orchestrator's rollouts in another process.

    rlkube env-worker @ outputs/run/configs/orchestrator.toml [--rollouts.host orchestrator]

The orchestrator's own config (`orchestrator.env_workers > 0`); `rollouts.host`/`rollouts.port`
is where it dials the orchestrator. See rlkube.orchestrator.env_worker.
"""

import sys

from rlkube.entrypoints.orchestrator import serve_main


def main(argv: list[str] | None = None) -> int:
    return serve_main("env-worker", "rlkube.orchestrator.env_worker", argv)


if __name__ == "__main__":
    sys.exit(main())
