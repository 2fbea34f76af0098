"""What the operator costs the API server (issue 11, item 3), counted from the requests the kmock
emulator served: a run that nothing happens to costs reads only on its resync, a finished run
costs nothing, events of the children, not the resync, make the operator react, and an
operator started before its CRDs waits for them."""

import asyncio

import kopf
import pytest
from rlkube_operator.kube import Kube, api_client
from rlkube_operator.main import crds_served

from tests.operator.embedded import WRITES, operator_requests, quiet, served, verbs
from tests.operator.test_operator_kmock import rlrun, start_everything

RESYNC = 0.3
SLOW = 3600.0  # a resync that never comes within a test


async def requests_over_resyncs(cluster, resyncs: int = 3):
    """The operator's requests until it has passed `resyncs` times (each pass reads the run's
    ConfigMap first): counted, not timed, so a slow machine only makes the test longer."""
    mark = served(cluster.server)
    await cluster.until(lambda: operator_requests(cluster.server, mark)["get", "configmaps"] >= resyncs,
                        what=f"{resyncs} resyncs")
    return operator_requests(cluster.server, mark)


@pytest.mark.parametrize("registry_options", [{"interval": RESYNC, "progress_interval": 0.0}])
async def test_a_steady_run_writes_nothing_over_several_resyncs(cluster, orchestrator_status):
    orchestrator_status.body |= {"phase": "training", "step": 3}
    await cluster.create(rlrun())
    await start_everything(cluster)
    await cluster.until(lambda: cluster.status("RLRun", "rt").get("step") == 3, what="progress")
    # kopf posts events in the background: the phase's own may come a little after the status.
    await cluster.until(lambda: any(e.get("reason") == "Running" for e in cluster.events()), what="event")

    counts = await requests_over_resyncs(cluster)
    assert verbs(counts, WRITES) == 0, f"a steady run was written to: {counts}"


@pytest.mark.parametrize("registry_options", [{"interval": RESYNC, "progress_interval": 0.0}])
async def test_a_finished_run_costs_no_requests(cluster):
    await cluster.create(rlrun())
    await start_everything(cluster)
    await cluster.patch("Job", "rt-trainer-0", {"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
    await cluster.until(lambda: cluster.status("RLRun", "rt").get("phase") == "Succeeded"
                        and not cluster.names("Deployment") and not cluster.names("StatefulSet"), what="teardown")
    await quiet(cluster)  # the passes woken by the teardown's own deletions

    mark = served(cluster.server)
    await asyncio.sleep(10 * RESYNC)  # a live run would have passed several times
    counts = operator_requests(cluster.server, mark)
    assert verbs(counts, ("get", "list", *WRITES)) == 0, f"a finished run still costs requests: {counts}"


@pytest.mark.parametrize("registry_options", [{"interval": SLOW, "progress_interval": 0.0}])
async def test_a_deleted_child_is_recreated_on_its_event_not_on_the_resync(cluster):
    await cluster.create(rlrun())
    await start_everything(cluster)  # Running: pod events woke the run, the resync never came
    old_uid = cluster.get("Deployment", "rt-orchestrator")["metadata"]["uid"]

    await cluster.delete("Deployment", "rt-orchestrator")
    recreated = await cluster.until(lambda: cluster.get("Deployment", "rt-orchestrator"), what="recreated")
    assert recreated["metadata"]["uid"] != old_uid


@pytest.mark.parametrize("registry_options", [{"interval": RESYNC, "progress_interval": SLOW}])
async def test_progress_alone_waits_while_a_phase_change_is_written_at_once(cluster, orchestrator_status):
    orchestrator_status.body |= {"phase": "training", "step": 3}
    await cluster.create(rlrun())
    await start_everything(cluster)  # the first Running write carries step 3
    await cluster.until(lambda: cluster.status("RLRun", "rt").get("step") == 3, what="progress")

    orchestrator_status.body |= {"step": 4}
    counts = await requests_over_resyncs(cluster)
    assert cluster.status("RLRun", "rt")["step"] == 3 and counts["patch", "rlruns/status"] == 0

    # The inference pod loses readiness: Degraded is written at once, with the step it has.
    await cluster.patch("Pod", "rt-inference-0", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    status = await cluster.until(lambda: cluster.status("RLRun", "rt")["message"].startswith("degraded")
                                 and cluster.status("RLRun", "rt"), what="degraded")
    assert status["step"] == 4


async def test_the_operator_starts_only_once_its_crds_are_served(kmock):
    """kopf reads the served resources once, after the startup handlers: a start before the
    CRDs are installed waits for them instead of never watching a run."""
    kube = Kube(api_client(str(kmock.url).rstrip("/")))
    crds = {key: kind for key, kind in kmock.kinds.items() if kind.group == "rlkube.dev"}
    for key in crds:
        del kmock.kinds[key]
    with pytest.raises(kopf.TemporaryError, match=r"rlruns.rlkube.dev/v1alpha1, sftruns.rlkube.dev/v1alpha1"):
        await asyncio.to_thread(crds_served, kube)
    kmock.kinds |= crds  # the CRDs installed
    await asyncio.to_thread(crds_served, kube)
