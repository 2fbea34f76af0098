"""The judge example on a cluster (examples/reverse_text/judge-rlrun.yaml, shortened, from the
tiny untrained model): the run's judge served by its own StatefulSet (`<run>-judge`, one
replica), its pod killed mid-run (deleted at once, `--grace-period=0 --force`, as a crash or a
lost node does; its StatefulSet makes a new one).

A killed judge must cost no step: a rollout whose judge does not answer waits for it (the
orchestrator's loopback judge endpoint retries for `judge.wait_s`) or is re-issued past that,
never scored without it (docs/training.md, "A served judge"). Asserted:

- the judge pod was replaced (a new uid) and is Ready again; the trainer's gang never restarted;
- the trainer trained every step 1..max_steps once: none lost, skipped or redone;
- every step's batch is at least `batch_size` rollouts, none errored, and all of them trained
  (`samples/trained` = `rollouts`: zero-advantage samples are kept here, so a rollout failed by
  the missing judge would show as a short batch; a batch takes one group more when stale
  rollouts were dropped from it);
- every rollout's reward is the judge's verdict: this judge answers only "yes" (vLLM's
  structured outputs, a choice of one label), so a rollout with a reply scored without its judge
  shows as 0.0 (an empty reply scores 0.0 without a call, as verifiers' reference judge does);
- the judge was called while it was down (`judge/errors` after the kill: the kill landed while
  rollouts were being scored) and answered again once back: calls scored every batch made after
  its new pod was Ready, counted per batch from the batch's own samples (`judge_calls`: one per
  rollout with a reply). Not from `judge/requests`, which counts the calls made between two
  logged steps whichever batch their rollouts went into: a batch whose rollouts were all scored
  before the previous step was logged shows 0 there.

Printed: per step the reward, samples trained, rollouts errored and re-issued, judge requests
(as logged) and errors, and the judge calls that scored the batch; the step the judge was killed
at and its downtime (the kill to the new pod Ready).

Marked `extended`: minutes beyond the per-change gate, so `make test` deselects it;
`make e2e-extended` runs it (e2e/README.md).
"""

import time

import pytest

from e2e.scenarios.manifests import claim, short_rl
from e2e.scenarios.runs import Run
from tests.orchestrator.test_judge_vllm import judge_calls, replied

pytestmark = [pytest.mark.slow, pytest.mark.extended]

NAME = "judged"
CLAIM = "judged-data"
MAX_STEPS = 8
KILLED_AFTER = 2  # trainer steps: the judge is killed once the trainer has trained this many
BATCH_SIZE = 32  # judge-rlrun.yaml's, 4 groups of 8
VERDICT = "yes"
COLUMNS = ("reward/all/mean", "samples/trained", "rollouts", "errored_rollouts", "rollouts/reissued",
           "judge/requests", "judge/errors")


def judged_run(model: str) -> dict:
    """judge-rlrun.yaml on the scenario's claim, `model` as the policy and the judge, the judge's
    verdict fixed, every sample kept and logged."""
    run = short_rl(NAME, model, CLAIM, MAX_STEPS, manifest="judge-rlrun.yaml", **{
        "ckpt.interval": MAX_STEPS, "orchestrator.batch_size": BATCH_SIZE,
        "orchestrator.filter_zero_advantage": False, "orchestrator.samples_interval": 1,
    })
    judge = run["spec"]["judge"]
    judge["model"]["name"] = model
    judge["sampling"] |= {"temperature": 0.0, "structured_outputs": {"choice": [VERDICT]}}
    return run


@pytest.mark.timeout(1500)
def test_a_judge_killed_mid_run_costs_no_step(cluster, record_property):
    started = time.monotonic()
    cluster.apply(claim(CLAIM))
    cluster.apply(judged_run(cluster.seed_model(CLAIM)))
    run = Run(cluster, NAME, CLAIM)

    run.wait_trained(KILLED_AFTER, 900)
    judge = run.pod("judge")
    uid, restarts = cluster.get("pod", judge)["metadata"]["uid"], run.status().get("restarts", 0)
    killed_at, killed = max(run.trainer_steps()), time.monotonic()
    cluster.delete("pod", judge, "--grace-period=0", "--force", "--wait=false")
    cluster.wait(lambda: (cluster.get("pod", judge) or {}).get("metadata", {}).get("uid") not in (None, uid)
                 and cluster.ready(judge), 600, f"judge pod {judge} to be replaced and Ready", interval=0.5)
    downtime, back_at = time.monotonic() - killed, max(run.trainer_steps())
    cluster.wait_phase("rlrun", NAME, {"Succeeded"}, 900)

    batches = run.batches()
    steps = run.trainer_steps()
    samples = {s: run.samples(s) for s in steps}
    calls = {s: judge_calls(rows) for s, rows in samples.items()}
    print(f"\njudge pod {judge} killed after step {killed_at}, Ready again {downtime:.1f} s later (trainer at "
          f"step {back_at}); whole scenario {time.monotonic() - started:.0f} s")
    print("step  " + "  ".join(COLUMNS) + "  judge calls")
    for step, record in sorted(batches.items()):
        print(f"{step:>4}  " + "  ".join(f"{record.get(c, float('nan')):>{len(c)}g}" for c in COLUMNS)
              + f"  {calls.get(step, 0):>11}")
    record_property("judge killed after step", killed_at)
    record_property("judge downtime, kill to new pod Ready (s)", round(downtime, 1))
    record_property("per step (samples trained, reward, judge calls that scored the batch)",
                    {s: (r["samples/trained"], round(r["reward/all/mean"], 3), calls.get(s))
                     for s, r in sorted(batches.items())})

    assert steps == list(range(1, MAX_STEPS + 1)), \
        f"the trainer trained steps {steps}, not 1..{MAX_STEPS} once each (judge killed after step {killed_at})"
    assert run.status().get("restarts", 0) == restarts, f"the judge's kill restarted the trainer's gang: {run.status()}"
    assert sorted(batches) == steps, f"the orchestrator logged batches for steps {sorted(batches)}"
    # A batch may hold more than `batch_size` (a group is taken whole when stale ones were dropped), never fewer.
    short = {s: {c: r[c] for c in ("rollouts", "errored_rollouts", "samples/trained")} for s, r in batches.items()
             if r["errored_rollouts"] or not r["samples/trained"] == r["rollouts"] >= BATCH_SIZE}
    assert not short, (f"steps not trained on a full batch of {BATCH_SIZE} scored rollouts (judge killed after step "
                       f"{killed_at}, back at {back_at}): {short}")
    unjudged = {s: [(row["reward"], row["error"], row["completion"][:40]) for row in rows
                    if row["error"] or row["reward"] != (1.0 if replied(row) else 0.0)] for s, rows in samples.items()}
    unjudged = {s: rows for s, rows in unjudged.items() if rows}
    assert not unjudged, (f"rollouts not scored the judge's verdict ({VERDICT!r}: 1.0 for a reply, 0.0 for an empty "
                          f"one), by step as (reward, error, reply): {unjudged}; judge killed after step "
                          f"{killed_at}, back at {back_at}")
    while_down = {s: r["judge/errors"] for s, r in batches.items() if s > killed_at}
    assert sum(while_down.values()) > 0, \
        f"no judge call failed after the kill (judge/errors by step {while_down}): it did not land mid-run"
    after = {s: calls[s] for s in steps if s > back_at + 1}
    assert after and all(after.values()), \
        f"the judge scored no rollout of some batch made after it was back (its calls by step, from the samples: {after})"
    cluster.delete("rlrun", NAME)
