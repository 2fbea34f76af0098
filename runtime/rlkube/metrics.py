"""Where a process's metrics go: a console line, a JSONL file, optionally W&B and Prometheus.

One `MetricsSink` per process (`trainer`, `sft`, `orchestrator`, ...). Every record is one
JSON line `{"step": N, "time": unix_seconds, **metrics}` in `<output_dir>/metrics/<process>.jsonl`,
flushed at once so a crash loses nothing already logged. W&B is optional and defaults to
offline mode, which needs no network (`wandb sync <output_dir>/wandb/...` later).

Records may arrive out of step order: the orchestrator logs batch n+1 before the policy update
and eval of step n when it runs ahead (`async_level` >= 1). W&B drops a `log(..., step=s)` whose
`s` is below one it has seen, so the step goes to W&B as a metric (`step`, the x-axis of every
chart via `define_metric`) and W&B's own `_step` just counts records.

Prometheus sees the newest value of every numeric metric as a gauge `rlkube_<process>_<name>`
(`PrometheusMetrics`; `/` and other symbols become `_`, so `perf/mfu` is
`rlkube_trainer_perf_mfu`), rendered by a process's own HTTP server or, with
`prometheus_port`, served by the sink itself. A histogram (`rlkube.histogram`: a record's
`<name>/count`, `/sum` and `/le_<bound>` keys) is added up into a Prometheus histogram
`rlkube_<name>` with a `process` label: the same name on every pod kind that reports it
(`tool/latency_s` is `rlkube_tool_latency_s_bucket{le="0.5",process="orchestrator"}`).

    sink = MetricsSink(output_dir, "sft", wandb=config.wandb, run_config=config.model_dump(mode="json"))
    sink.log(step, {"loss": 1.2, "lr": 1e-3})
    sink.close()
"""

import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any, Self

from rlkube.config import WandbConfig
from rlkube.histogram import BOUNDS, Histogram


def format_metrics(step: int, metrics: dict[str, Any]) -> str:
    """`step 12 | loss 1.2346 | lr 1.00e-03 | ...` for the console."""

    def fmt(value: Any) -> str:
        if isinstance(value, float):
            if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5) and math.isfinite(value):
                return f"{value:.2e}"
            return f"{value:.4f}"
        return str(value)

    shown = {k: v for k, v in metrics.items() if not is_histogram_count(k)}
    return " | ".join([f"step {step}"] + [f"{k} {fmt(v)}" for k, v in shown.items()])


def is_histogram_count(key: str) -> bool:
    """A histogram's mergeable keys (`<name>/count`, `/sum`, `/le_<bound>`): for files and
    Prometheus, not the console (which shows its mean, p50, p99 and max)."""
    name, _, suffix = key.rpartition("/")
    return name in BOUNDS and (suffix in ("count", "sum") or suffix.startswith("le_"))


def prometheus_name(key: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", key).strip("_")


class PrometheusMetrics:
    """Every numeric metric logged by `process` as a gauge `rlkube_<process>_<name>`, and every
    histogram as a Prometheus histogram `rlkube_<name>{process=...}`, summed over the records."""

    def __init__(self, process: str = "orchestrator"):
        from prometheus_client import CollectorRegistry

        self.process = process
        self.registry = CollectorRegistry()
        self.gauges: dict = {}
        self.histograms: dict[str, Histogram] = {}
        self.registry.register(self)

    def describe(self) -> list:
        return []  # unchecked: the families appear as histograms are logged

    def collect(self):
        from prometheus_client.core import HistogramMetricFamily

        for name, histogram in self.histograms.items():
            family = HistogramMetricFamily(f"rlkube_{prometheus_name(name)}", f"rlkube histogram {name}", labels=["process"])
            buckets = [(f"{b:g}", float(c)) for b, c in zip(histogram.bounds, histogram.cumulative())]
            family.add_metric([self.process], buckets + [("+Inf", float(histogram.count))], histogram.sum)
            yield family

    def _gauge(self, key: str):
        from prometheus_client import Gauge

        name = f"rlkube_{self.process}_" + prometheus_name(key)
        if name not in self.gauges:
            self.gauges[name] = Gauge(name, f"{self.process} metric {key}", registry=self.registry)
        return self.gauges[name]

    def update(self, metrics: dict[str, Any]) -> None:
        for name in BOUNDS:
            if metrics.get(f"{name}/count"):
                self.histograms.setdefault(name, Histogram(name)).add_counts(metrics)
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not is_histogram_count(key):
                self._gauge(key).set(value)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    def serve(self, host: str, port: int):
        """Serve `/metrics` from a daemon thread, with bounded connections and a deadline on
        each request (`readonly_http`: it runs inside the training process); returns the server
        (`.shutdown()` stops it, `.server_port` is the bound port)."""
        from prometheus_client.exposition import MetricsHandler

        from rlkube import readonly_http

        return readonly_http.serve(host, port, MetricsHandler.factory(self.registry), f"{self.process}-metrics")


class MetricsSink:
    """Console + JSONL + optional W&B and Prometheus endpoint for one process. Only the main
    rank should log (`enabled=False` elsewhere makes every call a no-op)."""

    def __init__(
        self,
        output_dir: str | Path,
        process: str,
        *,
        wandb: WandbConfig | None = None,
        run_config: dict | None = None,
        console: bool = True,
        enabled: bool = True,
        prometheus: tuple[str, int] | None = None,
    ) -> None:
        """`prometheus`: (host, port) to serve the metrics on for Prometheus (port 0: any free one)."""
        from rich.console import Console

        self.enabled = enabled
        self.console = console
        self.console_out = Console(stderr=True, highlight=False, soft_wrap=True)
        """The console lines go to; share it with a rich progress bar so both render cleanly."""
        self.path = Path(output_dir) / "metrics" / f"{process}.jsonl"
        self._file = None
        self._wandb_run = None
        self.prometheus: PrometheusMetrics | None = None
        self._prometheus_server = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", buffering=1)  # noqa: SIM115 - line-buffered; close() closes it
        if wandb is not None:
            self._wandb_run = _init_wandb(wandb, Path(output_dir), process, run_config)
        if prometheus is not None:
            self.prometheus = PrometheusMetrics(process)
            self._prometheus_server = self.prometheus.serve(*prometheus)

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
        if self.prometheus is not None:
            self.prometheus.update({**metrics, "step": step})

    def log_rows(self, step: int, name: str, rows: list[dict[str, Any]]) -> Path | None:
        """A table of `rows` (dicts with the same keys) at `step`: `<output_dir>/<name>/step_N.jsonl`
        and, with W&B, a table under `name`. Returns the file (None when disabled)."""
        if not self.enabled or not rows:
            return None
        path = self.path.parents[1] / name / f"step_{step}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        if self._wandb_run is not None:
            import wandb

            columns = list(rows[0])
            table = wandb.Table(columns=columns, data=[[row[c] for c in columns] for row in rows])
            self._wandb_run.log({name: table, "step": step})
        return path

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._wandb_run is not None:
            self._wandb_run.finish()
            self._wandb_run = None
        if self._prometheus_server is not None:
            self._prometheus_server.shutdown()
            self._prometheus_server.server_close()
            self._prometheus_server = None

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


class MetricsError(ValueError):
    """Metrics that cannot be read (naming the file and line) or a run directory without them."""


def read_metrics(output_dir: str | Path, process: str) -> list[dict]:
    """All records of a process's metrics file, in order (for tests and tools)."""
    return read_records(Path(output_dir) / "metrics" / f"{process}.jsonl")


def read_records(path: Path) -> list[dict]:
    """The records of one metrics file; a half-written last line (its process killed mid-write)
    is left out, any other line that is not JSON is an error."""
    lines = path.read_text().splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            if number == len(lines):
                break
            raise MetricsError(f"{path}:{number}: not a JSON record ({e.msg})") from None
    return records
