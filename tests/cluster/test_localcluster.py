"""`python -m e2e.localcluster up` as a whole: API server, controllers and kubelet together, driven
with kubectl; pods reach the API server at the bridge address; SIGTERM leaves nothing behind."""

import json
import subprocess

from e2e.localcluster.network import RECORDS, unavailable_reason
from e2e.scenarios.harness import LocalCluster, kubectl_missing
from tests.fixtures.prerequisites import require

# Each pod reads its own Job through the API server, from inside its network namespace.
READ_JOB = """
import json, os, urllib.request
job = json.load(urllib.request.urlopen(os.environ["API"] + "/apis/batch/v1/namespaces/demo/jobs/ask"))
print("index", os.environ["JOB_COMPLETION_INDEX"], "host", os.uname().nodename, "job", job["metadata"]["uid"])
"""


def test_up_runs_pods_that_reach_the_api_and_stops_cleanly(tmp_path):
    require(unavailable_reason() or kubectl_missing())
    cluster = LocalCluster(tmp_path, "demo").start()
    try:
        info = cluster.info
        record = next(r.stem for r in RECORDS.glob("*.json") if json.loads(r.read_text())["pid"] == cluster.process.pid)
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "ask"}, "spec": {
            "completionMode": "Indexed", "completions": 2, "parallelism": 2, "backoffLimit": 0,
            "template": {"spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": "ignored", "command": ["python", "-c", READ_JOB],
                "env": [{"name": "API", "value": f"http://{info['host_ip']}:{info['port']}"}]}]}}}}
        cluster.apply(job)
        cluster.wait(lambda: "Complete" in cluster.kubectl("get", "job", "ask", "-o", "jsonpath={.status.conditions[*].type}"),
                     90, "job ask to complete", interval=0.5)
        uid = cluster.kubectl("get", "job", "ask", "-o", "jsonpath={.metadata.uid}")
        logs = sorted(cluster.kubectl("logs", "-l", "job-name=ask").split("\n"))
        assert [line for line in logs if line] == [f"index 0 host ask-0 job {uid}", f"index 1 host ask-1 job {uid}"]
        assert "Completed" in cluster.kubectl("get", "pods")
    finally:
        cluster.stop()
    assert cluster.process.returncode == 0, (tmp_path / "cluster.log").read_text()[-3000:]
    assert not (RECORDS / f"{record}.json").exists()
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert f"rlk-{record}-" not in netns
