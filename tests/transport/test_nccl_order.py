"""NCCL weight updates with requests in flight, against a recording fake engine (no GPU).

`RecordingEngine` serves the routes the trainer's `NcclPublisher` and the orchestrator call on
a vLLM server: `/pause`, `/resume`, vLLM's weight-transfer routes, `/reset_prefix_cache`,
`/update_weight_version`, `/weight_info`, and a generate route whose request decodes token by
token, each step waiting while the engine is paused (vLLM's `pause(mode="keep")`). It records
every call in order and counts decode steps that ran inside a transfer (between
`/start_weight_update` and `/finish_weight_update`): those would read half-loaded layers.

Only the NCCL broadcast itself is missing: vLLM's trainer-side engine is replaced by one that
sends the same RPC sequence through the publisher's real HTTP client, and a transfer lasts
until a decode step runs into it (or `TRANSFER_S`), so an unpaused request always does.
The real broadcast into a vLLM CUDA server is `tests/inference/test_nccl_gpu.py` (`gpu`).
"""

import asyncio
import contextlib
import threading
from dataclasses import asdict

import httpx
import pytest
import torch
from aiohttp import web
from rlkube.config import OrchestratorConfig, WeightTransferConfig
from rlkube.orchestrator import checkpoint
from rlkube.orchestrator.inference import InferencePool
from rlkube.orchestrator.orchestrator import Orchestrator

from tests.fixtures.inference import free_port
from tests.orchestrator.fake_inference import FakeInferenceThread
from tests.orchestrator.test_orchestrator import FakeRunner

TRANSFER_S = 1.0
MAX_DECODE_STEPS = 10_000
PUBLISH = [
    "pause", "start_weight_update", "update_weights", "finish_weight_update",
    "reset_prefix_cache", "update_weight_version", "resume",
]


class RecordingEngine:
    def __init__(self, version: str = "default"):
        self.version = version
        self.calls: list[str] = []
        self.params: dict[str, dict] = {}
        self.overlaps = 0
        self.transferring = False
        self.transfer_started = threading.Event()
        self.release_transfer = threading.Event()
        self.release_transfer.set()
        self.decoding = threading.Event()

    def app(self) -> web.Application:
        self.running = asyncio.Event()
        self.running.set()
        self.overlap = asyncio.Event()
        app = web.Application()
        app.router.add_post("/v1/completions", self.generate)
        app.router.add_get("/weight_info", lambda r: web.json_response({"weight_version": self.version}))
        app.router.add_get("/get_world_size", lambda r: web.json_response({"world_size": 1}))
        app.router.add_post("/{route}", self.admin)
        return app

    async def generate(self, request: web.Request) -> web.Response:
        """Decodes until it has produced tokens with weight version `until_version` (so it is
        in flight whenever the update comes), at most `max_tokens`."""
        body, versions = await request.json(), []
        while len(versions) < body["max_tokens"] and versions[-2:] != [body["until_version"]] * 2:
            await self.running.wait()
            if self.transferring:
                self.overlaps += 1
                self.overlap.set()
            versions.append(self.version)
            self.decoding.set()
            await asyncio.sleep(0.005)
        return web.json_response({"versions": versions})

    async def admin(self, request: web.Request) -> web.Response:
        route = request.match_info["route"]
        body = await request.json() if request.can_read_body else {}
        self.calls.append(route)
        self.params[route] = dict(request.query) | body
        if route == "pause":
            self.running.clear()
        elif route == "resume":
            self.running.set()
        elif route == "start_weight_update":
            self.transferring = True
            self.transfer_started.set()
        elif route == "update_weights":
            while not self.release_transfer.is_set():
                await asyncio.sleep(0.01)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.overlap.wait(), TRANSFER_S)
        elif route == "finish_weight_update":
            self.transferring = False
        elif route == "update_weight_version":
            self.version = body["new_version"]
        return web.json_response({})

    def publish_calls(self) -> list[str]:
        """The calls of weight updates, without the engine's one-time setup."""
        return [c for c in self.calls if c != "init_weight_transfer_engine"]


class BroadcastFreeEngine:
    """vLLM's `NCCLTrainerWeightTransferEngine` minus NCCL: the same RPCs to every replica,
    in the same order, through the client the publisher hands it."""

    def __init__(self, client, source):
        self.client, self.source = client, source

    @classmethod
    def trainer_init(cls, init_info, *, client, source):
        client.init_weight_transfer_engine({"master_port": init_info.master_port})
        return cls(client, source)

    def send_weights(self):
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferUpdateInfo

        meta = self.source.metadata()
        info = NCCLWeightTransferUpdateInfo(
            names=[m.name for m in meta], dtype_names=["float32"] * len(meta), shapes=[list(m.shape) for m in meta]
        )
        self.client.start_weight_update()
        self.client.update_weights(asdict(info))
        self.client.finish_weight_update()

    def shutdown(self):
        pass


@pytest.fixture
def engines():
    fakes = [RecordingEngine("0"), RecordingEngine("0")]
    with FakeInferenceThread(fakes[0]) as first, FakeInferenceThread(fakes[1]) as second:
        for fake, server in zip(fakes, (first, second)):
            fake.url = server.url
        yield fakes


@pytest.fixture
def publisher(engines, monkeypatch):
    from rlkube.transport.publishers import make_publisher
    from vllm.distributed.weight_transfer import nccl_engine

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(nccl_engine, "NCCLTrainerWeightTransferEngine", BroadcastFreeEngine)
    config = WeightTransferConfig(type="nccl", nccl_port=free_port(), inference_urls=[e.url for e in engines])
    publisher = make_publisher(config, "unused", "unused")
    yield publisher
    publisher.close()


def start_generating(engine: RecordingEngine, until_version: str) -> threading.Thread:
    """A request in flight on `engine` until it decodes on `until_version`: returns once it is
    decoding; the thread ends with it."""
    result = {}

    def run():
        request = {"max_tokens": MAX_DECODE_STEPS, "until_version": until_version}
        response = httpx.post(f"{engine.url}/v1/completions", json=request, timeout=120)
        result.update(response.json())

    thread = threading.Thread(target=run)
    thread.result = result
    thread.start()
    assert engine.decoding.wait(30)
    return thread


STATE = {"w": torch.zeros(4, 2), "b": torch.zeros(3)}


def test_publish_pauses_transfers_resets_tags_and_resumes_every_replica(engines, publisher):
    generating = [start_generating(engine, until_version="1") for engine in engines]
    assert publisher.publish(STATE, step=1).startswith("nccl://")
    for thread in generating:
        thread.join(120)
    for engine, thread in zip(engines, generating):
        assert engine.publish_calls() == PUBLISH
        assert engine.overlaps == 0, "decode steps ran on half-loaded weights"
        assert engine.params["pause"]["mode"] == "keep"
        assert engine.params["reset_prefix_cache"]["reset_running_requests"] == "true"
        versions = thread.result["versions"]
        assert versions[0] == "0" and versions[-1] == "1", (
            "the request in flight was kept and finished on the new weights"
        )


def nccl_config(tmp_path, **overrides) -> OrchestratorConfig:
    return OrchestratorConfig.model_validate({
        "output_dir": tmp_path, "max_steps": 4, "batch_size": 4, "group_size": 2, "seq_len": 16,
        "weights": {"type": "nccl", "timeout_s": 60}, **overrides,
    })


class Replicas(InferencePool):
    """The real pool's policy loading, without model contexts (nothing is generated here)."""

    def __init__(self, urls: list[str]):
        self.base_urls = urls


def test_the_orchestrator_waits_for_a_broadcast_and_never_resumes_one(engines, publisher, tmp_path):
    """The trainer may already broadcast policy n+1 while the orchestrator takes in policy n:
    the orchestrator must not pause and resume around its check, or the resume lands inside
    that broadcast."""
    location = publisher.publish(STATE, step=1)
    engine = engines[0]
    engine.release_transfer.clear()
    engine.transfer_started.clear()
    generating = start_generating(engine, until_version="2")
    second = threading.Thread(target=publisher.publish, args=(STATE, 2))
    second.start()
    assert engine.transfer_started.wait(30)

    async def take_in_policy_1():
        orchestrator = Orchestrator(nccl_config(tmp_path), [FakeRunner()], Replicas([e.url for e in engines]), lambda m, s: None)
        loop = asyncio.ensure_future(orchestrator.policy_loop())
        await orchestrator.reports.put((1, location))
        while orchestrator.clock.policy_step < 1:
            assert not loop.done(), loop.exception()
            await asyncio.sleep(0.05)
        loop.cancel()

    asyncio.run(asyncio.wait_for(take_in_policy_1(), 60))
    engine.release_transfer.set()
    second.join(60)
    generating.join(120)
    assert engine.overlaps == 0, "decode steps ran on half-loaded weights"
    assert engine.publish_calls() == PUBLISH * 2, "only the trainer pauses and resumes"
    assert generating.result["versions"][-1] == "2"


def test_a_resumed_orchestrator_waits_for_the_trainer_to_republish(engines, publisher, tmp_path):
    """A replica that outlived the trainer serves a later, abandoned policy (5); resuming from
    checkpoint 2 must wait for the restarted trainer's broadcast of 2 before generating."""
    for engine in engines:
        engine.version = "5"
    config = nccl_config(tmp_path, max_steps=2)
    saved = Orchestrator(config, [FakeRunner()], Replicas([]), lambda m, s: None).state_dict()
    checkpoint.save(tmp_path / "checkpoints", 2, saved | {"policy_step": 2, "policy_location": "nccl://127.0.0.1:1"})

    async def resume():
        orchestrator = Orchestrator(config, [FakeRunner()], Replicas([e.url for e in engines]), lambda m, s: None)
        run = asyncio.ensure_future(orchestrator.run(resume_step=2))
        await asyncio.sleep(1.0)
        assert not run.done(), "went on with the abandoned policy 5 (or failed on it)"
        await asyncio.to_thread(publisher.publish, STATE, 2)
        await asyncio.wait_for(run, 30)

    asyncio.run(resume())
    for engine in engines:
        assert engine.version == "2"
        assert engine.publish_calls() == PUBLISH, "the orchestrator loads nothing itself"
