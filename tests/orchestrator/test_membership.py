"""A pool member's orchestrator and the pool trainer (rlkube.orchestrator.membership): the trainer
config it attaches with, and what each answer of `Pool.Status` makes of it."""

import asyncio

import pytest
from rlkube.config import OrchestratorConfig, TrainerConfig, write_toml
from rlkube.orchestrator import membership
from rlkube.orchestrator.membership import Membership, PoolLost
from rlkube.transport import rlkube_pb2 as pb
from rlkube.transport.pool import PoolUnavailable


def member(tmp_path, max_steps: int = 5, **trainer) -> Membership:
    write_toml(TrainerConfig(max_steps=max_steps, lora={"rank": 8}, **trainer), tmp_path / "trainer.toml")
    config = OrchestratorConfig(max_steps=5, rollouts={"port": 50061}, pool={
        "member": "team-a.run", "trainer": "pool:50070", "trainer_config": str(tmp_path / "trainer.toml"),
        "check_interval_s": 0.01, "attach_timeout_s": 0.2})
    return Membership(config)


def test_it_attaches_with_its_trainer_config_resuming_where_it_resumes(tmp_path):
    m = member(tmp_path, ckpt={"interval": 2})
    assert m.address == "127.0.0.1:50061"
    assert TrainerConfig.model_validate_json(m.trainer_config(4)).ckpt.resume_step == 4
    assert TrainerConfig.model_validate_json(m.trainer_config(None)).ckpt.resume_step is None
    with pytest.raises(ValueError, match="pool.trainer_config: .* max_steps 7, this orchestrator 5"):
        member(tmp_path, max_steps=7).trainer_config(None)
    with pytest.raises(ValueError, match="pool.trainer_config: .* sets no ckpt"):
        member(tmp_path).trainer_config(2)


def watch_with(monkeypatch, tmp_path, *answers):
    """Run `watch` against `Pool.Status` answering `answers` in turn (an exception is raised)."""
    answers = iter(answers)

    def status(address, name, timeout_s):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(membership.pool_rpc, "status", status)
    return asyncio.run(member(tmp_path).watch())


def reply(members=(), left: str | None = None):
    """`members` by name, and why "team-a.run" left (None: it did not)."""
    return pb.PoolStatusReply(members=[pb.PoolMember(name=n) for n in members],
                              left={} if left is None else {"team-a.run": left})


def test_a_member_until_its_end_while_the_pool_trainer_holds_it(monkeypatch, tmp_path):
    assert watch_with(monkeypatch, tmp_path, reply(["team-a.run"]), PoolUnavailable("restarting"),
                      reply(["team-a.run"]), reply(left="finished")) is None


def test_a_pool_trainer_that_lost_it_restarts_it(monkeypatch, tmp_path):
    with pytest.raises(PoolLost, match="does not know it"):
        watch_with(monkeypatch, tmp_path, reply(["team-a.run"]), PoolUnavailable("restarting"), reply(["other"]))
    with pytest.raises(PoolLost, match="evicted"):
        watch_with(monkeypatch, tmp_path, reply(left="evicted: its orchestrator did not answer"))


def test_a_member_the_pool_trainer_failed_fails(monkeypatch, tmp_path):
    with pytest.raises(RuntimeError, match="failed member team-a.run: failed: RuntimeError: not finite"):
        watch_with(monkeypatch, tmp_path, reply(left="failed: RuntimeError: not finite"))


def test_a_pool_trainer_silent_past_attach_timeout_fails_it(monkeypatch, tmp_path):
    with pytest.raises(RuntimeError, match="did not answer for pool.attach_timeout_s"):
        watch_with(monkeypatch, tmp_path, *[PoolUnavailable("down")] * 1000)
