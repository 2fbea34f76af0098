"""Fixed-bucket histograms: what rlkube's metrics standard says about distributions.

Every distribution rlkube reports (rollout latency, tool-call latency, the policy lag of trained
tokens, weight-update latency) is a `Histogram` with the buckets `BOUNDS` names for it, so the
same name means the same buckets in every process and on every pod kind. In the JSONL metrics
a histogram `name` is the keys

    <name>/count   <name>/sum   <name>/le_<bound> (cumulative, one per bound, Prometheus' `le`)

(`counts()`, what rollouts carry and batches add up) plus, for reading, `<name>/mean`,
`<name>/p50`, `<name>/p99` and `<name>/max` (`summary()`; quantiles at bucket resolution: the
bound of the first bucket that holds them). Prometheus gets it as a real histogram
(`rlkube.metrics.PrometheusMetrics`).
"""

import math
from collections.abc import Iterable, Mapping

BOUNDS: dict[str, tuple[float, ...]] = {
    "rollout/latency_s": (0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128),
    "tool/latency_s": (0.05, 0.1, 0.2, 0.5, 1, 2, 4, 8, 16),
    "off_policy/token_lag": (0, 1, 2, 3, 4, 6, 8, 12, 16),
    "weights/update_latency_s": (0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32),
}
"""Each histogram's bucket upper bounds (an implicit last bucket holds the rest)."""
SUFFIXES = ("count", "sum", "mean", "p50", "p99", "max")


def bound_key(name: str, bound: float) -> str:
    return f"{name}/le_{bound:g}"


class Histogram:
    def __init__(self, name: str, values: Iterable[float] = ()):
        if name not in BOUNDS:
            raise KeyError(f"no histogram {name!r}: rlkube.histogram.BOUNDS names {sorted(BOUNDS)}")
        self.name, self.bounds = name, BOUNDS[name]
        self.buckets = [0] * (len(self.bounds) + 1)
        self.count, self.sum, self.max = 0, 0.0, -math.inf
        for value in values:
            self.add(value)

    def add(self, value: float, times: int = 1) -> None:
        index = next((i for i, bound in enumerate(self.bounds) if value <= bound), len(self.bounds))
        self.buckets[index] += times
        self.count += times
        self.sum += value * times
        self.max = max(self.max, value)

    def add_counts(self, metrics: Mapping[str, float]) -> None:
        """Add a histogram of the same name given as its `counts()` (a rollout's metrics)."""
        if not metrics.get(f"{self.name}/count"):
            return
        below = 0.0
        for i, bound in enumerate(self.bounds):
            cumulative = metrics.get(bound_key(self.name, bound), below)
            self.buckets[i] += int(cumulative - below)
            below = cumulative
        self.buckets[-1] += int(metrics[f"{self.name}/count"] - below)
        self.count += int(metrics[f"{self.name}/count"])
        self.sum += metrics.get(f"{self.name}/sum", 0.0)
        self.max = max(self.max, metrics.get(f"{self.name}/max", -math.inf))

    def cumulative(self) -> list[int]:
        out, total = [], 0
        for n in self.buckets[:-1]:
            total += n
            out.append(total)
        return out

    def quantile(self, q: float) -> float:
        """The bound of the first bucket holding the `q` quantile (the max past the last bound)."""
        rank = q * self.count
        for bound, cumulative in zip(self.bounds, self.cumulative()):
            if cumulative >= rank:
                return min(float(bound), self.max)
        return self.max

    def counts(self) -> dict[str, float]:
        """The mergeable form: count, sum, max and the cumulative bucket counts."""
        if not self.count:
            return {f"{self.name}/count": 0.0}
        out = {f"{self.name}/count": float(self.count), f"{self.name}/sum": self.sum, f"{self.name}/max": self.max}
        out.update({bound_key(self.name, b): float(c) for b, c in zip(self.bounds, self.cumulative())})
        return out

    def summary(self) -> dict[str, float]:
        """`counts()` plus mean, p50 and p99 (nothing but the count when empty)."""
        out = self.counts()
        if self.count:
            out |= {f"{self.name}/mean": self.sum / self.count, f"{self.name}/p50": self.quantile(0.5),
                    f"{self.name}/p99": self.quantile(0.99)}
        return out


def merged(name: str, parts: Iterable[Mapping[str, float]]) -> Histogram:
    """The histogram `name` over many `counts()` (each rollout's)."""
    histogram = Histogram(name)
    for part in parts:
        histogram.add_counts(part)
    return histogram
