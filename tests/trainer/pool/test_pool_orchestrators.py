"""The pool trainer with two REAL orchestrators as members (reverse_text env, verifiers
rollouts, a fake engine over real HTTP, real gRPC both ways): batches of 4 and 16 rollouts
(1:4), each run to its own max_steps, its adapters published under its own member directory and
reported to its own orchestrator, which loads them and finishes."""

import asyncio
import threading

import pytest
from rlkube.orchestrator.app import build_runners
from rlkube.orchestrator.orchestrator import Orchestrator
from rlkube.transport.server import start_server, stop_server

from tests.orchestrator.fake_inference import FakeInference, FakeInferenceThread
from tests.orchestrator.test_env_workers import pool_for, reverse_text_config
from tests.trainer.pool.members import RunningPool, member_config, pool_config

pytestmark = pytest.mark.slow


class OrchestratorThread:
    """A real orchestrator serving its Rollouts gRPC on its own loop, until it finishes."""

    def __init__(self, config):
        self.config = config
        self.orchestrator = Orchestrator(config, build_runners(config), pool_for(config), lambda m, s: None)
        self.address = f"127.0.0.1:{config.rollouts.port}"
        self.serving, self.error = threading.Event(), None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        async def go():
            server = await start_server(self.orchestrator, "127.0.0.1", self.config.rollouts.port)
            self.serving.set()
            try:
                await self.orchestrator.run()
                await asyncio.sleep(2)  # the trainer's last calls
            finally:
                await stop_server(server, 1)

        try:
            asyncio.run(go())
        except Exception as e:  # noqa: BLE001 - the test reports it
            self.error = e

    def start(self):
        self.thread.start()
        assert self.serving.wait(30)
        return self


def test_two_real_orchestrators_train_to_their_ends_on_one_pool(tiny_model, tmp_path, world_of_one):
    steps = {"small": 6, "big": 2}
    pool = RunningPool(pool_config(tiny_model, tmp_path))
    try:
        with FakeInferenceThread(FakeInference(str(tiny_model), 3)) as engine:
            members = {}
            for name, batch in (("small", 4), ("big", 16)):
                config = reverse_text_config(tmp_path / name, tiny_model, engine.url, env_workers=0,
                                             batch_size=batch, max_steps=steps[name])
                members[name] = OrchestratorThread(config).start()
            for seed, (name, member) in enumerate(members.items()):
                pool.roster.attach(name, member.address, member_config(tiny_model, seed, max_steps=steps[name]), 1.0)
            pool.start()
            status = pool.wait_for(lambda s: set(s["left"]) == {"small", "big"}, timeout_s=600, what="both to finish")
            for member in members.values():
                member.thread.join(60)
                assert member.error is None, member.error
    finally:
        pool.close()
    assert status["left"] == {"small": "finished", "big": "finished"}
    for name, member in members.items():
        assert member.orchestrator.status()["phase"] == "finished"
        assert member.orchestrator.status()["step"] == steps[name]
        assert (tmp_path / "pool" / "members" / name / "weights").is_dir()
        assert (tmp_path / "pool" / "members" / name / "metrics").is_dir()
