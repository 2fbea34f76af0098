"""The orchestrator's HTTP endpoints: `/status` (JSON for the operator), `/healthz`, and
Prometheus `/metrics`.

`/status` is a fixed contract the operator reads:
`{"phase": "starting|running|finished|failed", "step": int, "max_steps": int,
"reward": float|null, "policy_step": int, "off_policy_lag": int, "last_checkpoint_step": int|null}`:
`step` is the newest step the trainer finished (reported), `policy_step` the newest policy every
inference replica has loaded, `reward` the mean reward of the newest batch, `off_policy_lag` the
largest lag in it.
"""

import logging
import re
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

logger = logging.getLogger(__name__)

STATUS_KEYS = ("phase", "step", "max_steps", "reward", "policy_step", "off_policy_lag", "last_checkpoint_step")


class PrometheusMetrics:
    """Every logged metric as a gauge `rlkube_orchestrator_<name>` (`/` and other symbols
    become `_`), plus the status numbers."""

    def __init__(self):
        self.registry = CollectorRegistry()
        self.gauges: dict[str, Gauge] = {}

    def _gauge(self, key: str) -> Gauge:
        name = "rlkube_orchestrator_" + re.sub(r"[^a-zA-Z0-9_]", "_", key).strip("_")
        if name not in self.gauges:
            self.gauges[name] = Gauge(name, f"orchestrator metric {key}", registry=self.registry)
        return self.gauges[name]

    def update(self, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self._gauge(key).set(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def make_app(status: Callable[[], dict], prometheus: PrometheusMetrics) -> web.Application:
    async def get_status(request: web.Request) -> web.Response:
        s = status()
        return web.json_response({k: s[k] for k in STATUS_KEYS})

    async def healthz(request: web.Request) -> web.Response:
        phase = status()["phase"]
        return web.json_response({"ok": phase != "failed", "phase": phase}, status=503 if phase == "failed" else 200)

    async def metrics(request: web.Request) -> web.Response:
        s = status()
        prometheus.update({f"status/{k}": v for k, v in s.items() if k != "phase" and v is not None})
        return web.Response(body=prometheus.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/status", get_status)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    return app


async def start_http(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve `app`; returns the runner (`await runner.cleanup()` stops it) and the bound port."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]
    logger.info("orchestrator HTTP (/status, /healthz, /metrics) on %s:%d", host, bound)
    return runner, bound
