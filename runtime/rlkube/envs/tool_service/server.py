"""The tool service's HTTP app: each call waits its drawn latency, then answers.

    POST /v1/tools/<name>   JSON arguments -> 200 {"content": text} (an answer the model
                            reads, a refusal of bad arguments included), 503 for an injected
                            error, 404 for an unknown tool
    GET  /health            200 {}
    GET  /stats             calls by outcome since the start

    rlkube tool-service --port 8790 --p50-s 0.2 --tail-ratio 20 --seed 0
"""

import asyncio
import logging
from collections import Counter

from aiohttp import web

from rlkube.envs.tool_service.latency import LatencyModel, ToolServiceConfig
from rlkube.envs.tool_service.tools import TOOLS, ToolError

logger = logging.getLogger(__name__)


def build_app(config: ToolServiceConfig) -> web.Application:
    latency = LatencyModel(config)
    outcomes: Counter[str] = Counter()

    async def call(request: web.Request) -> web.Response:
        tool = TOOLS.get(request.match_info["name"])
        if tool is None:
            return web.json_response({"error": f"no tool {request.match_info['name']!r}"}, status=404)
        try:
            arguments = await request.json()
        except ValueError:
            arguments = None
        wait_s, outcome = latency.draw()
        outcomes[outcome] += 1
        await asyncio.sleep(wait_s)
        if outcome == "error":
            return web.json_response({"error": "injected tool error"}, status=503)
        if not isinstance(arguments, dict):
            return web.json_response({"content": "error: arguments must be a JSON object"})
        try:
            return web.json_response({"content": tool(arguments)})
        except ToolError as e:
            return web.json_response({"content": f"error: {e}"})

    app = web.Application()
    app.router.add_post("/v1/tools/{name}", call)
    app.router.add_get("/health", lambda request: web.json_response({}))
    app.router.add_get("/stats", lambda request: web.json_response(dict(outcomes)))
    return app


async def serve(config: ToolServiceConfig, started: asyncio.Event | None = None) -> None:
    """Serve until cancelled; logs (and `started` signals) the bound address."""
    runner = web.AppRunner(build_app(config), access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    host, port = runner.addresses[0][:2]
    logger.info("tool service on http://%s:%d (p50 %gs, p99/p50 %g, timeouts %g, errors %g, seed %d)",
                host, port, config.p50_s, config.tail_ratio, config.timeout_rate, config.error_rate, config.seed)
    print(f"tool service listening on http://{host}:{port}", flush=True)
    if started is not None:
        started.set()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
