"""Every gRPC service of a run refuses a caller without the run's credential of its scope, over
real loopback sockets: the orchestrator's Rollouts and EnvWorkers services (rollouts) and the
trainer's Weights.Fetch (weights)."""

import asyncio
import json

import grpc
import pytest
from rlkube.auth import TOKEN_ENV
from rlkube.orchestrator.clock import PolicyClock
from rlkube.orchestrator.workers import WorkerHub
from rlkube.scopes import ROLLOUTS, WEIGHTS, scoped
from rlkube.transport import rlkube_pb2 as pb
from rlkube.transport import rlkube_pb2_grpc as pb_grpc
from rlkube.transport.client import RolloutClient, RolloutError
from rlkube.transport.env_workers import work
from rlkube.transport.server import start_server, stop_server
from rlkube.transport.weights_grpc import WeightsServicer, fetch_snapshot, serve_weights
from rlkube.transport.weights_snapshot import COMPLETE

from tests.fixtures.inference import free_port
from tests.transport.test_rollouts_grpc import FakeSource, ServerThread

TOKEN = "the-runs-token"
WRONG = (("authorization", "Bearer not-the-runs-token"),)
RIGHT = (("authorization", f"Bearer {scoped(TOKEN, ROLLOUTS)}"),)
RIGHT_WEIGHTS = (("authorization", f"Bearer {scoped(TOKEN, WEIGHTS)}"),)


@pytest.fixture
def token(monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)


def test_rollouts_refuse_calls_without_the_token_and_answer_the_right_one(token, monkeypatch):
    source = FakeSource()
    port = free_port()
    with ServerThread(source, port), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.RolloutsStub(channel)
        for metadata in ((), WRONG):
            with pytest.raises(grpc.RpcError) as refused:
                stub.ReportPolicy(pb.PolicyReport(step=1, location="/evil"), timeout=10, metadata=metadata)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.RpcError) as refused:
                list(stub.GetBatch(pb.GetBatchRequest(step=1, rank=0, world_size=2), timeout=10, metadata=metadata))
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert source.reports == [] and source.requests == [], "a refused call reached the orchestrator"
        assert stub.ReportPolicy(pb.PolicyReport(step=1, location="/ok"), timeout=10, metadata=RIGHT).accepted_step == 1

        with RolloutClient(f"127.0.0.1:{port}", timeout_s=10) as client:  # the trainer's client sends it
            assert client.report_policy(2, "/policy-2") == 2
            assert len(client.get_batch(1, rank=0, world_size=2)) == 3
        monkeypatch.delenv(TOKEN_ENV)
        with RolloutClient(f"127.0.0.1:{port}", timeout_s=10) as client, pytest.raises(RolloutError, match="UNAUTHENTICATED"):
            client.report_policy(3, "/policy-3")
    assert source.reports == [(1, "/ok"), (2, "/policy-2")]


def test_env_workers_cannot_join_without_the_token(token, monkeypatch):
    async def scenario():
        hub = WorkerHub(PolicyClock(async_level=1), group_size=2, envs=["fake"], timeout_s=60)
        server = await start_server(None, "127.0.0.1", 0, workers=hub)
        address = f"127.0.0.1:{server.port}"
        hello = pb.WorkerHello(worker_id="rogue", max_groups=4, envs=["fake"])
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                for metadata in ((), WRONG):
                    call = pb_grpc.EnvWorkersStub(channel).Work(metadata=metadata)
                    with pytest.raises(grpc.aio.AioRpcError) as refused:  # the refusal may beat the write
                        await call.write(pb.WorkerMessage(hello=hello))
                        await call.read()
                    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert not hub.sessions, "a worker without the token joined"

            monkeypatch.setenv(TOKEN_ENV, "a-guess")  # `rlkube env-worker` with a wrong token gives up
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await asyncio.wait_for(work(address, hello, run_group=None), 10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED

            monkeypatch.setenv(TOKEN_ENV, TOKEN)
            worker = asyncio.ensure_future(work(address, hello, run_group=None))
            deadline = asyncio.get_running_loop().time() + 10
            while not hub.sessions:
                assert asyncio.get_running_loop().time() < deadline, "the worker with the token never joined"
                await asyncio.sleep(0.01)
            worker.cancel()
        finally:
            await stop_server(server, 1)

    asyncio.run(scenario())


def test_the_weight_server_streams_the_model_only_to_holders_of_the_token(token, monkeypatch):
    servicer = WeightsServicer(keep_last=2)
    marker = json.dumps({"step": 3, "files": ["model.safetensors"]}).encode()  # as Snapshot.marker() writes
    servicer.add(3, {"model.safetensors": b"weights" * 100, COMPLETE: marker})
    port = free_port()
    server = serve_weights(servicer, f"127.0.0.1:{port}")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            fetch = pb_grpc.WeightsStub(channel).Fetch
            for metadata in ((), WRONG):
                with pytest.raises(grpc.RpcError) as refused:
                    list(fetch(pb.WeightsRequest(step=3), timeout=10, metadata=metadata))
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert b"".join(c.data for c in fetch(pb.WeightsRequest(step=3), timeout=10, metadata=RIGHT_WEIGHTS)
                            if c.file == "model.safetensors") == b"weights" * 100

        assert bytes(fetch_snapshot(f"127.0.0.1:{port}", 3, timeout=10)["model.safetensors"]) == b"weights" * 100
        monkeypatch.delenv(TOKEN_ENV)  # the vLLM worker's fetch, in a process without the token
        with pytest.raises(ConnectionError, match="UNAUTHENTICATED"):
            fetch_snapshot(f"127.0.0.1:{port}", 3, timeout=10)
    finally:
        server.stop(0)


def test_a_server_without_the_token_refuses_to_start_on_a_cluster(monkeypatch, caplog):
    """On a Kubernetes cluster (the kubelet sets KUBERNETES_SERVICE_HOST in every pod) a server
    with no token to require refuses to start, whoever reaches its port could drive it; on a
    workstation it serves everyone, with a warning."""
    from rlkube.auth import IN_CLUSTER_ENV, RequireToken

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.setenv(IN_CLUSTER_ENV, "10.96.0.1")
    with pytest.raises(RuntimeError, match="weight server .* WITHOUT a token on a Kubernetes cluster"):
        serve_weights(WeightsServicer(keep_last=1), f"127.0.0.1:{free_port()}")
    with pytest.raises(RuntimeError, match="orchestrator's gRPC .* WITHOUT a token on a Kubernetes cluster"):
        asyncio.run(start_server(None, "127.0.0.1", 0, workers=None))
    with pytest.raises(RuntimeError, match="rlkube inference .* WITHOUT a token on a Kubernetes cluster"):
        RequireToken(app=None)

    monkeypatch.delenv(IN_CLUSTER_ENV)
    assert RequireToken(app=None).held == {}
    assert "serves WITHOUT a token" in caplog.text


def _unary_call_that_never_sends_its_request(address: str, method: str):
    """A call to the unary method `method` that sends its headers, no token, and then nothing:
    a server that read the request before checking the token would wait for it."""
    import threading

    never = threading.Event()

    def requests():
        never.wait(30)
        yield b""

    with grpc.insecure_channel(address) as channel:
        try:
            channel.stream_unary(method)(requests(), timeout=5)
        except grpc.RpcError as e:
            return e.code()
        finally:
            never.set()


def test_a_call_without_the_token_is_refused_before_its_request_is_read(token):
    """No message of a call is read (up to the servers' 1 GiB limit) before its token is
    checked: the refusal comes at the headers, on the orchestrator's aio server and the
    trainer's thread-pool one alike."""
    port = free_port()
    with ServerThread(FakeSource(), port):
        assert _unary_call_that_never_sends_its_request(
            f"127.0.0.1:{port}", "/rlkube.v1.Rollouts/ReportPolicy") == grpc.StatusCode.UNAUTHENTICATED
    weights = serve_weights(WeightsServicer(keep_last=1), f"127.0.0.1:{(port := free_port())}")
    try:
        assert _unary_call_that_never_sends_its_request(
            f"127.0.0.1:{port}", "/rlkube.v1.Weights/Fetch") == grpc.StatusCode.UNAUTHENTICATED
    finally:
        weights.stop(0)
