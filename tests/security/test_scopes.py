"""Each server of a run accepts only the scopes its routes need (`rlkube.auth`, `rlkube.scopes`).

The exploits: a component that holds one of the run's credentials (an env worker's generate
credential, or a judge that is sent one) uses it where it grants more than generation: the
policy's or the judge's vLLM admin routes (load weights from an address of its choosing),
the trainer's weight stream, the orchestrator's batches. Each case starts the real server
(rlkube's ASGI middleware served by uvicorn, as vLLM serves it; the orchestrator's and the
trainer's gRPC servers) with the credentials its component is given, and sends the real
request over the socket."""

import asyncio
import contextlib
import threading
import time

import grpc
import httpx
import pytest
import uvicorn
from rlkube import auth
from rlkube.auth import TOKEN_ENV, RequireToken
from rlkube.orchestrator.clock import PolicyClock
from rlkube.orchestrator.workers import WorkerHub
from rlkube.scopes import (
    ADMIN,
    GENERATE,
    HELD,
    ROLLOUTS,
    SCOPES,
    WEIGHTS,
    WORK,
    component_env,
    scope_env,
    scoped,
)
from rlkube.transport import rlkube_pb2 as pb
from rlkube.transport import rlkube_pb2_grpc as pb_grpc
from rlkube.transport.env_workers import work
from rlkube.transport.server import start_server, stop_server
from rlkube.transport.weights_grpc import WeightsServicer, serve_weights

from tests.fixtures.inference import free_port
from tests.transport.test_rollouts_grpc import FakeSource, ServerThread

TOKEN = "the-runs-token-for-scopes"
CREDENTIAL = {scope: scoped(TOKEN, scope) for scope in SCOPES}


def as_component(monkeypatch, component: str) -> None:
    """This process's environment as the operator and `rlkube rl` make `component`'s."""
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    for scope in SCOPES:
        monkeypatch.delenv(scope_env(scope), raising=False)
    for name, value in component_env(TOKEN, component).items():
        monkeypatch.setenv(name, value)


class Recorder:
    """An ASGI app standing for vLLM's routes: answers 200 and records each path it is reached on."""

    def __init__(self):
        self.reached: list[str] = []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        self.reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b"{}"})


class Served:
    """`RequireToken(app)` served by uvicorn on a free port, in a thread, as `rlkube inference`
    serves vLLM's app behind it."""

    def __init__(self, app):
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(RequireToken(app), host="127.0.0.1", port=self.port,
                                                    log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)


def statuses(url: str, calls: list[tuple[str, str, str | None]]) -> list[int]:
    with httpx.Client(timeout=10) as http:
        return [http.request(method, url + route, headers={"Authorization": f"Bearer {CREDENTIAL[scope]}"}
                             if scope else {}).status_code for method, route, scope in calls]


ADMIN_ROUTES = [("POST", "/collective_rpc"), ("POST", "/rlkube/load_lora_adapter"), ("POST", "/v1/load_lora_adapter"),
                ("POST", "/pause"), ("POST", "/update_weights"), ("POST", "/init_weight_transfer_engine")]


@pytest.mark.parametrize("component", ["judge", "teacher"])
def test_the_judge_and_the_teacher_accept_generate_alone(monkeypatch, component):
    """No credential of the run, the admin one included, reaches a served model's admin
    routes: the judge's vLLM could otherwise be made to load weights from anywhere."""
    as_component(monkeypatch, component)
    app = Recorder()
    with Served(app) as url:
        refused = statuses(url, [(m, r, s) for m, r in ADMIN_ROUTES for s in SCOPES])
        generated = statuses(url, [("POST", "/v1/chat/completions", GENERATE), ("GET", "/v1/models", GENERATE),
                                   ("POST", "/v1/chat/completions", ADMIN), ("POST", "/v1/completions", None)])
    assert set(refused) == {401}, refused
    assert generated == [200, 200, 401, 401]
    assert app.reached == ["/v1/chat/completions", "/v1/models"]


def test_the_policys_admin_routes_refuse_the_generate_credential(monkeypatch):
    """Env workers hold generate: with it they generate, and can neither pause the policy nor
    load weights into it. The trainer's weights credential drives a policy update (NCCL) and
    nothing else."""
    as_component(monkeypatch, "inference")
    app = Recorder()
    with Served(app) as url:
        by_generate = statuses(url, [(m, r, GENERATE) for m, r in ADMIN_ROUTES])
        by_rollouts = statuses(url, [(m, r, ROLLOUTS) for m, r in ADMIN_ROUTES])
        by_weights = statuses(url, [("POST", "/collective_rpc", WEIGHTS), ("POST", "/rlkube/load_lora_adapter", WEIGHTS),
                                    ("POST", "/pause", WEIGHTS), ("POST", "/update_weights", WEIGHTS)])
        allowed = statuses(url, [("POST", "/v1/chat/completions", GENERATE), ("POST", "/inference/v1/generate", GENERATE),
                                 ("POST", "/collective_rpc", ADMIN), ("POST", "/v1/chat/completions", ADMIN)])
    assert set(by_generate) == set(by_rollouts) == {401}, (by_generate, by_rollouts)
    assert by_weights == [401, 401, 200, 200]
    assert allowed == [200] * 4
    assert app.reached == ["/pause", "/update_weights", "/v1/chat/completions", "/inference/v1/generate",
                           "/collective_rpc", "/v1/chat/completions"]


def bearer(scope: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {CREDENTIAL[scope]}"),)


def test_the_orchestrators_rollouts_refuse_every_scope_but_rollouts(monkeypatch):
    """The orchestrator holds generate, admin and work too; none opens its batches or its policy reports."""
    as_component(monkeypatch, "orchestrator")
    source, port = FakeSource(), free_port()
    with ServerThread(source, port), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.RolloutsStub(channel)
        for scope in (GENERATE, ADMIN, WEIGHTS, WORK):
            with pytest.raises(grpc.RpcError) as refused:
                stub.ReportPolicy(pb.PolicyReport(step=1, location="grpc://evil:1"), timeout=10, metadata=bearer(scope))
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED and "rollouts" in refused.value.details()
            with pytest.raises(grpc.RpcError) as refused:
                list(stub.GetBatch(pb.GetBatchRequest(step=1, rank=0, world_size=2), timeout=10, metadata=bearer(scope)))
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert source.reports == [] and source.requests == []
        assert stub.ReportPolicy(pb.PolicyReport(step=1, location="/ok"), timeout=10,
                                 metadata=bearer(ROLLOUTS)).accepted_step == 1


def test_an_env_workers_credentials_reach_its_work_and_not_the_trainers_batches(monkeypatch):
    """The exploit: an environment's program in an env-worker pod (or the worker itself) calls
    the orchestrator's `Rollouts` with what the pod holds: `ReportPolicy` naming weights of its
    choosing, which inference would load, or `GetBatch`, taking the trainer's batches. The real
    orchestrator server (both services, the orchestrator's credentials) refuses every credential
    an env worker is given on `Rollouts`, while the real worker client's session on `EnvWorkers`
    joins with them."""
    as_component(monkeypatch, "orchestrator")
    source, hub = FakeSource(), WorkerHub(PolicyClock(async_level=1), group_size=2, envs=["fake"], timeout_s=60)

    async def scenario():
        server = await start_server(source, "127.0.0.1", 0, workers=hub)
        as_component(monkeypatch, "env-worker")
        address = f"127.0.0.1:{server.port}"
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                stub = pb_grpc.RolloutsStub(channel)
                for scope in HELD["env-worker"]:
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await stub.ReportPolicy(pb.PolicyReport(step=1, location="grpc://evil:1"), timeout=10,
                                                metadata=auth.grpc_metadata(scope))
                    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, scope
                    assert "rollouts" in refused.value.details()
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        async for _ in stub.GetBatch(pb.GetBatchRequest(step=1, rank=0, world_size=2), timeout=10,
                                                     metadata=auth.grpc_metadata(scope)):
                            pass
                    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, scope
            hello = pb.WorkerHello(worker_id="w", max_groups=1, envs=["fake"])
            session = asyncio.ensure_future(work(address, hello, lambda task: asyncio.sleep(0, [])))
            deadline = time.monotonic() + 10
            while not hub.sessions:
                assert not session.done(), session.exception()
                assert time.monotonic() < deadline, "the env worker never joined"
                await asyncio.sleep(0.02)
            session.cancel()
        finally:
            await stop_server(server, grace_s=0)

    asyncio.run(scenario())
    assert source.reports == [] and source.requests == []
    assert WORK in HELD["env-worker"] and ROLLOUTS not in HELD["env-worker"]


@contextlib.contextmanager
def trainer_weight_server(monkeypatch):
    """The trainer's weight server over a socket, holding step 3; yields its `Fetch`."""
    as_component(monkeypatch, "trainer")
    servicer = WeightsServicer(keep_last=1)
    servicer.add(3, {"model.safetensors": b"w" * 10, "COMPLETE": b"{}"})
    port = free_port()
    server = serve_weights(servicer, f"127.0.0.1:{port}")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield pb_grpc.WeightsStub(channel).Fetch
    finally:
        server.stop(0)


def test_the_weight_server_refuses_every_scope_but_weights(monkeypatch):
    with trainer_weight_server(monkeypatch) as fetch:
        for scope in (GENERATE, ADMIN, ROLLOUTS, WORK):
            with pytest.raises(grpc.RpcError) as refused:
                list(fetch(pb.WeightsRequest(step=3), timeout=10, metadata=bearer(scope)))
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED and "weights" in refused.value.details()
        assert list(fetch(pb.WeightsRequest(step=3), timeout=10, metadata=bearer(WEIGHTS)))


def test_each_component_is_given_only_its_scopes():
    """Who holds what (`HELD`): admin is the orchestrator's and the policy server's alone, and
    neither the judge nor the teacher nor an env worker holds anything beyond generate and,
    for env workers, work (never the trainer's rollouts)."""
    holders = {scope: {c for c, held in HELD.items() if scope in held} for scope in SCOPES}
    assert holders[ADMIN] == {"orchestrator", "inference"}
    assert holders[WEIGHTS] == {"trainer", "inference"}
    assert holders[ROLLOUTS] == {"orchestrator", "trainer"}
    assert holders[WORK] == {"orchestrator", "env-worker"}
    assert HELD["judge"] == HELD["teacher"] == (GENERATE,)
    assert len(set(CREDENTIAL.values()) | {TOKEN}) == len(SCOPES) + 1, "no credential is the token or another's"

