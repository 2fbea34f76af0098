"""A run's credential is sent only to the run's own services.

The exploits: whoever can name a `load_weights` location (`rlkube_load_weights("grpc://…")`,
an adapter's, a delta chain's, a NIXL descriptor's) or a judge's or teacher's `base_urls`
would point it at a server of their own and be sent the credential by the run's code. Each
case starts a server that records what each call presents, and drives the real client code."""

import asyncio
from concurrent import futures

import grpc
import pytest
from aiohttp import web
from rlkube import auth
from rlkube.config import JudgeConfig, TeacherConfig
from rlkube.orchestrator.judge import JudgeEndpoint
from rlkube.orchestrator.teacher import Teacher
from rlkube.scopes import GENERATE, WEIGHTS_PEERS_ENV, scoped
from rlkube.transport.weights_grpc import WeightsServicer, fetch_snapshot, serve_weights
from rlkube.transport.weights_snapshot import COMPLETE

from tests.fixtures.inference import free_port
from tests.orchestrator.fake_inference import FakeInferenceThread
from tests.security.test_scopes import TOKEN, as_component

WEIGHTS_FETCH = "/rlkube.v1.Weights/Fetch"


class ListeningWeightServer:
    """A gRPC server at an address outside the run that records the metadata of every call."""

    def __init__(self):
        self.presented: list[dict] = []
        self.port = free_port()
        self.server = grpc.server(futures.ThreadPoolExecutor(2))

        def fetch(request, context):
            self.presented.append(dict(context.invocation_metadata()))
            context.abort(grpc.StatusCode.NOT_FOUND, "nothing here")

        handler = grpc.unary_stream_rpc_method_handler(fetch, request_deserializer=None, response_serializer=None)
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "rlkube.v1.Weights", {"Fetch": handler}),))
        self.address = f"127.0.0.1:{self.port}"
        self.server.add_insecure_port(self.address)

    def __enter__(self):
        self.server.start()
        return self

    def __exit__(self, *exc):
        self.server.stop(0)


@pytest.fixture
def inference(monkeypatch):
    """This process as an inference pod: its credentials, and the run's weight server."""
    as_component(monkeypatch, "inference")
    trainer = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv(WEIGHTS_PEERS_ENV, trainer)
    return trainer


def test_a_load_from_an_address_outside_the_run_is_refused_before_any_dial(inference):
    """`rlkube_load_weights`, an adapter's load, a delta chain and a NIXL descriptor all fetch
    through `fetch_snapshot`: an address that is not the run's weight server is never called."""
    with ListeningWeightServer() as foreign:
        with pytest.raises(PermissionError, match=f"{foreign.address} is not one of the run's weight servers"):
            fetch_snapshot(foreign.address, 3, timeout=5)
        with pytest.raises(PermissionError):
            fetch_snapshot(f"localhost:{inference.rsplit(':', 1)[1]}", 3, timeout=5)  # another name: not the run's
    assert foreign.presented == []


def test_on_a_cluster_a_server_without_the_list_sends_nothing(monkeypatch):
    """A pod whose weight servers are not named (a pod the operator did not make) refuses to
    send the credential anywhere rather than everywhere."""
    as_component(monkeypatch, "inference")
    monkeypatch.delenv(WEIGHTS_PEERS_ENV, raising=False)
    monkeypatch.setenv(auth.IN_CLUSTER_ENV, "10.96.0.1")
    with ListeningWeightServer() as foreign, pytest.raises(PermissionError, match="unset"):
        fetch_snapshot(foreign.address, 3, timeout=5)
    assert foreign.presented == []


def test_the_runs_weight_server_is_sent_the_weights_credential(inference):
    servicer = WeightsServicer(keep_last=1)
    servicer.add(3, {"model.safetensors": b"w" * 10, COMPLETE: b"{}"})
    server = serve_weights(servicer, inference)  # the trainer's, holding the same run's weights credential
    try:
        assert bytes(fetch_snapshot(inference, 3, timeout=10)["model.safetensors"]) == b"w" * 10
    finally:
        server.stop(0)


class RecordingServer:
    """A judge or teacher outside the run: records each call's Authorization; answers as vLLM."""

    def __init__(self):
        self.authorizations: list[str | None] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.answer)
        app.router.add_post("/v1/completions", self.answer)
        return app

    async def answer(self, request: web.Request) -> web.Response:
        self.authorizations.append(request.headers.get("Authorization"))
        return web.json_response({"choices": [{"index": 0, "message": {"role": "assistant", "content": "yes"},
                                               "prompt_logprobs": [None, {"5": {"logprob": -1.0}}]}]})


def call_judge(config: JudgeConfig) -> None:
    """One chat completion through the loopback endpoint, as an environment's judge makes it."""
    async def call():
        import aiohttp

        async with (JudgeEndpoint(config) as endpoint, aiohttp.ClientSession() as s,
                    s.post(f"{endpoint.url}/chat/completions", json={"model": "j", "messages": []}) as r):
            assert r.status == 200

    asyncio.run(call())


@pytest.mark.parametrize("served_by_run", [False, True], ids=["user-set", "served-by-the-run"])
def test_a_judge_outside_the_run_gets_no_credential(monkeypatch, served_by_run):
    as_component(monkeypatch, "env-worker")
    judge = RecordingServer()
    with FakeInferenceThread(judge) as server:
        call_judge(JudgeConfig(model="j", base_urls=[server.url], served_by_run=served_by_run))
    expected = f"Bearer {scoped(TOKEN, GENERATE)}" if served_by_run else None
    assert judge.authorizations == [expected]


def test_a_judge_outside_the_run_gets_the_key_the_user_names(monkeypatch):
    as_component(monkeypatch, "orchestrator")
    monkeypatch.setenv("JUDGE_API_KEY", "sk-of-the-users-own")
    judge = RecordingServer()
    with FakeInferenceThread(judge) as server:
        call_judge(JudgeConfig(model="j", base_urls=[server.url], api_key_env="JUDGE_API_KEY"))
    assert judge.authorizations == ["Bearer sk-of-the-users-own"]
    monkeypatch.delenv("JUDGE_API_KEY")
    with pytest.raises(ValueError, match="orchestrator.judge.api_key_env: JUDGE_API_KEY is not set"):
        JudgeEndpoint(JudgeConfig(model="j", base_urls=["http://x"], api_key_env="JUDGE_API_KEY"))
    with pytest.raises(ValueError, match="RLKUBE_TOKEN_ADMIN.*name a variable of your own"):
        JudgeConfig(model="j", api_key_env="RLKUBE_TOKEN_ADMIN")


@pytest.mark.parametrize("served_by_run", [False, True], ids=["user-set", "served-by-the-run"])
def test_a_teacher_outside_the_run_gets_no_credential(monkeypatch, served_by_run):
    as_component(monkeypatch, "orchestrator")
    teacher = RecordingServer()
    with FakeInferenceThread(teacher) as server:
        config = TeacherConfig(model="t", base_urls=[server.url], served_by_run=served_by_run)
        assert asyncio.run(Teacher(config).token_logprobs(server.url, [1, 5])) == [0.0, -1.0]
    expected = f"Bearer {scoped(TOKEN, GENERATE)}" if served_by_run else None
    assert teacher.authorizations == [expected]
