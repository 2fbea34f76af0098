#!/usr/bin/env bash
# End-to-end on a kind cluster: build and load the images, install the chart, run the
# reverse-text SFTRun then RLRun on CPUs, and check both Succeeded and the RL run reports a reward.
#
#   e2e/run.sh                 # needs docker (running), kind, kubectl; helm optional
#   KEEP_CLUSTER=1 e2e/run.sh  # leave the cluster up afterwards
#
# Exit status 0 means everything passed; the last line is `reward=<value>`.
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER=${CLUSTER:-rlkube-e2e}
NS=${NS:-rlkube-e2e}
TAG=0.1.0
OPERATOR_IMAGE=ghcr.io/rlkube/rlkube-operator:$TAG
RUNTIME_IMAGE=ghcr.io/rlkube/rlkube-runtime-cpu:$TAG
TIMEOUT_SFT=${TIMEOUT_SFT:-1800}
TIMEOUT_RL=${TIMEOUT_RL:-3600}

for tool in docker kind kubectl; do
  command -v "$tool" >/dev/null || { echo "e2e: $tool not found" >&2; exit 2; }
done
docker info >/dev/null 2>&1 || { echo "e2e: the Docker daemon is not reachable" >&2; exit 2; }

cleanup() { [[ -n "${KEEP_CLUSTER:-}" ]] || kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true; }
trap cleanup EXIT

kind get clusters | grep -qx "$CLUSTER" || kind create cluster --name "$CLUSTER" --config e2e/kind-config.yaml --wait 120s
docker build -f images/operator.Dockerfile -t "$OPERATOR_IMAGE" .
docker build -f images/runtime-cpu.Dockerfile -t "$RUNTIME_IMAGE" .
kind load docker-image --name "$CLUSTER" "$OPERATOR_IMAGE" "$RUNTIME_IMAGE"

kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f -
if command -v helm >/dev/null; then
  helm upgrade --install rlkube helm/rlkube -n "$NS" --set image.pullPolicy=Never --wait
else  # the same chart, rendered by Helm's Go SDK (helm-python-sdk)
  python -c "
import helm_python as helm, sys
out = helm.Chart.load('helm/rlkube').render({'image': {'pullPolicy': 'Never'}}, name='rlkube', namespace='$NS', is_install=True)
sys.stdout.write('\n---\n'.join(t for p, t in sorted(out.items()) if p.endswith('.yaml')))
" | kubectl apply -n "$NS" -f -
  kubectl -n "$NS" rollout status deploy/rlkube-rlkube-operator --timeout=180s
fi

wait_for() {  # kind name timeout: until phase is Succeeded (exit 1 on Failed or timeout)
  local kind=$1 name=$2 deadline=$((SECONDS + $3)) phase
  while (( SECONDS < deadline )); do
    phase=$(kubectl -n "$NS" get "$kind" "$name" -o jsonpath='{.status.phase}' 2>/dev/null || true)
    kubectl -n "$NS" get "$kind" "$name" --no-headers 2>/dev/null || true
    [[ "$phase" == Succeeded ]] && return 0
    if [[ "$phase" == Failed ]]; then
      kubectl -n "$NS" describe "$kind" "$name" >&2
      return 1
    fi
    sleep 15
  done
  echo "e2e: $kind/$name did not succeed in $3 s" >&2
  kubectl -n "$NS" describe "$kind" "$name" >&2
  return 1
}

sed "s|ghcr.io/rlkube/rlkube-runtime-cpu:0.1.0|$RUNTIME_IMAGE|" examples/reverse_text/sftrun.yaml | kubectl -n "$NS" apply -f -
wait_for sftrun reverse-text-sft "$TIMEOUT_SFT"
sed "s|ghcr.io/rlkube/rlkube-runtime-cpu:0.1.0|$RUNTIME_IMAGE|" examples/reverse_text/rlrun.yaml | kubectl -n "$NS" apply -f -
wait_for rlrun reverse-text "$TIMEOUT_RL"
kubectl -n "$NS" get sftruns,rlruns
echo "reward=$(kubectl -n "$NS" get rlrun reverse-text -o jsonpath='{.status.reward}')"
