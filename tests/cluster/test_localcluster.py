"""`python -m e2e.localcluster up` as a whole: API server, controllers and kubelet together, driven
with kubectl; pods reach the API server at the bridge address; SIGTERM leaves nothing behind."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from e2e.localcluster.network import RECORDS, unavailable_reason
from e2e.scenarios.harness import kubectl_missing, require

REPO = Path(__file__).resolve().parents[2]

# Each pod reads its own Job through the API server, from inside its network namespace.
READ_JOB = """
import json, os, urllib.request
job = json.load(urllib.request.urlopen(os.environ["API"] + "/apis/batch/v1/namespaces/demo/jobs/ask"))
print("index", os.environ["JOB_COMPLETION_INDEX"], "host", os.uname().nodename, "job", job["metadata"]["uid"])
"""


def test_up_runs_pods_that_reach_the_api_and_stops_cleanly(tmp_path):
    require(unavailable_reason() or kubectl_missing())
    with open(tmp_path / "cluster.log", "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "e2e.localcluster", "up", "--state-dir", str(tmp_path),
                                    "--namespace", "demo"], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    env = os.environ | {"KUBECONFIG": str(tmp_path / "kubeconfig")}

    def kubectl(*args: str, input: str | None = None) -> str:
        return subprocess.run(["kubectl", "-n", "demo", *args], input=input, env=env, capture_output=True,
                              text=True, check=True, timeout=60).stdout

    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "cluster.json").exists():
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "cluster.log").read_text()
            time.sleep(0.2)
        cluster = json.loads((tmp_path / "cluster.json").read_text())
        record = next(r.stem for r in RECORDS.glob("*.json") if json.loads(r.read_text())["pid"] == process.pid)
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "ask"}, "spec": {
            "completionMode": "Indexed", "completions": 2, "parallelism": 2, "backoffLimit": 0,
            "template": {"spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": "ignored", "command": ["python", "-c", READ_JOB],
                "env": [{"name": "API", "value": f"http://{cluster['host_ip']}:{cluster['port']}"}]}]}}}}
        kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
        deadline = time.monotonic() + 90
        while "Complete" not in kubectl("get", "job", "ask", "-o", "jsonpath={.status.conditions[*].type}"):
            assert time.monotonic() < deadline, kubectl("get", "pods", "-o", "wide") + kubectl("logs", "-l", "job-name=ask")
            time.sleep(0.5)
        uid = kubectl("get", "job", "ask", "-o", "jsonpath={.metadata.uid}")
        logs = sorted(kubectl("logs", "-l", "job-name=ask").split("\n"))
        assert [line for line in logs if line] == [f"index 0 host ask-0 job {uid}", f"index 1 host ask-1 job {uid}"]
        assert "Completed" in kubectl("get", "pods")
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
    assert process.returncode == 0, (tmp_path / "cluster.log").read_text()[-3000:]
    assert not (RECORDS / f"{record}.json").exists()
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert f"rlk-{record}-" not in netns
