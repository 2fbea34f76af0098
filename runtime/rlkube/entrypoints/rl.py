"""`rlkube rl @ rl.toml`: inference, orchestrator and trainer as local child processes.

Writes each process's resolved config to `<output_dir>/configs/` (`--dry-run` stops there),
starts the children with logs in `<output_dir>/logs/`, shows the run's progress on the console
(step, reward, seconds per step, ETA, last checkpoint), stops them all when one fails or on
Ctrl-C, and exits 0 once the trainer has finished `max_steps`.
"""

import logging
import shutil
import sys

from rlkube.config import RLConfig, parse_cli
from rlkube.entrypoints.checks import check_references
from rlkube.entrypoints.memory import check_memory


def main(argv: list[str] | None = None) -> int:
    config, dry_run = parse_cli(RLConfig, "rl", argv, check=check_references)
    from rlkube.launch.gpus import place_gpus, trainer_share, visible_gpus
    from rlkube.launch.local import check_ports, child_stages, write_process_configs
    from rlkube.launch.progress import RunProgress
    from rlkube.launch.supervisor import Supervisor, install_sigterm_as_interrupt
    from rlkube.logs import setup_logging

    resuming = config.ckpt is not None and config.ckpt.resume_step is not None
    try:
        gpus = place_gpus(config, visible_gpus())
        if not dry_run:
            check_ports(config)  # before anything is deleted or started
            if config.clean_output_dir:
                if resuming:
                    raise ValueError("clean_output_dir: refused when resuming (ckpt.resume_step is set)")
                shutil.rmtree(config.output_dir, ignore_errors=True)
    except (ValueError, RuntimeError) as e:
        print(f"rlkube rl: error: {e}", file=sys.stderr)
        return 2

    def estimate():
        from rlkube.trainer.memory import rl_memory

        return rl_memory(config, config.trainer.nproc_per_node, trainer_share(config))

    if not check_memory(estimate, config, dry_run):
        return 2
    paths = write_process_configs(config)
    setup_logging(config.log.level, file=config.output_dir / "logs" / "rl.log")
    log = logging.getLogger("rlkube.rl")
    for name, path in paths.items():
        log.info("%s config: %s", name, path)
    batch = config.orchestrator
    log.info("batch: %d rollouts a step (%d tasks x group_size %d)", batch.batch_size,
             batch.batch_size // batch.group_size, batch.group_size)
    if gpus:
        servers = [(f"{name}-{i}", d) for name, each in (("inference", gpus.inference), *gpus.served.items())
                   for i, d in enumerate(each)]
        log.info("GPUs (CUDA_VISIBLE_DEVICES): %s, trainer %s",
                 ", ".join(f"{name} {','.join(d)}" for name, d in servers), ",".join(gpus.trainer))
    if dry_run:
        return 0
    undo = install_sigterm_as_interrupt()
    status_url = f"http://127.0.0.1:{config.orchestrator.http_port}/status"
    try:
        with RunProgress(status_url, config.max_steps) as progress:
            code = Supervisor().run(child_stages(config, paths, gpus), config.inference.startup_timeout_s, tick=progress.tick)
    finally:
        undo()
    log.info("finished" if code == 0 else f"failed (exit code {code}); see {config.output_dir / 'logs'}")
    return code


if __name__ == "__main__":
    sys.exit(main())
