"""`python -m e2e.localcluster up` as a whole: API server, controllers and kubelet together, driven
with kubectl; pods reach the API server at the bridge address; SIGTERM leaves nothing behind."""

import json
import subprocess

from e2e.localcluster.network import RECORDS, unavailable_reason
from e2e.scenarios.harness import LocalCluster, kubectl, kubectl_missing
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


# A StatefulSet's pod: its container's first run exits (the emptyDir keeps a mark), the next stays.
RUN_TWICE = ('if [ -e /scratch/ran ]; then echo "$POD_UID second"; exec sleep 600; fi; '
             'touch /scratch/ran; echo "$POD_UID first"; exit 3')


def test_logs_of_a_restart_and_of_a_recreated_pod_are_kept_apart(tmp_path):
    """`kubectl logs [--previous]` reads the current run of the pod's container or the one before;
    a pod recreated under the same name (a StatefulSet's) starts with no previous run, and the
    failure report (`logs_tail`) keeps every run of both pods."""
    require(unavailable_reason() or kubectl_missing())
    cluster = LocalCluster(tmp_path, "demo").start()
    try:
        container = {"name": "main", "image": "ignored", "command": ["sh", "-c", RUN_TWICE],
                     "env": [{"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}],
                     "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}
        cluster.apply({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "web"}, "spec": {
            "replicas": 1, "serviceName": "web", "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
                "terminationGracePeriodSeconds": 1, "containers": [container],
                "volumes": [{"name": "scratch", "emptyDir": {}}]}}}})

        def uid() -> str | None:
            return ((cluster.get("pod", "web-0") or {}).get("metadata") or {}).get("uid")

        def second_run(predecessor: str | None = None) -> str | None:
            """The uid of pod web-0, not its `predecessor`, once its container's second run logged."""
            now = uid()
            logs = cluster.kubectl("logs", "web-0", check=False) if now not in (None, predecessor) else ""
            return now if logs == f"{now} second\n" else None

        first = cluster.wait(second_run, 90, "web-0's second run", interval=0.5)
        assert cluster.kubectl("logs", "web-0", "--previous") == f"{first} first\n"

        cluster.delete("pod", "web-0", "--wait=false")
        cluster.wait(lambda: uid() not in (None, first), 60, "web-0 recreated")
        no_previous = kubectl(cluster.kubeconfig, "-n", "demo", "logs", "web-0", "--previous", check=False)
        assert 'previous terminated container "main" in pod "web-0" not found' in no_previous.stderr
        second = cluster.wait(lambda: second_run(first), 90, "the new web-0's second run", interval=0.5)
        assert cluster.kubectl("logs", "web-0", "--previous") == f"{second} first\n"
        report = cluster.logs_tail()
        assert all(f"{uid} {run}" in report for uid in (first, second) for run in ("first", "second")), report
    finally:
        cluster.stop()

