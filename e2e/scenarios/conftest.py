"""The cluster the scenarios run on, once for all of them.

- `RLKUBE_E2E_KUBECONFIG=<path>`: a real cluster (kind: e2e/run.sh) with the operator installed
  and the runtime image loaded; scenarios run in `$RLKUBE_E2E_NAMESPACE` (default rlkube-e2e).
- otherwise the local cluster (e2e/localcluster), where the operator runs as pods too, from the
  same Helm chart with the same values (`e2e/operator-values.yaml`). It needs
  root with network namespaces and kubectl; without them every scenario skips with the reason
  (fails under `CI=true`: `tests.fixtures.prerequisites.require`). `RLKUBE_E2E_IMAGES=podman`:
  every pod runs from its image in podman's store (built by `make images`; `.ci/run` builds them
  and sets it); by default the project's virtualenv stands in for the images.
"""

import os
from pathlib import Path

import pytest

from e2e.scenarios.harness import KubeCluster, LocalCluster, kubectl_missing
from e2e.scenarios.manifests import operator_manifests
from tests.fixtures.prerequisites import require

NAMESPACE = os.environ.get("RLKUBE_E2E_NAMESPACE", "rlkube-e2e")


def _local_unavailable() -> str | None:
    from e2e.localcluster.network import unavailable_reason

    return kubectl_missing() or unavailable_reason()


@pytest.fixture(scope="package")  # torn down after the last scenario, whatever runs next
def cluster(tmp_path_factory):
    if kubeconfig := os.environ.get("RLKUBE_E2E_KUBECONFIG"):
        yield KubeCluster(Path(kubeconfig), NAMESPACE)
        return
    if reason := _local_unavailable():
        require(f"the local cluster cannot run here: {reason}")
    images = os.environ.get("RLKUBE_E2E_IMAGES", "venv")
    local = LocalCluster(tmp_path_factory.mktemp("localcluster"), NAMESPACE, images=images).start()
    try:
        local.apply(*operator_manifests(local))
        local.operator_leader()
        yield local
    finally:
        local.stop()
