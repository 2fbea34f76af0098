"""Process logging: one format for every rlkube process, rank-aware under torchrun.

    from rlkube.logs import setup_logging, get_logger
    setup_logging("info", file=output_dir / "logs" / "trainer.log")
    logger = get_logger(__name__)
"""

import logging
import os
from pathlib import Path

_FORMAT = "%(asctime)s %(levelname)-7s %(rank)s%(name)s: %(message)s"
_DATEFMT = "%H:%M:%S"


class _RankFilter(logging.Filter):
    """Prefix records with `[rank N] ` under a multi-process torchrun job."""

    def __init__(self) -> None:
        super().__init__()
        world = int(os.environ.get("WORLD_SIZE", "1"))
        self.prefix = f"[rank {os.environ.get('RANK', '0')}] " if world > 1 else ""

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.prefix
        return True


def setup_logging(level: str = "info", file: str | Path | None = None) -> logging.Logger:
    """Configure the `rlkube` logger (console, plus `file` when given); returns it.

    Idempotent: calling it again replaces the handlers it installed before.
    """
    logger = logging.getLogger("rlkube")
    logger.setLevel(level.upper())
    logger.propagate = False
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if file is not None:
        Path(file).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(file))
    for handler in handlers:
        handler.setFormatter(logging.Formatter(_FORMAT, _DATEFMT))
        handler.addFilter(_RankFilter())
        logger.addHandler(handler)
    return logger


def get_logger(name: str) -> logging.Logger:
    """A logger under `rlkube` (pass `__name__`; modules outside rlkube are nested under it)."""
    return logging.getLogger(name if name.startswith("rlkube") else f"rlkube.{name}")
