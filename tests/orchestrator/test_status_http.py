"""The orchestrator's read-only HTTP port (`/status`, `/healthz`, `/metrics`), over real
sockets: it takes no token, so what a client may hold there is bounded: connections over the
limit are closed as they are made, idle ones (and a request trickled slower than the timeout)
once the timeout passes, and a request is answered once the bound is free again."""

import asyncio

from rlkube.metrics import PrometheusMetrics
from rlkube.orchestrator.status import make_app, start_http

from tests.test_readonly_http import assert_bounded

STATUS = {"phase": "running", "step": 4, "max_steps": 10, "reward": 0.5, "eval_reward": None, "policy_step": 4,
          "off_policy_lag": 0, "last_checkpoint_step": None}


def test_connections_over_the_bound_are_closed_and_idle_ones_after_the_timeout():
    async def scenario():
        app = make_app(lambda: STATUS, PrometheusMetrics("orchestrator"))
        runner, port = await start_http(app, "127.0.0.1", 0, max_connections=8, idle_timeout=2.0)
        try:
            await asyncio.to_thread(assert_bounded, port, "/status", b'"step": 4')
        finally:
            await runner.cleanup()

    asyncio.run(scenario())
