"""End-to-end on a kind cluster (e2e/run.sh): the cluster scenarios on kind. Where Docker and kind
are missing (the development machine), run.sh's control flow is still checked, with stub
`kind`/`docker`/`kubectl`/`helm`/python that record their calls."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "e2e" / "run.sh"
REPO = SCRIPT.parents[1]
OPERATOR_IMAGE, RUNTIME_IMAGE = "ghcr.io/rlkube/rlkube-operator:0.1.0", "ghcr.io/rlkube/rlkube-runtime-cpu:0.1.0"


def _missing() -> str | None:
    for tool in ("docker", "kind", "kubectl"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if subprocess.run(["docker", "info"], check=False, capture_output=True).returncode != 0:
        return "the Docker daemon is not reachable"
    return None


@pytest.mark.k8s
def test_the_cluster_scenarios_pass_on_kind():
    if (reason := _missing()) is not None:  # CI machines have no Docker: a skip CI keeps (tests/fixtures/prerequisites.py)
        pytest.skip(f"e2e needs docker, kind and kubectl: {reason}")
    result = subprocess.run(["bash", str(SCRIPT)], check=False, capture_output=True, text=True, timeout=3 * 3600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    summary = result.stdout.strip().splitlines()[-1]  # pytest's: "=== 4 passed in 1234.5s ==="
    assert re.search(r"\b\d+ passed\b", summary) and not re.search(r"failed|error", summary), summary


# --- run.sh's control flow, with stubs ---------------------------------------------------------

STUB = """#!/bin/bash
echo "$(basename "$0") $*" | head -1 >> "$CALLS"  # a script given with -c: its first line
case "$(basename "$0") $1 $2" in
  "kind get clusters") [[ -n "${EXISTING:-}" ]] && echo rlkube-e2e ;;
  "python -m"*) echo "RLKUBE_E2E_KUBECONFIG=$RLKUBE_E2E_KUBECONFIG RLKUBE_E2E_NAMESPACE=$RLKUBE_E2E_NAMESPACE" >> "$CALLS"
               echo "===== 3 passed in 1.00s =====" ;;
  "python -c"*) exec "$REAL_PY" "$@" ;;  # the chart really rendered, as without helm
  "kubectl apply"*) cat > "$CALLS.applied" ;;
esac
"""


def _run(tmp_path: Path, tools: tuple[str, ...], **env) -> tuple[subprocess.CompletedProcess, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in tools:
        (bin_dir / tool).write_text(STUB)
        (bin_dir / tool).chmod(0o755)
    calls = tmp_path / "calls"
    calls.touch()
    environ = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "CALLS": str(calls),
               "PY": str(bin_dir / "python"), "REAL_PY": sys.executable, **env}
    result = subprocess.run(["bash", str(SCRIPT), "-k", "heal"], env=environ, cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, check=False)
    # images/build.sh's pip.conf (a temporary file) and commit tag, which differ from run to run
    calls = [re.sub(r":[0-9a-f]{12}(-dirty)? ", ":COMMIT ", re.sub(r"src=\S+\.pip\.conf", "src=PIP_CONF", c))
             for c in calls.read_text().splitlines()]
    return result, calls


def _before(calls: list[str], first: str, then: str) -> bool:
    return calls.index(first) < calls.index(then)


def test_run_sh_creates_the_cluster_switches_context_then_installs_the_chart_and_runs_the_scenarios(tmp_path):
    result, calls = _run(tmp_path, ("kind", "docker", "kubectl", "helm", "python"),
                         KUBECONFIG=str(tmp_path / "kubeconfig"))
    assert result.returncode == 0, result.stderr
    context = "kubectl config use-context kind-rlkube-e2e"
    helm = ("helm upgrade --install rlkube helm/rlkube -n rlkube-e2e -f e2e/operator-values.yaml "
            "--kube-context kind-rlkube-e2e --wait")
    pytest_call = "python -m pytest -ra -s -p no:cacheprovider e2e/scenarios -k heal"
    expected = [
        "docker info", "kind get clusters",
        "kind create cluster --name rlkube-e2e --config e2e/kind-config.yaml --wait 120s", context,
        *(call for name in ("operator", "runtime-cpu") for call in (  # images/build.sh's
            "docker image inspect python:3.11.7-slim-bookworm",
            (f"docker build --secret id=pip.conf,src=PIP_CONF -f images/{name}.Dockerfile"
             f" -t ghcr.io/rlkube/rlkube-{name}:0.1.0 -t ghcr.io/rlkube/rlkube-{name}:COMMIT ."),
            f"docker image ls --format {{{{.Size}}}} ghcr.io/rlkube/rlkube-{name}:0.1.0")),
        f"kind load docker-image --name rlkube-e2e {OPERATOR_IMAGE} {RUNTIME_IMAGE}",
        "kubectl create namespace rlkube-e2e --dry-run=client -o yaml", "kubectl apply -f -", helm, pytest_call,
        f"RLKUBE_E2E_KUBECONFIG={tmp_path / 'kubeconfig'} RLKUBE_E2E_NAMESPACE=rlkube-e2e",
        "kind delete cluster --name rlkube-e2e",
    ]
    assert sorted(calls) == sorted(expected), calls
    order = [e for e in expected if not e.startswith("kubectl create namespace")]  # a pipe: both at once
    assert [c for c in calls if c in order] == order, calls
    assert result.stdout.strip().splitlines()[-1] == "===== 3 passed in 1.00s ====="


def test_run_sh_without_helm_applies_the_same_chart_and_values_to_an_existing_cluster(tmp_path):
    result, calls = _run(tmp_path, ("kind", "docker", "kubectl", "python"), EXISTING="1", KEEP_CLUSTER="1")
    assert result.returncode == 0, result.stderr
    assert not [c for c in calls if c.startswith(("kind create", "kind delete"))], calls
    render = next(c for c in calls if c.startswith("python -c"))
    assert _before(calls, "kubectl config use-context kind-rlkube-e2e", render)
    assert _before(calls, "kubectl -n rlkube-e2e rollout status deploy/rlkube-rlkube-operator --timeout=180s",
                   "python -m pytest -ra -s -p no:cacheprovider e2e/scenarios -k heal")
    applied = Path(f"{tmp_path / 'calls'}.applied").read_text()
    assert "kind: Deployment" in applied and "--leader-elect" in applied and "replicas: 2" in applied
    assert "--interval=2" in applied and "imagePullPolicy: Never" in applied


def test_run_sh_stops_before_anything_when_docker_is_missing(tmp_path):
    result, calls = _run(tmp_path, ("kind", "kubectl", "python"))
    assert result.returncode == 2 and "docker not found" in result.stderr
    assert calls == []
