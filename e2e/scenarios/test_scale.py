"""`kubectl scale rlrun/NAME --replicas N` during a run: inference 1 → 2 → 1 while it trains.

The RLRun's scale subresource sizes `spec.inference.replicas`; the operator resizes the
inference StatefulSet and the replica list the orchestrator reads again (`inference_urls` in the
run's ConfigMap), and touches neither the trainer nor the orchestrator. Asserted:

- the trainer never restarts: the same pod (uid), no container restart, `status.restarts` 0;
- the new replica serves rollouts (`rollouts/on_joined_replicas`: counted by the orchestrator,
  which routes to a new replica only once it serves the current policy), and every trained
  sample's policy is within `max_off_policy_steps` by the engine's own weight-version tags;
- no rollout lost or duplicated: every step trained once, each on a full batch, none errored
  (rollouts in flight on the removed replica are re-issued: `rollouts/reissued`);
- `status.inference` (and `kubectl get`'s INFERENCE column) shows ready/desired.

The timeline (seconds from each `kubectl scale` to the new replica Ready, to its first trained
rollout, and to the removed pod gone; rollouts re-issued) is recorded (the "figures" section of
the run's summary prints it). The run is deleted once it is proven, not trained to its end.
"""

import time

import pytest

from e2e.scenarios.manifests import claim, short_rl
from e2e.scenarios.runs import Run

pytestmark = pytest.mark.slow

NAME = "scale"
CLAIM = "scale-data"
BATCH_SIZE = 64  # short_rl's
MAX_OFF_POLICY = 2  # rlrun.yaml's


@pytest.mark.timeout(1800)
def test_kubectl_scale_resizes_inference_mid_run_without_restarting_the_trainer(cluster, record_property):
    cluster.apply(claim(CLAIM))
    model = cluster.seed_model(CLAIM)
    cluster.apply(short_rl(NAME, model, CLAIM, 500, **{"ckpt.interval": 100}))
    run = Run(cluster, NAME, CLAIM)
    run.wait_step(2, 900)
    trainer = cluster.get("pod", run.pod("trainer"))
    timeline: dict[str, float] = {}

    # Scale up: the second replica joins once it serves the current policy.
    started = time.monotonic()
    assert "scaled" in cluster.kubectl("scale", "rlrun", NAME, "--replicas=2")
    cluster.wait(lambda: _inference(run).get("ready") == "2/2", 600, "2/2 inference replicas ready")
    timeline["scale-up: replica Ready"] = time.monotonic() - started
    assert _column(cluster, "INFERENCE") == "2/2"
    cluster.wait(lambda: _sum(run, "rollouts/on_joined_replicas") > 0, 600, "a trained rollout from the new replica")
    timeline["scale-up: first trained rollout on it"] = time.monotonic() - started
    run.wait_step(max(run.trainer_steps()) + 2, 600)  # two steps on both replicas

    # Scale down: the removed replica drains; its rollouts in flight are re-issued.
    before = max(run.trainer_steps())
    started = time.monotonic()
    assert "scaled" in cluster.kubectl("scale", "rlrun", NAME, "--replicas=1")
    cluster.wait(lambda: len(cluster.names("pods", f"rlkube.dev/run={NAME},app.kubernetes.io/component=inference"))
                 == 1, 300, "the removed inference pod to go")
    timeline["scale-down: pod gone"] = time.monotonic() - started
    run.wait_step(before + 3, 600)
    cluster.wait(lambda: _inference(run).get("ready") == "1/1", 120, "1/1 inference replicas ready")
    reissued = sum(r.get("rollouts/reissued", 0) for r in run.batches().values() if r["step"] > before)

    # The trainer was never restarted.
    now = cluster.get("pod", run.pod("trainer"))
    assert now["metadata"]["uid"] == trainer["metadata"]["uid"], "the trainer pod was replaced"
    assert all(c.get("restartCount", 0) == 0 for c in now["status"].get("containerStatuses") or [])
    assert run.status()["restarts"] == 0 and run.status()["phase"] == "Running"

    # Every step trained once, on a full batch of on-policy-enough samples, nothing errored.
    steps = run.trainer_steps()
    assert steps == list(range(1, len(steps) + 1)), f"a step trained twice or skipped: {steps}"
    batches = run.batches()
    assert sorted(batches) == list(range(1, max(batches) + 1)), f"a step without a batch: {sorted(batches)}"
    for record in batches.values():
        assert record["rollouts"] >= BATCH_SIZE and record["errored_rollouts"] == 0, record
        assert record["off_policy/served_behind_clock"] == 0, record
        assert record["off_policy/served_lag/max"] <= MAX_OFF_POLICY, record
    replicas = [r["inference/replicas"] for r in batches.values()]
    assert max(replicas) == 2 and replicas[-1] == 1, replicas
    by_size = {n: [r["time/batch"] for r in batches.values() if r["inference/replicas"] == n] for n in (1, 2)}
    record_property("seconds per batch by replicas routed to",
                    {n: round(sum(t) / len(t), 1) for n, t in by_size.items() if t})
    record_property("timeline (s)", {k: round(v, 1) for k, v in timeline.items()})
    record_property("rollouts re-issued after the scale-down", reissued)
    record_property("rollouts served by the new replica", _sum(run, "rollouts/on_joined_replicas"))
    cluster.delete("rlrun", NAME)


def _inference(run: Run) -> dict:
    return run.status().get("inference") or {}


def _sum(run: Run, metric: str) -> float:
    return sum(r.get(metric, 0) for r in run.batches().values())


def _column(cluster, name: str) -> str:
    header, row = cluster.kubectl("get", "rlrun", NAME).splitlines()[:2]
    return dict(zip(header.split(), row.split()))[name]
