"""The operator's reach with `watch.allNamespaces`: its ClusterRole creates workloads in every
namespace, so runs in the system namespaces and the operator's own are left alone unless the
admin lists them (`watch.allowedSystemNamespaces`). The real operator, on the API emulator,
watching a team's namespace and kube-system."""

import pytest
from rlkube_operator.main import ignored_namespaces, parse_args

from tests.operator.cluster import NS
from tests.operator.embedded import quiet, running_operator
from tests.operator.test_helm import operator_args
from tests.operator.test_operator_kmock import rlrun

CLUSTER_WIDE = {"watch": {"allNamespaces": True}}
CHILD_KINDS = ("ConfigMap", "Secret", "Service", "StatefulSet", "Deployment", "Job", "PersistentVolumeClaim")


@pytest.mark.parametrize(("values", "ignored"), [
    ({}, set()),
    ({"watch": {"namespaces": ["kube-system"]}}, set()),  # listed by name: the admin's choice
    (CLUSTER_WIDE, {"kube-system", "kube-public", "kube-node-lease", "rlkube-system"}),
    # the release namespace (rlkube-system, the token key's) may not be listed: test_helm
    ({"watch": {"allNamespaces": True, "allowedSystemNamespaces": ["kube-public", "kube-node-lease"]}},
     {"kube-system", "rlkube-system"}),
], ids=["one-namespace", "kube-system-listed", "cluster-wide", "cluster-wide-allowing-two"])
def test_the_chart_leaves_the_system_namespaces_out_when_watching_every_namespace(values, ignored):
    assert ignored_namespaces(parse_args(operator_args(values))) == ignored


async def test_a_run_in_an_ignored_namespace_gets_nothing_while_a_teams_run_starts(kmock, orchestrator_status,
                                                                                   operator_settings):
    ignored = ignored_namespaces(parse_args(operator_args(CLUSTER_WIDE)))
    async with running_operator(kmock, orchestrator_status.url, settings=operator_settings, namespaces=(NS, "kube-system"),
                                ignored=ignored, interval=60, progress_interval=0.0) as cluster:
        await cluster.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system"}})
        system_run = rlrun("sys")
        system_run["metadata"]["namespace"] = "kube-system"
        await cluster.create(system_run)
        await cluster.create(rlrun())
        await cluster.until(lambda: cluster.get("Job", "rt-trainer-0"), what="the team's run realized")
        await quiet(cluster)
        assert {kind: [o["metadata"]["name"] for o in kmock.read_all(cluster.kind(kind), "kube-system")]
                for kind in CHILD_KINDS} == {kind: [] for kind in CHILD_KINDS}
        stored = kmock.read(cluster.kind("RLRun"), "kube-system", "sys")
        assert not stored["metadata"].get("finalizers") and not stored.get("status")
