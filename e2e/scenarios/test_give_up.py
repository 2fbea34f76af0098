"""A run that can never start gives up at once, saying why: an RLRun whose model directory does
not exist. Its components exit with code 2 (the runtime's config check, before any model is
loaded), so the run is Failed without a gang restart, with the runtime's error in its `Failed`
condition and Warning event, and nothing of it keeps running."""

import json
import time

import pytest

from e2e.scenarios.manifests import claim, short_rl

pytestmark = pytest.mark.slow

NAME = "doomed"
CLAIM = "doomed-data"
ABSENT = "/data/models/absent"


def test_a_missing_model_fails_the_run_at_once_with_the_runtimes_error(cluster, record_property):
    run = short_rl(NAME, ABSENT, CLAIM, 10)
    run["spec"]["restartPolicy"] = {"backoffLimit": 3}
    applied = time.monotonic()
    cluster.apply(claim(CLAIM), run)

    def failed():
        status = cluster.status("rlrun", NAME)
        return status if status.get("phase") == "Failed" else None

    status = cluster.wait(failed, 300, f"rlrun/{NAME} Failed", interval=0.25)
    record_property("apply -> Failed (s)", round(time.monotonic() - applied, 1))
    condition = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert condition["reason"] == "InvalidConfig", condition
    assert "exited with code 2" in condition["message"], condition
    assert f"model.name: '{ABSENT}' does not exist" in condition["message"], condition
    assert status["restarts"] == 0 and cluster.names("job", f"rlkube.dev/run={NAME}") == [f"{NAME}-trainer-0"]
    events = json.loads(cluster.kubectl("get", "events", "--field-selector",
                                        f"involvedObject.name={NAME},reason=Failed", "-o", "json"))["items"]
    assert any(f"model.name: '{ABSENT}' does not exist" in e["message"] for e in events), events

    def nothing_running():
        pods = json.loads(cluster.kubectl("get", "pods", "-l", f"rlkube.dev/run={NAME}", "-o", "json"))["items"]
        return not [p for p in pods if p.get("status", {}).get("phase") in ("Pending", "Running")]

    cluster.wait(nothing_running, 60, "a failed run keeps nothing running")
    cluster.delete("rlrun", NAME)
