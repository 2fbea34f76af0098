"""One RLRun (weights over gRPC from the trainer's stable Service, checkpoints every 4 steps on
its claim) through every fault a cluster deals out, in turn, each followed by recovery:

1. the trainer is SIGKILLed before the first checkpoint → the gang restarts from scratch (no
   crash loop on a missing checkpoint);
2. the trainer is SIGKILLed after a checkpoint → gang restart from the newest complete one, at
   most one checkpoint interval redone;
3. an inference pod's processes are SIGKILLed → it comes back and is brought to the current
   policy before any of its rollouts are trained on (checked on vLLM's own weight-version tags);
   rollouts cut off by the kill are re-issued, never errored: every step trains a full batch;
   the trainer is not restarted;
4. the orchestrator is killed → it is restarted (a new container or pod), the trainer follows
   it back to its checkpoint: at most one checkpoint interval redone;
5. the leading operator pod is deleted → the other replica (the chart runs two, electing a
   leader) carries on: the same trainer Job (uid) and restart count, no duplicate children, and
   the run's progress written again once the old pod is gone (so by the new leader);
6. suspend, then unsuspend → no step trained while suspended; the trainer's first step after
   the resume is the newest complete checkpoint's + 1, then every step to the end once;
7. it reaches max_steps (by the trainer's own metrics) and Succeeded; deleting it removes every
   object of every kind the operator makes.

The wall time of each recovery and the steps redone are recorded (the "figures" section of the
run's summary prints them).
"""

import time

import pytest

from e2e.scenarios.manifests import claim, short_rl
from e2e.scenarios.runs import Run

pytestmark = pytest.mark.slow

NAME = "heal"
CLAIM = "heal-data"
INTERVAL = 4
MAX_STEPS = 48  # room for six faults at about a second a step
BATCH_SIZE = 64  # short_rl's


@pytest.mark.timeout(2400)
def test_a_run_heals_from_every_fault(cluster, record_property):
    cluster.apply(claim(CLAIM))
    model = cluster.seed_model(CLAIM)
    manifest = short_rl(NAME, model, CLAIM, MAX_STEPS, **{
        "ckpt.interval": INTERVAL, "weights.type": "grpc", "orchestrator.sampling.temperature": 1.0,
    })
    # Three of the faults below restart the trainer's gang (two kills, and the orchestrator's
    # restart, which the trainer follows); each restart counts against the limit.
    manifest["spec"]["restartPolicy"] = {"backoffLimit": 6}
    cluster.apply(manifest)
    run = Run(cluster, NAME, CLAIM)

    # 1. Before the first checkpoint: killed as soon as step 1 is in the trainer's metrics (a
    # step takes about a second here; the operator's status would tell it seconds later).
    trainer = run.pod("trainer")
    run.wait_trained(1, 600)
    killed_at = run.recover("trainer killed before the first checkpoint", lambda: cluster.kill(trainer))
    assert killed_at < INTERVAL, f"the kill came at step {killed_at}, after the first checkpoint: too late to test"
    steps = run.trainer_steps()
    assert steps[0] == 1 and steps.count(1) == 2, f"the restarted gang starts from scratch: {steps}"
    assert run.status()["restarts"] >= 1

    # 2. After a checkpoint: resume from it.
    run.wait_step(INTERVAL + 1, 600)
    before = len(run.trainer_steps())
    killed_at = run.recover("trainer killed after a checkpoint", lambda: cluster.kill(run.pod("trainer")))
    after = run.trainer_steps()[before:]
    redone = [s for s in after if s <= killed_at]
    # Resumed from a checkpoint, not from scratch; none redone when the kill lands just after one.
    assert after and 1 < after[0] <= killed_at + 1 and len(redone) <= INTERVAL, \
        f"after a kill at step {killed_at} the trainer trained {after}"
    assert run.status()["restarts"] >= 2
    record_property(f"trainer SIGKILL at step {killed_at}: steps redone", redone)

    # 3. An inference pod: the run goes on without a gang restart.
    inference_restarts = _restart_count(cluster, run.pod("inference"))
    restarts = run.status()["restarts"]
    killed_at = run.recover("inference pod killed", lambda: cluster.kill(run.pod("inference")), progress=3)
    assert _restart_count(cluster, run.pod("inference")) > inference_restarts
    assert run.status()["restarts"] == restarts, "an inference restart does not restart the trainer"
    _assert_every_sample_from_the_current_policy(run, after=killed_at)
    _assert_no_step_lost_to_the_kill(run, killed_at)

    # 4. The orchestrator: restarted (a kill that did nothing fails here), little redone.
    orchestrator = run.pod("orchestrator")
    before_kill, before = cluster.incarnation(orchestrator), len(run.trainer_steps())
    killed_at = run.recover("orchestrator killed", lambda: cluster.kill(orchestrator))
    assert cluster.incarnation(run.pod("orchestrator")) != before_kill, "the orchestrator was not restarted"
    redone = [s for s in run.trainer_steps()[before:] if s <= killed_at]
    assert len(redone) <= INTERVAL, f"steps redone after the orchestrator's kill at {killed_at}: {redone}"
    record_property(f"orchestrator killed at step {killed_at}: steps redone", redone)

    # 5. The operator: its replacement adopts the run as it is, and writes its status.
    job, restarts = _trainer_job(cluster), run.status()["restarts"]
    operator = cluster.operator_leader()
    run.recover("operator pod deleted", lambda: _replace_operator(cluster, run, operator))
    assert _trainer_job(cluster) == job, "the operator's restart restarted the trainer's gang"
    assert run.status()["restarts"] == restarts
    children = run.children()
    assert len(children["StatefulSet"]) == 1 and len(children["Deployment"]) == 1, children
    assert len(children["Job"]) == 1, f"one trainer Job at a time: {children['Job']}"

    # 6. Suspend and resume: from the newest checkpoint, every step after it trained once.
    cluster.kubectl("patch", "rlrun", NAME, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    cluster.wait(lambda: run.status().get("phase") == "Suspended"
                 and not cluster.names("pods", f"rlkube.dev/run={NAME}"), 300, "the suspended run's pods to go")
    trained = run.trainer_steps()
    time.sleep(5)  # two of the operator's resyncs: still suspended, nothing trains
    assert run.status()["phase"] == "Suspended", run.status()
    assert run.trainer_steps() == trained, "a suspended run trained"
    checkpoint = max(run.checkpoints(INTERVAL))
    run.recover("suspended, then resumed",
                lambda: cluster.kubectl("patch", "rlrun", NAME, "--type=merge", "-p", '{"spec":{"suspend":false}}'))
    running = run.children()  # every kind a running run has, for the deletion below

    # 7. To the end.
    cluster.wait_phase("rlrun", NAME, {"Succeeded"}, 1200)
    resumed = run.trainer_steps()[len(trained):]
    assert resumed == list(range(checkpoint + 1, MAX_STEPS + 1)), \
        f"after a resume from step {checkpoint}'s checkpoint the trainer trained steps {resumed}"
    record_property("recovery wall times (s)", {k: round(v, 1) for k, v in run.timings.items()})

    # Every kind is listed (a misspelt one would list nothing, and its deletion would prove nothing).
    assert all(running[kind] for kind in ("PodDisruptionBudget", "NetworkPolicy", "Secret", "Job")), running
    cluster.delete("rlrun", NAME)
    cluster.wait(lambda: not any(run.children().values()), 180, "every child of the deleted run to go")


def _trainer_job(cluster) -> tuple[str, str]:
    (job,) = cluster.names("jobs", f"rlkube.dev/run={NAME}")
    return job, cluster.get("job", job)["metadata"]["uid"]


def _replace_operator(cluster, run: Run, operator: str) -> None:
    """Delete the leading operator's pod; once it is gone, the run's progress must move again: a
    status write only the new leader can have made."""
    cluster.delete("pod", operator, "--wait=false")
    cluster.wait(lambda: cluster.get("pod", operator) is None, 120, f"operator pod {operator} to go")
    step = run.step()
    cluster.wait(lambda: run.step() > step, 300, f"the new operator to write the run's progress past step {step}")


def _restart_count(cluster, pod: str) -> int:
    statuses = cluster.status("pod", pod).get("containerStatuses") or [{}]
    return int(statuses[0].get("restartCount", 0))


def _assert_every_sample_from_the_current_policy(run: Run, after: int) -> None:
    """By the engine's own weight-version tags (vLLM reports them per token span), for every
    batch after the inference restart: every rollout carries them, and none was sampled by
    older weights than the orchestrator's clock said its replica served. So the restarted
    replica generated nothing before it was brought to the current policy."""
    batches = [r for step, r in run.batches().items() if step > after]
    assert batches, "no batch after the inference restart"
    for record in batches:
        assert record.get("off_policy/served_rollouts") == record["rollouts"] - record["errored_rollouts"], record
        assert record["off_policy/served_behind_clock"] == 0, f"step {record['step']} had rollouts from stale weights"
        assert record["off_policy/served_lag/max"] <= 2, record  # max_off_policy_steps


def _assert_no_step_lost_to_the_kill(run: Run, killed_at: int) -> None:
    """Every batch so far was full (`batch_size` rollouts, samples to train on: a lost replica
    never becomes a step on nothing), none of the kill's rollouts errored, and some were
    re-issued, so the kill landed mid-flight."""
    batches = run.batches()
    assert sorted(batches) == list(range(1, max(batches) + 1)), f"a step without a batch: {sorted(batches)}"
    for record in batches.values():
        assert record["rollouts"] >= BATCH_SIZE and record["samples/trained"] >= 1, record
    window = [batches[s] for s in sorted(batches) if s > killed_at]
    assert all(r["errored_rollouts"] == 0 for r in window), [(r["step"], r["errored_rollouts"]) for r in window]
    assert sum(r["rollouts/reissued"] for r in window) > 0, "no rollout was in flight on the killed replica"

