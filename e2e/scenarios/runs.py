"""Reading a run the way its user would: status from the API, metrics from its claim."""

import json
import time
from dataclasses import dataclass, field

from rlkube_operator.kube import KINDS

from e2e.scenarios.harness import Cluster

COMPONENTS = ("inference", "orchestrator", "trainer")
RECOVERY_BOUND_S = 180.0
"""The longest a fault's recovery may take. Recoveries here take 10-50 s on a 2-core machine
(pod restart, engine start, resume); a minute or more beyond that is a wait on a deadline (a
weight load stalled 600 s on a trainer that would not publish its step, and passed as healed)."""
CHILD_KINDS = tuple(kind for kind in KINDS if kind != "Event")
"""Every kind the operator writes (its own list of the kinds it touches), pods included."""


@dataclass
class Run:
    cluster: Cluster
    name: str
    claim: str
    kind: str = "rlrun"
    timings: dict[str, float] = field(default_factory=dict)

    def status(self) -> dict:
        return self.cluster.status(self.kind, self.name)

    def step(self) -> int:
        return int(self.status().get("step") or 0)

    def wait_step(self, step: int, timeout: float) -> dict:
        return self.cluster.wait(lambda: self.step() >= step and self.status(), timeout,
                                 f"{self.kind}/{self.name} to reach step {step}")

    def output_dir(self, process: str) -> str:
        """Where `process` writes on the claim: the orchestrator in its own directory, which is
        all of the claim its pod may write (rlkube_operator.wiring.ORCHESTRATOR_DIR)."""
        return f"{self.name}/orchestrator" if process == "orchestrator" else self.name

    def metrics(self, process: str) -> list[dict]:
        text = self.cluster.read_file(self.claim, f"{self.output_dir(process)}/metrics/{process}.jsonl") or ""
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def batches(self) -> dict[int, dict]:
        """The orchestrator's record of each step's batch (`rollouts`, `errored_rollouts`,
        `samples/trained`, ...): the newest where a step was logged twice, after a restart."""
        return {r["step"]: r for r in self.metrics("orchestrator") if "samples/trained" in r}

    def samples(self, step: int) -> list[dict]:
        """The batch of `step` as text, a row per sample (`orchestrator.samples_interval`:
        reward, completion, error of each rollout; rlkube/orchestrator/samples.py)."""
        text = self.cluster.read_file(self.claim, f"{self.output_dir('orchestrator')}/samples/step_{step}.jsonl") or ""
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def trainer_steps(self) -> list[int]:
        return [r["step"] for r in self.metrics("trainer")]

    def rewards(self) -> dict[int, float]:
        """The newest reward logged for each step (a step redone after a restart counts once)."""
        return {r["step"]: r["reward/all/mean"] for r in self.metrics("orchestrator") if "reward/all/mean" in r}

    def pod(self, component: str) -> str:
        pod = self.cluster.wait(
            lambda: self.cluster.pod_of(f"rlkube.dev/run={self.name},app.kubernetes.io/component={component}"),
            120, f"a {component} pod of {self.name}")
        return pod["metadata"]["name"]

    def checkpoints(self, interval: int) -> list[int]:
        """The steps a run resumes from: both the trainer's and the orchestrator's checkpoint
        complete on the claim (every `interval` steps; rlkube/checkpoints.py)."""
        last = max(self.trainer_steps(), default=0)
        return [s for s in range(interval, last + interval + 1, interval)
                if all(self.cluster.read_file(self.claim, f"{self.name}/checkpoints/{part}/step_{s}/COMPLETE")
                       is not None for part in ("trainer", "orchestrator"))]

    def children(self) -> dict[str, list[str]]:
        """The run's objects of every kind the operator makes, by the run's label."""
        selector = f"rlkube.dev/run={self.name}"
        return {kind: self.cluster.names(kind.lower(), selector) for kind in CHILD_KINDS}

    def wait_trained(self, step: int, timeout: float) -> None:
        """Until the trainer's own metrics on the claim show `step`: sooner than `wait_step`,
        which waits for the operator to read the step and write it into the status."""
        self.cluster.wait(lambda: max(self.trainer_steps(), default=0) >= step, timeout,
                          f"{self.name}'s trainer to train step {step}", interval=0.1)

    def recover(self, what: str, action, *, progress: int = 2, timeout: float = 600) -> int:
        """Do `action` at the current step, wait until the run has trained `progress` steps past
        it while Running (or trained past it and Succeeded: a fault near the end), record the
        wall time in `timings[what]`, and fail if it took longer than `RECOVERY_BOUND_S`
        (measured to `timeout`, so the message says how long); returns the step it was done at."""
        at = max(self.trainer_steps(), default=0)
        started = time.monotonic()
        action()

        def recovered() -> bool:
            trained, phase = max(self.trainer_steps(), default=0), self.status().get("phase")
            return (phase == "Running" and trained >= at + progress) or (phase == "Succeeded" and trained > at)

        self.cluster.wait(recovered, timeout, f"{self.name} to train {progress} steps past step {at} after: {what}")
        self.timings[what] = took = time.monotonic() - started
        print(f"recovered from '{what}' (at step {at}) in {took:.1f} s", flush=True)
        assert took <= RECOVERY_BOUND_S, (
            f"recovering from '{what}' took {took:.0f} s, over {RECOVERY_BOUND_S:g} s: only a wait on a deadline "
            f"takes that long (recoveries so far: {self.timings})")
        return at


