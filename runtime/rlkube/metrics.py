"""Where a process's metrics go: a console line, a JSONL file, optionally W&B.

One `MetricsSink` per process (`trainer`, `sft`, `orchestrator`, ...). Every record is one
JSON line `{"step": N, "time": unix_seconds, **metrics}` in `<output_dir>/metrics/<process>.jsonl`,
flushed at once so a crash loses nothing already logged. W&B is optional and defaults to
offline mode, which needs no network (`wandb sync <output_dir>/wandb/...` later).

Records may arrive out of step order: the orchestrator logs batch n+1 before the policy update
and eval of step n when it runs ahead (`async_level` >= 1). W&B drops a `log(..., step=s)` whose
`s` is below one it has seen, so the step goes to W&B as a metric (`step`, the x-axis of every
chart via `define_metric`) and W&B's own `_step` just counts records.

    sink = MetricsSink(output_dir, "sft", wandb=config.wandb, run_config=config.model_dump(mode="json"))
    sink.log(step, {"loss": 1.2, "lr": 1e-3})
    sink.close()
"""

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Self

from rlkube.config import WandbConfig


def format_metrics(step: int, metrics: dict[str, Any]) -> str:
    """`step 12 | loss 1.2346 | lr 1.00e-03 | ...` for the console."""

    def fmt(value: Any) -> str:
        if isinstance(value, float):
            if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5) and math.isfinite(value):
                return f"{value:.2e}"
            return f"{value:.4f}"
        return str(value)

    return " | ".join([f"step {step}"] + [f"{k} {fmt(v)}" for k, v in metrics.items()])


class MetricsSink:
    """Console + JSONL + optional W&B for one process. Only the main rank should log
    (`enabled=False` elsewhere makes every call a no-op)."""

    def __init__(
        self,
        output_dir: str | Path,
        process: str,
        *,
        wandb: WandbConfig | None = None,
        run_config: dict | None = None,
        console: bool = True,
        enabled: bool = True,
    ) -> None:
        from rich.console import Console

        self.enabled = enabled
        self.console = console
        self.console_out = Console(stderr=True, highlight=False, soft_wrap=True)
        """The console lines go to; share it with a rich progress bar so both render cleanly."""
        self.path = Path(output_dir) / "metrics" / f"{process}.jsonl"
        self._file = None
        self._wandb_run = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", buffering=1)  # noqa: SIM115 - line-buffered; close() closes it
        if wandb is not None:
            self._wandb_run = _init_wandb(wandb, Path(output_dir), process, run_config)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Record `metrics` at `step` everywhere this sink writes."""
        if not self.enabled:
            return
        record = {"step": step, "time": round(time.time(), 3), **metrics}
        self._file.write(json.dumps(record) + "\n")
        if self.console:
            self.console_out.print(format_metrics(step, metrics))
        if self._wandb_run is not None:
            self._wandb_run.log({**metrics, "step": step})

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._wandb_run is not None:
            self._wandb_run.finish()
            self._wandb_run = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _init_wandb(config: WandbConfig, output_dir: Path, process: str, run_config: dict | None):
    import wandb

    os.environ.setdefault("WANDB_SILENT", "true")
    (output_dir / "wandb").mkdir(parents=True, exist_ok=True)
    run = wandb.init(
        project=config.project,
        entity=config.entity,
        name=f"{config.name or output_dir.name}-{process}",
        group=config.group,
        mode=config.mode,
        dir=str(output_dir),
        config=run_config,
        reinit="create_new",
    )
    run.define_metric("step")
    run.define_metric("*", step_metric="step")
    return run


def read_metrics(output_dir: str | Path, process: str) -> list[dict]:
    """All records of a process's metrics file, in order (for tests and tools)."""
    path = Path(output_dir) / "metrics" / f"{process}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
