#!/usr/bin/env bash
# End-to-end on a kind cluster: build and load the images, install the chart, then run the same
# scenario files `make e2e-local` and `make e2e-extended` run on the local cluster (e2e/scenarios:
# reverse-text SFT then RL, healing from faults, giving up, a judge killed mid-run) against kind.
#
#   e2e/run.sh                       # needs docker (running), kind, kubectl; helm optional
#   e2e/run.sh -k reverse_text       # extra arguments go to pytest
#   KEEP_CLUSTER=1 e2e/run.sh        # leave the cluster up afterwards
#
# Exit status 0 means every scenario passed; the last line is pytest's summary. The operator is
# installed by the Helm chart with e2e/operator-values.yaml (2 replicas electing a leader), as the
# local scenarios install it. The object-store scenario needs a bucket the cluster reaches and
# skips on kind.
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER=${CLUSTER:-rlkube-e2e}
NS=${NS:-rlkube-e2e}
PY=${PY:-.venv/bin/python}  # the project's venv (make install): pytest, helm-python-sdk
TAG=0.1.0
OPERATOR_IMAGE=ghcr.io/rlkube/rlkube-operator:$TAG
RUNTIME_IMAGE=ghcr.io/rlkube/rlkube-runtime-cpu:$TAG
VALUES=e2e/operator-values.yaml

for tool in docker kind kubectl "$PY"; do
  command -v "$tool" >/dev/null || { echo "e2e: $tool not found" >&2; exit 2; }
done
docker info >/dev/null 2>&1 || { echo "e2e: the Docker daemon is not reachable" >&2; exit 2; }

cleanup() { [[ -n "${KEEP_CLUSTER:-}" ]] || kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true; }
trap cleanup EXIT

kind get clusters | grep -qx "$CLUSTER" || kind create cluster --name "$CLUSTER" --config e2e/kind-config.yaml --wait 120s
# Everything below talks to this cluster, whatever the current context was.
kubectl config use-context "kind-$CLUSTER"
ENGINE=docker IMAGE_REGISTRY=ghcr.io/rlkube TAG=$TAG bash images/build.sh operator runtime-cpu
kind load docker-image --name "$CLUSTER" "$OPERATOR_IMAGE" "$RUNTIME_IMAGE"

kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f -
if command -v helm >/dev/null; then
  helm upgrade --install rlkube helm/rlkube -n "$NS" -f "$VALUES" --kube-context "kind-$CLUSTER" --wait
else  # the same chart and values, rendered by Helm's Go SDK (helm-python-sdk)
  "$PY" -c "
import sys, yaml, helm_python as helm
values = yaml.safe_load(open('$VALUES'))
out = helm.Chart.load('helm/rlkube').render(values, name='rlkube', namespace='$NS', is_install=True)
sys.stdout.write('\n---\n'.join(t for p, t in sorted(out.items()) if p.endswith('.yaml')))
" | kubectl apply -n "$NS" -f -
  kubectl -n "$NS" rollout status deploy/rlkube-rlkube-operator --timeout=180s
fi

export RLKUBE_E2E_KUBECONFIG=${KUBECONFIG:-$HOME/.kube/config} RLKUBE_E2E_NAMESPACE=$NS
"$PY" -m pytest -ra -s -p no:cacheprovider e2e/scenarios "$@"
