"""`rlkube pool @ pool.toml --run [NAME] @ a.toml --run [NAME] @ b.toml ...`: many runs on one pool.

Starts the pool's inference (vLLM with LoRA: `pool.max_runs` adapters of the slot's rank) and
trainer (`rlkube pool-trainer`) once, then each `--run` (an RL config as for `rlkube rl`, with
`trainer.lora` of the pool's shape; flags after it are that run's) as a member orchestrator
that attaches itself (rlkube.launch.pool). Configs go to `<output_dir>/configs/` and each
member's `<output_dir>/members/<member>/configs/` (`--dry-run` stops there, after every
member's fit to the pool was checked: exit code 2 naming the run and the field otherwise).
Exits once every member finished: 0, or 1 when one failed (the others went on without it);
Ctrl-C stops everything.
"""

import logging
import shutil
import sys

from rlkube.config import ConfigError, parse_cli
from rlkube.config.cli import exit_invalid
from rlkube.config.pool import PoolConfig
from rlkube.entrypoints.checks import check_references

COMMAND = "pool"


def main(argv: list[str] | None = None) -> int:
    from rlkube.launch.pool import members, split_runs

    argv = list(sys.argv[1:] if argv is None else argv)
    dry_run = "--dry-run" in argv  # anywhere: after a run's flags too
    try:
        pool_argv, runs = split_runs([a for a in argv if a != "--dry-run"])
    except ConfigError as e:
        return exit_invalid(COMMAND, e)
    config, _ = parse_cli(PoolConfig, COMMAND, pool_argv, check=check_references)
    try:
        pool_members = members(config, runs)
        for member in pool_members:
            check_references(member.config)
    except ConfigError as e:
        return exit_invalid(COMMAND, e)
    return launch(config, pool_members, dry_run)


def launch(config: PoolConfig, pool_members, dry_run: bool) -> int:
    from rich.console import Console

    from rlkube.launch.pool import check_free, child_stages, write_configs
    from rlkube.launch.progress import RunProgress
    from rlkube.launch.supervisor import Supervisor, install_sigterm_as_interrupt
    from rlkube.logs import setup_logging

    if not dry_run:
        try:
            check_free(config, pool_members)
        except RuntimeError as e:
            print(f"rlkube {COMMAND}: error: {e}", file=sys.stderr)
            return 2
        if config.clean_output_dir:
            shutil.rmtree(config.output_dir, ignore_errors=True)
    paths = write_configs(config, pool_members)
    setup_logging(config.log.level, file=config.output_dir / "logs" / "pool.log")
    log = logging.getLogger("rlkube.pool")
    for name, path in paths.items():
        log.info("%s config: %s", name, path)
    if dry_run:
        return 0
    lines = Console(force_terminal=False)  # a line per member's step, not several live lines
    progress = [RunProgress(f"http://127.0.0.1:{m.config.orchestrator.http_port}/status", m.config.max_steps,
                            interval_s=5, console=lines, label=m.name) for m in pool_members]
    supervisor = Supervisor()
    undo = install_sigterm_as_interrupt()
    try:
        code = supervisor.run(child_stages(config, pool_members, paths), config.inference.startup_timeout_s,
                              tick=lambda: [p.tick() for p in progress])
    finally:
        undo()
    for name, why in supervisor.failed.items():
        log.error("member %s failed: %s (logs: %s)", name, why, config.member_dir(name) / "logs")
    log.info("members finished: %s; failed: %s", ", ".join(supervisor.finished) or "none",
             ", ".join(supervisor.failed) or "none")
    return code or (1 if supervisor.failed else 0)


if __name__ == "__main__":
    sys.exit(main())
