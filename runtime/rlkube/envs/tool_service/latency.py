"""The tool service's latency: a seeded lognormal with a given median and p99/p50.

A lognormal `exp(N(ln p50, sigma))` has median `p50` and 99th percentile `p50 * exp(z99 *
sigma)`, so a tail ratio `r = p99/p50` sets `sigma = ln(r) / z99` (`r = 1`: every call takes
exactly `p50`). The default ratio, 20, is the order agentic tools show (a sandbox call of
200 ms that sometimes takes 4 s). Draws come from one `random.Random(seed)`: the same seed
gives the same sequence of latencies, in the order calls arrive.
"""

import math
import random
from statistics import NormalDist
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Z99 = NormalDist().inv_cdf(0.99)
Outcome = Literal["ok", "hang", "error"]


class ToolServiceConfig(BaseModel):
    """`rlkube tool-service` flags: where it listens and how its calls behave."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    host: str = "127.0.0.1"
    """Address to listen on (0.0.0.0 in a pod)."""
    port: int = Field(default=8790, ge=0, le=65535)
    """Port to listen on (0: any free one, printed at start)."""
    p50_s: float = Field(default=0.2, ge=0)
    """Median latency of a call, in seconds."""
    tail_ratio: float = Field(default=20.0, ge=1)
    """p99/p50 of the latency: 1 is a constant latency, 20 (the default) a long tail."""
    timeout_rate: float = Field(default=0.0, ge=0, le=1)
    """Share of calls that hang for `hang_s` before answering (the client's per-call timeout
    ends them first: what a tool that never answers looks like)."""
    error_rate: float = Field(default=0.0, ge=0, le=1)
    """Share of calls answered HTTP 503 after their latency (a tool that fails)."""
    hang_s: float = Field(default=600.0, gt=0)
    """How long a hanging call waits."""
    seed: int = 0
    """Seed of the latencies and outcomes."""


class LatencyModel:
    """The latency and outcome of each call, drawn in call order from one seeded generator."""

    def __init__(self, config: ToolServiceConfig):
        if config.timeout_rate + config.error_rate > 1:
            raise ValueError(f"timeout_rate ({config.timeout_rate}) + error_rate ({config.error_rate}) must be at most 1")
        self.config = config
        self.sigma = math.log(config.tail_ratio) / Z99
        self.rng = random.Random(config.seed)

    def draw(self) -> tuple[float, Outcome]:
        """(seconds to wait, outcome) of the next call."""
        c = self.config
        latency = c.p50_s * math.exp(self.sigma * self.rng.gauss(0.0, 1.0))
        u = self.rng.random()
        if u < c.timeout_rate:
            return c.hang_s, "hang"
        if u < c.timeout_rate + c.error_rate:
            return latency, "error"
        return latency, "ok"

    def quantile(self, q: float) -> float:
        """The `q` quantile of the latency of an answered call."""
        return self.config.p50_s * math.exp(self.sigma * NormalDist().inv_cdf(q))
