"""The orchestrator's HTTP endpoints: `/status` (JSON for the operator), `/healthz`, and
Prometheus `/metrics`.

`/status` is a fixed contract the operator reads:
`{"phase": "starting|running|finished|failed", "step": int, "max_steps": int,
"reward": float|null, "eval_reward": float|null, "policy_step": int, "off_policy_lag": int,
"last_checkpoint_step": int|null}`: `step` is the newest step the trainer finished (reported),
`policy_step` the newest policy every inference replica has loaded, `reward` the mean reward of
the newest batch, `eval_reward` that of the newest periodic eval (null without `[eval]`: the
mean of its environments' avg@k), `off_policy_lag` the largest lag in the batch.
"""

import logging
from collections.abc import Callable

from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from rlkube.metrics import PrometheusMetrics

logger = logging.getLogger(__name__)

MAX_CONNECTIONS = 64
IDLE_TIMEOUT_S = 5.0
"""Seconds from a connection's accept, and from each answer, to the end of its next request head:
the operator and Prometheus send theirs at once. A deadline on the whole head, not on each read:
aiohttp's keep-alive timer (>= 3.14.5) runs from those instants and data does not reset it, so a
client trickling a byte a second is closed when it passes. aiohttp's own default is 3630 s."""

STATUS_KEYS = ("phase", "step", "max_steps", "reward", "eval_reward", "policy_step", "off_policy_lag",
               "last_checkpoint_step")


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


async def start_http(app: web.Application, host: str, port: int, *, max_connections: int = MAX_CONNECTIONS,
                     idle_timeout: float = IDLE_TIMEOUT_S) -> tuple[web.AppRunner, int]:
    """Serve `app`; returns the runner (`await runner.cleanup()` stops it) and the bound port.

    The port takes no token (it is read-only; the run's NetworkPolicy admits the run's pods, the
    operator and the scraper's namespace), so it bounds what a client may hold: at most
    `max_connections` open (one more is closed as it is made) and none without a complete
    request head past `idle_timeout` (`IDLE_TIMEOUT_S`)."""
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=idle_timeout)
    await runner.setup()
    _cap_connections(runner.server, max_connections)
    site = web.TCPSite(runner, host, port, backlog=max_connections)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]
    logger.info("orchestrator HTTP (/status, /healthz, /metrics) on %s:%d", host, bound)
    return runner, bound


def _cap_connections(server: web.Server, limit: int) -> None:
    """Close each connection made beyond `limit` open ones: aiohttp has no bound of its own."""
    made = server.connection_made

    def connection_made(handler, transport) -> None:
        made(handler, transport)
        if len(server.connections) > limit:
            transport.close()

    server.connection_made = connection_made
