"""A run whose trainer can never start: the gang is restarted `backoffLimit` times, then the run
is Failed with a reason that names the failing component, and nothing of it runs."""

import json

import pytest

from e2e.scenarios.manifests import claim, short_sft

pytestmark = pytest.mark.slow

NAME = "doomed"
CLAIM = "doomed-data"


def test_backoff_limit_exhausted_fails_naming_the_component(cluster):
    _, run = short_sft("/data/models/absent", CLAIM, 10)
    run["metadata"]["name"] = NAME
    run["spec"]["restartPolicy"] = {"backoffLimit": 1}
    cluster.apply(claim(CLAIM), run)

    status = cluster.wait_phase("sftrun", NAME, {"Failed"}, 600)
    assert status["restarts"] == 1
    assert "BackoffLimitExceeded" in status["message"] and "trainer" in status["message"], status["message"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False"
    pods = json.loads(cluster.kubectl("get", "pods", "-l", f"rlkube.dev/run={NAME}", "-o", "json"))["items"]
    running = [p["metadata"]["name"] for p in pods if p.get("status", {}).get("phase") in ("Pending", "Running")]
    assert not running, f"a failed run keeps nothing running: {running}"
    cluster.delete("sftrun", NAME)
