"""Fixtures: the kmock API server, a fake orchestrator /status endpoint, the operator running
embedded (kopf.operator in this event loop) against them."""

import asyncio
import contextlib
import socket

import kopf
import pytest
from aiohttp import web
from rlkube_operator.kube import Kube, api_client
from rlkube_operator.main import build_registry
from rlkube_operator.reconcile import Reconciler, Settings

from tests.operator.cluster import NS, ApiServer, Cluster, declare_resources


@pytest.fixture
def kmock_options():
    return {"cls": ApiServer}


class OrchestratorStatus:
    """What GET /status answers (the orchestrator's, or an SFT trainer's); tests set `.body`
    (or `.code`). `.asked` records the {service} and {port} the operator filled in."""

    def __init__(self):
        self.body = {"phase": "starting", "step": 0, "max_steps": 0, "reward": None,
                     "policy_step": 0, "off_policy_lag": 0, "last_checkpoint_step": None}
        self.code = 200
        self.delay = 0.0
        self.url = ""
        self.requests = 0
        self.answered = 0
        self.asked: list[tuple[str, str]] = []

    async def handle(self, request):
        self.requests += 1
        self.asked.append((request.query["service"], request.query["port"]))
        await asyncio.sleep(self.delay)
        self.answered += 1
        return web.json_response(self.body, status=self.code)


@pytest.fixture
async def orchestrator_status():
    status = OrchestratorStatus()
    app = web.Application()
    app.router.add_get("/status", status.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    # A local URL that still shows what the operator asks for: {service}, {port}, {namespace}.
    status.url = f"http://127.0.0.1:{port}/status?service={{service}}.{{namespace}}&port={{port}}"
    yield status
    await runner.cleanup()


@pytest.fixture
def operator_settings() -> dict:
    """Extra `Settings` of the operator under test; a test parametrizes it to change them."""
    return {}


@pytest.fixture
async def cluster(kmock, orchestrator_status, operator_settings):
    """The operator running against kmock; yields the test's handle on the cluster."""
    declare_resources(kmock)
    url = str(kmock.url).rstrip("/")

    def login(**_):
        return kopf.ConnectionInfo(server=url, insecure=True, default_namespace=NS)

    settings = Settings(status_url_template=orchestrator_status.url, **operator_settings)
    reconciler = Reconciler(Kube(api_client(url)), settings)
    registry = build_registry(reconciler, interval=0.3, login=login)
    settings = kopf.OperatorSettings()
    settings.watching.reconnect_backoff = 0.2
    stop, ready = asyncio.Event(), asyncio.Event()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        liveness = f"http://127.0.0.1:{s.getsockname()[1]}/healthz"
    task = asyncio.create_task(
        kopf.operator(registry=registry, settings=settings, standalone=True, namespaces=[NS],
                      stop_flag=stop, ready_flag=ready, liveness_endpoint=liveness)
    )
    await asyncio.wait_for(ready.wait(), 20)

    async def stop_operator():
        stop.set()
        # kopf ends the operator task by cancelling it once the stop flag is seen.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 20)

    cluster = Cluster(kmock)
    cluster.liveness_url = liveness
    cluster.stop_operator = stop_operator
    yield cluster
    await stop_operator()
