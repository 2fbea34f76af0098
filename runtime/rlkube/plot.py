"""PNG curves of a run from the metrics files its processes wrote (`rlkube plot RUN_DIR`).

Reads `<RUN_DIR>/metrics/<process>.jsonl` (the lines `rlkube.metrics.MetricsSink` writes) and
draws one PNG per panel (`reward.png`, `eval.png`, ...) plus `curves.png` with every panel
side by side. A panel whose metrics the run never logged is skipped with a note: an SFT run has
no reward, a run without `[eval]` no held-out curve.

Records may arrive out of step order (the orchestrator runs ahead) and a resumed run logs some
steps again, so each curve keeps the last value logged at each step, sorted by step. A process
killed mid-write can leave half a last line; that line is ignored, any other unreadable line is
an error naming the file and line.

Only matplotlib's object API (`Figure`, Agg canvas) is used: no pyplot, no display needed.
"""

import math
import re
from dataclasses import dataclass
from pathlib import Path

from rlkube.metrics import MetricsError, read_records


@dataclass(frozen=True)
class Panel:
    """One chart: every metric of `process` whose name matches `pattern` is one curve."""

    name: str
    title: str
    process: str
    pattern: str
    stacked: bool = False

    def curves(self, runs: dict[str, list[dict]]) -> dict[str, tuple[list[int], list[float]]]:
        records = runs.get(self.process, [])
        keys = sorted({k for r in records for k in r if re.fullmatch(self.pattern, k)})
        return {key: series(records, key) for key in keys}


PANELS = (
    Panel("reward", "training reward (batch mean)", "orchestrator", r"reward/all/mean"),
    Panel("eval", "held-out eval", "orchestrator", r"eval/.+/avg@\d+"),
    Panel("kl", "KL per token (mismatch: trainer vs inference)", "trainer", r"(mismatch|teacher)_kl/mean"),
    Panel("entropy", "entropy (per token)", "trainer", r"entropy/mean"),
    Panel("throughput", "trainer throughput", "trainer", r"perf/tokens_per_s"),
    # time/step is their sum; time/publish_background overlaps the next step.
    Panel("time", "time split of a trainer step (s)", "trainer",
          r"time/(?!step$|publish_background$).+", stacked=True),
    Panel("sft_loss", "SFT loss", "sft", r"loss"),
    # Agentic runs (docs/agentic.md): histograms as their p50/p99/max per step.
    Panel("rollout_latency", "rollout latency (s)", "orchestrator", r"rollout/latency_s/(p50|p99|max)"),
    Panel("tool_latency", "tool-call latency (s)", "orchestrator", r"tool/latency_s/(p50|p99|max)"),
    Panel("tool_calls", "tool calls per batch", "orchestrator", r"tool/(calls|timeouts|errors|retries)"),
    Panel("policy_lag", "policy lag of trained tokens (versions)", "orchestrator", r"off_policy/token_lag/(mean|p99|max)"),
    Panel("rollouts", "rollouts in flight, dropped, re-issued", "orchestrator",
          r"rollouts/(in_flight|reissued)|off_policy/dropped_rollouts"),
    Panel("weight_update", "weight-update latency (s)", "orchestrator", r"time/update_weights"),
)


def read_run(run_dir: Path) -> dict[str, list[dict]]:
    """{process: records} for every `metrics/<process>.jsonl` under `run_dir` (or in it)."""
    if not run_dir.is_dir():
        raise MetricsError(f"{run_dir}: no such directory")
    files = sorted((run_dir / "metrics").glob("*.jsonl")) or sorted(run_dir.glob("*.jsonl"))
    if not files:
        raise MetricsError(f"{run_dir}: no metrics files ({run_dir / 'metrics'}/*.jsonl)")
    return {path.stem: read_records(path) for path in files}


def series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of `key`: the last value logged at each step, by step."""
    by_step = {}
    for record in records:
        value = record.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and "step" in record:
            by_step[record["step"]] = float(value)
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def plot_run(run_dir: Path, out_dir: Path) -> tuple[list[Path], list[str]]:
    """Write the PNGs of every panel the run has metrics for; returns (paths, notes on skipped panels)."""
    runs = read_run(run_dir)
    drawn, notes = [], []
    for panel in PANELS:
        curves = panel.curves(runs)
        if curves:
            drawn.append((panel, curves))
        elif panel.process not in runs:
            notes.append(f"{panel.name}: skipped, no metrics/{panel.process}.jsonl")
        else:
            notes.append(f"{panel.name}: skipped, no '{panel.pattern}' in metrics/{panel.process}.jsonl")
    if not drawn:
        raise MetricsError(f"{run_dir}: none of the plotted metrics in {', '.join(sorted(runs))}")
    from matplotlib.figure import Figure

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for panel, curves in drawn:
        figure = Figure(figsize=(6, 4), layout="constrained")
        draw(figure.add_subplot(), panel, curves)
        paths.append(_save(figure, out_dir / f"{panel.name}.png"))
    columns = min(3, len(drawn))
    rows = math.ceil(len(drawn) / columns)
    figure = Figure(figsize=(5 * columns, 3.5 * rows), layout="constrained")
    figure.suptitle(run_dir.resolve().name)
    for index, (panel, curves) in enumerate(drawn, start=1):
        draw(figure.add_subplot(rows, columns, index), panel, curves)
    paths.append(_save(figure, out_dir / "curves.png"))
    return paths, notes


def draw(ax, panel: Panel, curves: dict[str, tuple[list[int], list[float]]]) -> None:
    ax.set_title(panel.title)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    if panel.stacked:
        steps = sorted({s for xs, _ in curves.values() for s in xs})
        stacks = [[dict(zip(*curve)).get(s, 0.0) for s in steps] for curve in curves.values()]
        ax.stackplot(steps, *stacks, labels=[k.removeprefix("time/") for k in curves])
        _cut_outlier(ax, steps, [sum(column) for column in zip(*stacks)])
    else:
        for key, (steps, values) in curves.items():
            if len(steps) < 20:
                ax.plot(steps, values, marker=".", label=key)
                continue
            # Noisy per-step values faint, their rolling mean over a tenth of the run on top.
            (line,) = ax.plot(steps, values, alpha=0.3)
            ax.plot(steps, rolling_mean(values, len(values) // 10), color=line.get_color(), label=key)
    if len(curves) > 1:
        ax.legend(fontsize="small")
    else:
        ax.set_ylabel(next(iter(curves)))


def rolling_mean(values: list[float], window: int) -> list[float]:
    """The mean of each value and the `window - 1` before it (fewer at the start)."""
    sums = [0.0]
    for value in values:
        sums.append(sums[-1] + value)
    return [(sums[i + 1] - sums[max(0, i + 1 - window)]) / min(i + 1, window) for i in range(len(values))]


def _cut_outlier(ax, steps: list[int], totals: list[float]) -> None:
    """Keep a first step that waited minutes (vLLM start-up, compiles) from flattening the rest."""
    typical = sorted(totals)[len(totals) // 2]
    peak = max(totals)
    if typical > 0 and peak > 5 * typical:
        ax.set_ylim(0, 3 * typical)
        at = steps[totals.index(peak)]
        ax.annotate(f"step {at}: {peak:.3g} s (cut)", (at, 3 * typical), xytext=(4, -12),
                    textcoords="offset points", fontsize="small")


def _save(figure, path: Path) -> Path:
    figure.savefig(path, dpi=100)
    return path
