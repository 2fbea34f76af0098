"""The operator running embedded (kopf.operator in the caller's event loop) against the local
cluster's API server (cluster.ApiServer), and a fake orchestrator GET /status: one place for
the tests' `cluster` fixture and benchmarks/operator_api.py."""

import asyncio
import concurrent.futures
import contextlib
import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import kopf
from aiohttp import web
from rlkube_operator.guardrails import Guardrails
from rlkube_operator.kube import Kube, api_client
from rlkube_operator.main import build_registry
from rlkube_operator.reconcile import Reconciler, Settings

from tests.fixtures.inference import free_port
from tests.operator.cluster import AGENT, NS, ApiServer, Cluster

TOKEN_KEY = b"the operator's key for the runs' tokens, in tests"
"""The operators' `--token-key-file` key (`runtoken`): the runs' tokens are derived from it."""
READS = ("get", "list", "watch")
WRITES = ("create", "patch", "delete")
VERBS = {"FETCH": "get", "LIST": "list", "WATCH": "watch", "CREATE": "create", "UPDATE": "patch", "DELETE": "delete"}


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


@contextlib.asynccontextmanager
async def serve_status() -> AsyncIterator[OrchestratorStatus]:
    """A local GET /status; its `.url` still shows what the operator fills in: {service}, {port},
    {namespace}."""
    status = OrchestratorStatus()
    app = web.Application()
    app.router.add_get("/status", status.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    status.url = f"http://127.0.0.1:{port}/status?service={{service}}.{{namespace}}&port={{port}}"
    try:
        yield status
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def api_server() -> AsyncIterator[ApiServer]:
    """The API server on a local port (what pytest's `kmock` fixture gives tests)."""
    import kmock

    async with ApiServer() as server, kmock.Server(server):
        yield server


PERMISSIVE = Guardrails(**{field: ["*"] for field in (
    "allowed_image_registries", "allowed_service_accounts", "allowed_priority_classes", "allowed_schedulers",
    "allowed_queue_priority_classes", "allowed_secrets", "allowed_claims", "allowed_config_maps",
    "allowed_tolerations", "allowed_node_labels", "allowed_annotations", "allowed_label_prefixes",
    "allowed_extended_resources")})
"""The guardrails of the operator under test unless a test sets its own: any image, service
account, priority, scheduler, named Secret, claim or ConfigMap, toleration, node label,
annotation and label (the runs here ask for them); root and the rest stay refused
(test_guardrails and tests/security check the defaults)."""


@contextlib.asynccontextmanager
async def running_operator(server: ApiServer, status_url: str, *, settings: dict | None = None,
                           namespaces: tuple[str, ...] = (NS,), **registry_options) -> AsyncIterator[Cluster]:
    """The operator watching `namespaces` on `server`, reading progress from `status_url`; yields the
    caller's handle on the cluster. `registry_options` go to `build_registry` (`interval`, …).

    The operator runs in a thread with an event loop of its own, as in its own process: on
    stopping, kopf waits 5 s for every task of its loop begun after it started, and in the test's
    loop those include the API server's handlers of idle keep-alive connections."""
    url = str(server.url).rstrip("/")

    def login(**_):
        return kopf.ConnectionInfo(server=url, insecure=True, default_namespace=NS)

    kopf_settings = kopf.OperatorSettings()
    kopf_settings.watching.reconnect_backoff = 0.2
    # The emulator sends no BOOKMARKs: kopf's idle-watch reconnect (70 s) lists every object again
    # and would then wake every run, which a real API server (bookmarks keep a quiet watch's
    # resourceVersion fresh) never does.
    kopf_settings.watching.inactivity_timeout = 3600
    liveness = f"http://127.0.0.1:{free_port()}/healthz"
    ready = threading.Event()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def operate():
        reconciler = Reconciler(Kube(api_client(url)), Settings(status_url_template=status_url,
                                                                  **({"token_key": TOKEN_KEY, "guardrails": PERMISSIVE}
                                                                     | (settings or {}))))
        registry = build_registry(reconciler, login=login, **registry_options)
        await kopf.operator(registry=registry, settings=kopf_settings, standalone=True, namespaces=list(namespaces),
                            stop_flag=stop, ready_flag=ready, liveness_endpoint=liveness)

    operator = concurrent.futures.Future()
    thread = threading.Thread(target=lambda: _run_into(loop, operate(), operator), name="operator", daemon=True)
    thread.start()
    await asyncio.to_thread(ready.wait, 20)
    if not ready.is_set():
        raise TimeoutError("the embedded operator did not start in 20 s")

    async def stop_operator():
        if not operator.done():
            loop.call_soon_threadsafe(stop.set)
        # kopf ends the operator once the stop flag is seen (after the passes in flight: slow with
        # hundreds of runs on a busy machine).
        await asyncio.wait_for(asyncio.wrap_future(operator), 120)

    async with Cluster(server) as cluster:
        cluster.liveness_url = liveness
        cluster.stop_operator = stop_operator
        try:
            yield cluster
        finally:
            await stop_operator()
            thread.join(10)


def _run_into(loop: asyncio.AbstractEventLoop, main, result: concurrent.futures.Future) -> None:
    """Run `main` on `loop` in this thread and settle `result` with how it ended."""
    try:
        result.set_result(loop.run_until_complete(main))
    except asyncio.CancelledError:
        result.set_result(None)  # kopf's way of ending on the stop flag
    except Exception as exc:  # noqa: BLE001 - the test's side raises it
        result.set_exception(exc)
    finally:
        loop.close()


def operator_calls(server: ApiServer, since: int = 0) -> Iterator[tuple[Any, str]]:
    """The operator's API requests served since request number `since` (kmock's), each with the
    resource path it addressed, e.g. "rlruns/status". Discovery and the test's own requests
    (its `Cluster`'s) are left out."""
    for request in list(server)[since:]:
        if request.resource is None or request.resource.plural is None:
            continue  # discovery
        if request.headers.get("User-Agent") == AGENT:
            continue
        yield request, request.resource.plural + (f"/{request.subresource}" if request.subresource else "")


def operator_requests(server: ApiServer, since: int = 0) -> Counter:
    """How many `operator_calls` by (verb, resource path), e.g. ("patch", "rlruns/status")."""
    return Counter((VERBS[request.action.value], resource) for request, resource in operator_calls(server, since))


def verbs(counts: Counter, wanted) -> int:
    """How many of the `operator_requests` counted have one of the `wanted` verbs."""
    return sum(n for (verb, _), n in counts.items() if verb in wanted)


async def quiet(cluster: Cluster, seconds: float = 1.0, tries: int = 60) -> None:
    """Wait until the operator made no request (watches aside) for `seconds`: the passes woken
    by the last changes are over."""
    for _ in range(tries):
        mark = served(cluster.server)
        await asyncio.sleep(seconds)
        if verbs(operator_requests(cluster.server, mark), ("get", "list", *WRITES)) == 0:
            return
    raise AssertionError("the operator never went quiet")


def served(server: ApiServer) -> int:
    """How many requests the emulator has served: a mark for `operator_requests(since=…)`."""
    return len(list(server))
