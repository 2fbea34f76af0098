#!/usr/bin/env bash
# Check the GPU runtime image on a machine without a GPU (`make check-gpu-image`, after
# `images/build.sh runtime-gpu`): vllm and the CUDA torch import, what Triton and FlashInfer compile
# with at run time is there, `rlkube --help` runs, and a GPU config's `rlkube rl --dry-run` (its
# memory estimates) passes. As the pods run it: uid 1000, read-only root, HOME=/tmp, no
# capabilities, and no network (the dry run must not need one: HF_HUB_OFFLINE=1).
#   images/check-gpu-image.sh [CONFIG]   (a file under configs/, default configs/qwen3-0.6b-1gpu/rl.toml;
#                                        root: podman's store)
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=${TAG:-$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)}
IMAGE=${IMAGE:-${REGISTRY:-ghcr.io/rlkube}/rlkube-runtime-gpu:$TAG}
CONFIG=${1:-configs/qwen3-0.6b-1gpu/rl.toml}

in_image() {
  podman run --runtime runc --rm --read-only --cap-drop ALL --network none \
    --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 \
    -e HOME=/tmp -e HF_HUB_OFFLINE=1 -v "$PWD/configs:/configs:ro" -w /tmp "$IMAGE" "$@"
}

in_image python -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__, "cuda", torch.version.cuda)'
in_image python -c 'import os, shutil, sysconfig
missing = [c for c in ("cc", "c++") if not shutil.which(c)]
missing += [] if os.path.exists(sysconfig.get_path("include") + "/Python.h") else ["Python.h"]
assert not missing, f"Triton/FlashInfer need {missing} at run time"'
in_image rlkube --help >/dev/null
in_image rlkube rl @ "/$CONFIG" --dry-run
echo "images: $IMAGE passed its checks without a GPU"
