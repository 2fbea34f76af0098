"""Cluster DNS of a run's trainer master across a gang restart, as the local cluster resolves it
(the operator's own manifests, Jobs whose pods the emulated Job controller makes)."""

from rlkube_operator import builders
from rlkube_operator.names import RunRef
from rlkube_operator.reconcile import WORKLOADS

from e2e.localcluster.network import Endpoint, hosts_file
from tests.cluster.test_apiserver import rlrun, rlrun_path


def test_a_new_trainer_gang_never_resolves_the_old_master(local_api, ns):
    """The old gang's pod 0, still in its grace period, stays published by the master Service
    (headless, `publishNotReadyAddresses`): the Service selects the current attempt's pod 0 only,
    so the new gang's torchrun never dials the old rendezvous."""
    created = local_api.create(rlrun_path(ns), rlrun("r"))
    run = RunRef("RLRun", "r", ns, created["metadata"]["uid"])
    workload = WORKLOADS["RLRun"]
    spec = workload.spec_model.model_validate(created["spec"])
    for attempt in (0, 1):
        job = builders.build_trainer_job(run, spec, module=workload.module, config_file=workload.config_file,
                                         attempt=attempt, restarts=attempt, suspend=False)
        local_api.create(f"/apis/batch/v1/namespaces/{ns}/jobs", job)
    pods = local_api.until(lambda: len(found := local_api.items(f"/api/v1/namespaces/{ns}/pods")) == 2 and found,
                           "a pod of each trainer Job")
    old, new = sorted(pods, key=lambda p: p["metadata"]["name"])
    endpoints = [Endpoint(old, "10.0.0.2", ready=False), Endpoint(new, "10.0.0.3", ready=False)]  # terminating, starting

    master = builders.build_trainer_master_service(run, spec, attempt=1) | {"metadata": {"name": "r-trainer-master",
                                                                                          "namespace": ns}}
    hosts = hosts_file(endpoints[1], endpoints, [master])
    resolved = [line.split("\t")[0] for line in hosts.splitlines() if line.endswith(f"r-trainer-master.{ns}.svc.cluster.local")]
    assert resolved == ["10.0.0.3"], hosts
