"""The orchestrator's read-only HTTP port (`/status`, `/healthz`, `/metrics`), over real
sockets: it takes no token, so what a client may hold there is bounded: connections over the
limit are closed as they are made, idle ones (and a request trickled slower than the timeout)
once the timeout passes, and a request is answered once the bound is free again."""

import asyncio
import time
import urllib.request

from rlkube.metrics import PrometheusMetrics
from rlkube.orchestrator.status import make_app, start_http

from tests.test_readonly_http import closed_by_server, idle_sockets, still_open

STATUS = {"phase": "running", "step": 4, "max_steps": 10, "reward": 0.5, "eval_reward": None, "policy_step": 4,
          "off_policy_lag": 0, "last_checkpoint_step": None}


def test_connections_over_the_bound_are_closed_and_idle_ones_after_the_timeout():
    async def scenario():
        app = make_app(lambda: STATUS, PrometheusMetrics("orchestrator"))
        runner, port = await start_http(app, "127.0.0.1", 0, max_connections=8, idle_timeout=2.0)
        url = f"http://127.0.0.1:{port}/status"
        try:
            def client():
                sockets = idle_sockets(port, 8)
                over = idle_sockets(port, 3)
                assert all(closed_by_server(s, 1.0) for s in over), "a connection over the bound was kept"
                assert all(still_open(s) for s in sockets), "the bound closed connections under it"
                started = time.monotonic()
                assert all(closed_by_server(s, 4.0) for s in sockets), "an idle connection was kept"
                assert time.monotonic() - started < 3.5
                with urllib.request.urlopen(url, timeout=10) as response:  # the bound is free again
                    assert b'"step": 4' in response.read()
                slow = idle_sockets(port, 1)[0]
                slow.sendall(b"G")
                assert closed_by_server(slow, 4.0), "a request trickled slower than the timeout was kept"

            await asyncio.to_thread(client)
        finally:
            await runner.cleanup()

    asyncio.run(scenario())
