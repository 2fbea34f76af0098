"""The console line of `rlkube rl`: step / max_steps, mean reward, seconds per step, ETA and the
last checkpoint, read from the orchestrator's `/status` (the same JSON the operator reads).

On a terminal it is one live line (rich) under the supervisor's log lines; otherwise (CI, a
file, `nohup`) a plain line each time the step changes, so the output stays greppable.
"""

import json
import logging
import sys
import time
import urllib.request
from collections import deque
from typing import Self

from rich.console import Console
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

STEP_WINDOW = 10
"""Seconds per step are measured over the newest this many steps (the first ones include the
engine's start and the first weight update)."""


def format_duration(seconds: float) -> str:
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


class RunProgress:
    """`with RunProgress(status_url, max_steps) as progress:` then `progress.tick()` as often as
    convenient: it reads `/status` at most every `interval_s` and shows what changed."""

    def __init__(self, status_url: str, max_steps: int, interval_s: float = 2.0, console: Console | None = None,
                 label: str = ""):
        """`label`: the line's prefix (a pool's member name)."""
        self.status_url, self.max_steps, self.interval_s, self.label = status_url, max_steps, interval_s, label
        self.console = console or Console()
        self.seen: deque[tuple[float, int]] = deque(maxlen=STEP_WINDOW + 1)
        """(time first seen, step) for the newest steps."""
        self.status: dict | None = None
        self.next_poll = 0.0
        self.live: Live | None = None
        self._log_streams: list = []

    def __enter__(self) -> Self:
        if self.console.is_terminal:
            self.live = Live(self.render(), console=self.console, refresh_per_second=2, redirect_stderr=True)
            self.live.start()
            self._route_logs_above_the_line()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.update(self.render())
            self.live.stop()
            for handler, stream in self._log_streams:
                handler.setStream(stream)

    def _route_logs_above_the_line(self) -> None:
        """Console log handlers hold the stderr of their creation: point them at rich's proxy
        (installed by `redirect_stderr`), which prints above the live line instead of through it."""
        for handler in logging.getLogger("rlkube").handlers:
            if type(handler) is logging.StreamHandler and handler.stream in (sys.__stderr__, self.console.file):
                self._log_streams.append((handler, handler.setStream(sys.stderr)))

    def tick(self) -> None:
        now = time.monotonic()
        if now < self.next_poll:
            return
        self.next_poll = now + self.interval_s
        status = self._read_status()
        if status is None:
            return
        step = int(status.get("step") or 0)
        changed = self.status is None or step != self.status.get("step")
        self.status = status
        if changed and step > 0 and (not self.seen or step > self.seen[-1][1]):
            self.seen.append((now, step))
        if self.live is not None:
            self.live.update(self.render())
        elif changed and step > 0:
            self.console.print(self.line(), highlight=False, soft_wrap=True)

    def _read_status(self) -> dict | None:
        try:
            with urllib.request.urlopen(self.status_url, timeout=2) as response:
                return json.load(response)
        except (OSError, ValueError):
            return None  # not up yet, or restarting: the next tick tries again

    def seconds_per_step(self) -> float | None:
        if len(self.seen) < 2:
            return None
        (t0, s0), (t1, s1) = self.seen[0], self.seen[-1]
        return (t1 - t0) / (s1 - s0)

    def line(self) -> str:
        prefix = [self.label] if self.label else []
        if self.status is None:
            return " | ".join([*prefix, f"step 0/{self.max_steps}", "waiting for the orchestrator"])
        step = int(self.status.get("step") or 0)
        parts = [*prefix, f"step {step}/{self.max_steps}"]
        if self.status.get("reward") is not None:
            parts.append(f"reward {self.status['reward']:.3f}")
        per_step = self.seconds_per_step()
        if per_step is not None:
            parts.append(f"{per_step:.1f} s/step")
            parts.append(f"ETA {format_duration(per_step * max(self.max_steps - step, 0))}")
        if self.status.get("last_checkpoint_step") is not None:
            parts.append(f"ckpt {self.status['last_checkpoint_step']}")
        return " | ".join(parts)

    def render(self) -> Table:
        """The bar (up to 30 columns, none on a narrow terminal) and the line, on one row."""
        step = int((self.status or {}).get("step") or 0)
        line = self.line()
        bar_width = min(30, self.console.width - len(line) - 1)
        grid = Table.grid(padding=(0, 1))
        text = Text(line, no_wrap=True, overflow="ellipsis")
        if bar_width >= 10:
            grid.add_row(ProgressBar(total=self.max_steps, completed=step, width=bar_width), text)
        else:
            grid.add_row(text)
        return grid
