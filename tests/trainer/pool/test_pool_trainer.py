"""The pool trainer (rlkube.trainer.pool) over real gRPC: members attach through the Pool
service, their batches come from real Rollouts servers; the tiny model on the CPU.

- fair share: members with batches of 1 and 4 rows get equal trained tokens (+-15 %) over 30 steps;
- a member whose batch is never ready does not stall another; once its orchestrator is gone
  for `member_grace_s` it is evicted;
- a NaN loss and an empty batch fail only their member; the other trains on; the adapters of
  the failed and the evicted are unloaded from the pool's inference, with the pool's admin
  credential, the others' not;
- Attach refuses another member's credential, a misfit (naming the field) and a full pool.
"""


import time

import pytest
import torch
from rlkube import auth
from rlkube.inference.client import UNLOAD_ROUTE
from rlkube.scopes import ADMIN, ROLLOUTS, member_scoped, scoped
from rlkube.trainer.rl.multi_run import _local
from rlkube.transport.pool import attach, detach, status
from safetensors.torch import load_file

from tests.trainer.pool.members import (
    MemberSource,
    RunningPool,
    member_config,
    member_server,
    pool_config,
    recording_inference,
)


@pytest.fixture
def running(tiny_model, tmp_path, world_of_one):
    pools = []

    def make(**pool):
        pools.append(RunningPool(pool_config(tiny_model, tmp_path, **pool)))
        return pools[-1]

    yield make
    for pool in pools:
        pool.close()


def members_in(status):
    return status["members"]


def unloaded(calls) -> list[str]:
    """The members whose adapter the pool trainer unloaded, each call with the pool's admin credential."""
    assert all(path.startswith(UNLOAD_ROUTE + "?name=") for path, _ in calls), calls
    assert all(credential == auth.http_headers(ADMIN)["Authorization"] for _, credential in calls), calls
    return [path.removeprefix(UNLOAD_ROUTE + "?name=") for path, _ in calls]


@pytest.mark.slow
def test_fair_share_of_trained_tokens_with_batches_1_to_4(running, tiny_model, tmp_path):
    pool = running()
    small, big = MemberSource(1, rows=1), MemberSource(2, rows=4)
    with member_server(small) as (small_at, _), member_server(big) as (big_at, _):
        attach(pool.address, "small", small_at, member_config(tiny_model, 1))
        attach(pool.address, "big", big_at, member_config(tiny_model, 2, weights={"keep_last": None}))
        pool.start()
        status = pool.wait_for(lambda s: sum(m["step"] for m in members_in(s).values()) >= 30, what="30 steps")
        pool.close()
    members = members_in(status)
    assert members["small"]["step"] > 3 * members["big"]["step"] > 0
    step_0 = load_file(tmp_path / "pool" / "members" / "big" / "weights" / "step_0" / "adapter_model.safetensors")
    assert step_0 and all(not t.any() for name, t in step_0.items() if ".lora_B." in name), "a zero step-0 adapter"
    for name in ("small", "big"):
        assert 0.5 * 0.85 <= members[name]["share"] <= 0.5 * 1.15, members


@pytest.mark.slow
def test_a_member_never_ready_does_not_stall_and_a_gone_one_is_evicted(running, tiny_model):
    with recording_inference() as (inference, calls):
        evicting_a_gone_member(running(member_grace_s=2.0, inference_urls=[inference]), tiny_model)
    assert unloaded(calls) == ["stuck"]


def evicting_a_gone_member(pool, tiny_model):
    ready, stuck = MemberSource(1, rows=1), MemberSource(2, rows=1, ready_step=0)
    with member_server(ready) as (ready_at, _), member_server(stuck) as (stuck_at, stuck_server):
        attach(pool.address, "ready", ready_at, member_config(tiny_model, 1))
        attach(pool.address, "stuck", stuck_at, member_config(tiny_model, 2))
        pool.start()
        pool.wait_for(lambda s: members_in(s).get("ready", {}).get("step", 0) >= 5, what="5 steps of 'ready'")
        assert stuck.served == [] and members_in(pool.roster.status())["stuck"]["step"] == 0
        stuck_server.__exit__()  # its orchestrator is gone
        step_then = members_in(pool.roster.status())["ready"]["step"]
        status = pool.wait_for(lambda s: "stuck" in s["left"], timeout_s=60, what="eviction of 'stuck'")
        assert "pool.member_grace_s" in status["left"]["stuck"]
        status = pool.wait_for(lambda s: members_in(s)["ready"]["step"] >= step_then + 5, what="'ready' going on")
        assert "stuck" not in pool.pool.members
        pool.close()


@pytest.mark.slow
def test_a_member_killed_while_ready_does_not_hold_the_others_steps(running, tiny_model):
    """Both always ready; one's orchestrator goes away: the other's steps never wait for it (a
    probe that gets no answer marks it unready; a fetch already under way gives up after
    fetch_unavailable_s, far below member_grace_s)."""
    pool = running(member_grace_s=30.0, fetch_unavailable_s=1.0)
    a, b = MemberSource(1, rows=1), MemberSource(2, rows=1)
    with member_server(a) as (a_at, _), member_server(b) as (b_at, b_server):
        attach(pool.address, "a", a_at, member_config(tiny_model, 1))
        attach(pool.address, "b", b_at, member_config(tiny_model, 2))
        pool.start()
        pool.wait_for(lambda s: min(m["step"] for m in members_in(s).values()) >= 3, what="3 steps each")
        b_server.__exit__()
        killed, steps = time.monotonic(), []  # (when, a's step) at each of a's steps after the kill
        while len(steps) < 8:
            step = pool.wait_for(lambda s: not steps or members_in(s)["a"]["step"] > steps[-1][1],
                                 timeout_s=60, what="a's next step")
            steps.append((time.monotonic(), members_in(step)["a"]["step"]))
        pool.close()
    gaps = [later - earlier for (earlier, _), (later, _) in zip([(killed, 0), *steps], steps)]
    assert max(gaps) < 15.0, f"a's steps waited for b: gaps {gaps}"


@pytest.mark.slow
def test_nan_loss_and_empty_batch_fail_only_their_member(running, tiny_model, tmp_path):
    with recording_inference() as (inference, calls):
        failing_two_of_three(running(inference_urls=[inference]), tiny_model, tmp_path)
    assert sorted(unloaded(calls)) == ["empty", "nan"]


def failing_two_of_three(pool, tiny_model, tmp_path):
    good = MemberSource(1, rows=1)
    nan, empty = MemberSource(2, rows=1, poison={3: "nan"}), MemberSource(3, rows=1, poison={2: "empty"})
    with member_server(good) as (good_at, _), member_server(nan) as (nan_at, _), member_server(empty) as (empty_at, _):
        attach(pool.address, "good", good_at, member_config(tiny_model, 1, ckpt={"interval": 1}))
        attach(pool.address, "nan", nan_at, member_config(tiny_model, 2, ckpt={"interval": 1}))
        attach(pool.address, "empty", empty_at, member_config(tiny_model, 3))
        pool.start()
        status = pool.wait_for(lambda s: {"nan", "empty"} <= set(s["left"]) and members_in(s)["good"]["step"] >= 8,
                               what="both failures and 8 steps of 'good'")
        assert set(pool.pool.members) == {"good"}
        good_adapter = pool.pool.members["good"].adapter
        pool.close()
    assert status["left"]["nan"].startswith("failed: FloatingPointError")
    assert "no tokens to train on" in status["left"]["empty"]
    assert all(torch.isfinite(_local(t)).all() for t in good_adapter.values())
    # each member's checkpoints and adapters are under its own directory; nan's last good step is 2
    members = tmp_path / "pool" / "members"
    assert (members / "nan" / "checkpoints" / "trainer" / "step_2").is_dir()
    assert not (members / "nan" / "checkpoints" / "trainer" / "step_3").exists()
    assert (members / "good" / "weights").is_dir() and (members / "nan" / "weights").is_dir()


def test_attach_takes_only_the_members_own_credential_and_a_fitting_config(tiny_model, tmp_path, monkeypatch,
                                                                           world_of_one):
    pool = RunningPool(pool_config(tiny_model, tmp_path, max_runs=1), pool_token="pool-token")
    try:
        monkeypatch.setenv("RLKUBE_TOKEN_ROLLOUTS", member_scoped("pool-token", "a", ROLLOUTS))
        config = member_config(tiny_model, 1)
        with pytest.raises(ValueError, match="UNAUTHENTICATED"):
            attach(pool.address, "b", "127.0.0.1:1", config)  # a's credential, b's name
        with pytest.raises(ValueError, match=r"INVALID_ARGUMENT: trainer.lora.rank: 4 is not the pool's 8"):
            attach(pool.address, "a", "127.0.0.1:1", config.replace('"rank":8', '"rank":4'))
        attach(pool.address, "a", "127.0.0.1:1", config)
        monkeypatch.setenv("RLKUBE_TOKEN_ROLLOUTS", member_scoped("pool-token", "c", ROLLOUTS))
        with pytest.raises(ValueError, match="RESOURCE_EXHAUSTED: pool.max_runs"):
            attach(pool.address, "c", "127.0.0.1:1", config)
        with pytest.raises(ValueError, match="UNAUTHENTICATED"):
            detach(pool.address, "a")
        assert set(pool.roster.status()["members"]) == {"a"}
    finally:
        pool.close()


def test_member_credentials_differ_by_member_and_scope():
    credentials = {member_scoped("t", m, s) for m in ("a", "b") for s in ("generate", "admin", "rollouts")}
    assert len(credentials) == 6
    with pytest.raises(ValueError, match="weights"):
        member_scoped("t", "a", "weights")


def test_status_shows_a_member_itself_and_the_pool_its_whole_roster(tiny_model, tmp_path, monkeypatch, world_of_one):
    """`Pool.Status`: a member's own rollouts credential gets its own entry (what it checks to
    notice a restarted pool trainer), the pool's own gets every member; Attach answers where
    the member's step-0 adapter is published."""
    pool = RunningPool(pool_config(tiny_model, tmp_path), pool_token="pool-token")
    try:
        for name in ("a", "b"):
            monkeypatch.setenv("RLKUBE_TOKEN_ROLLOUTS", member_scoped("pool-token", name, ROLLOUTS))
            location = attach(pool.address, name, "127.0.0.1:1", member_config(tiny_model, 1))
            assert location == str(tmp_path / "pool" / "members" / name / "weights" / "step_0")
        detach(pool.address, "b")
        assert status(pool.address, "b").left == {"b": "detached"}
        with pytest.raises(ValueError, match="UNAUTHENTICATED"):
            status(pool.address, "a")  # b's credential, a's name
        with pytest.raises(ValueError, match="UNAUTHENTICATED"):
            status(pool.address)  # the whole roster takes the pool's own credential
        monkeypatch.setenv("RLKUBE_TOKEN_ROLLOUTS", scoped("pool-token", ROLLOUTS))
        roster = status(pool.address)
        assert [m.name for m in roster.members] == ["a"] and roster.members[0].weight == 1.0
        assert roster.left == {"b": "detached"} and roster.instance_id
        assert [m.name for m in status(pool.address, "a").members] == ["a"]
    finally:
        pool.close()
