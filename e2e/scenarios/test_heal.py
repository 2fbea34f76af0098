"""One RLRun (weights over gRPC from the trainer's stable Service, checkpoints every 4 steps on
its claim) through every fault a cluster deals out, in turn, each followed by recovery:

1. the trainer is SIGKILLed before the first checkpoint → the gang restarts from scratch (no
   crash loop on a missing checkpoint);
2. the trainer is SIGKILLed after a checkpoint → gang restart from the newest complete one, at
   most one checkpoint interval redone;
3. an inference pod's processes are SIGKILLed → it comes back and is brought to the current
   policy before any of its rollouts are trained on (checked on vLLM's own weight-version tags);
   rollouts cut off by the kill run again; the trainer is not restarted;
4. the orchestrator's processes are SIGKILLed → it resumes where it was, the trainer is not
   left waiting;
5. the operator pod is deleted → its replacement carries on: no duplicate children;
6. suspend, then unsuspend → resumes from the checkpoint, never marked Failed;
7. it reaches max_steps and Succeeded; deleting it removes every child.

The wall time of each recovery and the steps redone are printed (pytest -s shows them).
"""

import time

import pytest

from e2e.scenarios.manifests import claim, short_rl
from e2e.scenarios.runs import Run

pytestmark = pytest.mark.slow

NAME = "heal"
CLAIM = "heal-data"
INTERVAL = 4
MAX_STEPS = 36


@pytest.mark.timeout(2400)
def test_a_run_heals_from_every_fault(cluster):
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

    # 1. Before the first checkpoint.
    run.wait_step(1, 600)
    assert not run.status().get("lastCheckpointStep")
    run.recover("trainer killed before the first checkpoint", lambda: cluster.kill(run.pod("trainer")))
    steps = run.trainer_steps()
    assert steps[0] == 1 and steps.count(1) == 2, f"the restarted gang starts from scratch: {steps}"
    assert run.status()["restarts"] >= 1

    # 2. After a checkpoint: resume from it.
    run.wait_step(INTERVAL + 1, 600)
    before = len(run.trainer_steps())
    killed_at = run.recover("trainer killed after a checkpoint", lambda: cluster.kill(run.pod("trainer")))
    redone = [s for s in run.trainer_steps()[before:] if s <= killed_at]
    assert redone and len(redone) <= INTERVAL, f"steps redone after a kill at {killed_at}: {redone}"
    assert run.status()["restarts"] >= 2
    print(f"trainer SIGKILL at step {killed_at}: redid steps {redone}")

    # 3. An inference pod: the run goes on without a gang restart.
    inference_restarts = _restart_count(cluster, run.pod("inference"))
    restarts = run.status()["restarts"]
    killed_at = run.recover("inference pod killed", lambda: cluster.kill(run.pod("inference")), progress=3)
    assert _restart_count(cluster, run.pod("inference")) > inference_restarts
    assert run.status()["restarts"] == restarts, "an inference restart does not restart the trainer"
    _assert_every_sample_from_the_current_policy(run, after=killed_at)

    # 4. The orchestrator.
    run.recover("orchestrator killed", lambda: cluster.kill(run.pod("orchestrator")))

    # 5. The operator.
    operator = cluster.pod_of("app.kubernetes.io/name=rlkube-operator")["metadata"]["name"]
    run.recover("operator pod deleted", lambda: cluster.delete("pod", operator, "--wait=false"))
    children = run.children()
    assert len(children["statefulsets"]) == 1 and len(children["deployments"]) == 1, children
    assert len(children["jobs"]) == 1, f"one trainer Job at a time: {children['jobs']}"

    # 6. Suspend and resume.
    cluster.kubectl("patch", "rlrun", NAME, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    cluster.wait(lambda: run.status().get("phase") == "Suspended"
                 and not cluster.names("pods", f"rlkube.dev/run={NAME}"), 300, "the suspended run's pods to go")
    time.sleep(5)
    assert run.status()["phase"] == "Suspended", run.status()
    run.recover("suspended, then resumed",
                lambda: cluster.kubectl("patch", "rlrun", NAME, "--type=merge", "-p", '{"spec":{"suspend":false}}'))

    # 7. To the end.
    status = cluster.wait_phase("rlrun", NAME, {"Succeeded"}, 1200)
    assert status["step"] == MAX_STEPS
    assert max(run.trainer_steps()) == MAX_STEPS
    print("recovery wall times (s):", {k: round(v, 1) for k, v in run.timings.items()})

    cluster.delete("rlrun", NAME)
    cluster.wait(lambda: not any(run.children().values()), 180, "every child of the deleted run to go")


def _restart_count(cluster, pod: str) -> int:
    statuses = cluster.status("pod", pod).get("containerStatuses") or [{}]
    return int(statuses[0].get("restartCount", 0))


def _assert_every_sample_from_the_current_policy(run: Run, after: int) -> None:
    """By the engine's own weight-version tags (vLLM reports them per token span), for every
    batch after the inference restart: every rollout carries them, and none was sampled by
    older weights than the orchestrator's clock said its replica served. So the restarted
    replica generated nothing before it was brought to the current policy."""
    batches = [r for r in run.metrics("orchestrator") if "samples/trained" in r and r["step"] > after]
    assert batches, "no batch after the inference restart"
    for record in batches:
        assert record.get("off_policy/served_rollouts") == record["rollouts"] - record["errored_rollouts"], record
        assert record["off_policy/served_behind_clock"] == 0, f"step {record['step']} had rollouts from stale weights"
        assert record["off_policy/served_lag/max"] <= 2, record  # max_off_policy_steps
