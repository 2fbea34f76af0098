# The rlkube operator: kopf + the official kubernetes client + rlkube.config. No torch, no vLLM.
#   make images   (images/build.sh: buildah or Docker, the machine's package indexes as a pip.conf
#                 build secret, so no index path enters the image's history)
#   ENGINE=docker images/build.sh operator   (Docker with BuildKit: the pip.conf secret)
FROM python:3.11.7-slim-bookworm

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /opt/rlkube
# Dependencies first: with empty package folders (and an empty README, which pyproject names),
# `.[operator]` installs every dependency and no code, so a change to the sources or the README
# rebuilds from the COPYs below, not from here.
COPY pyproject.toml constraints.txt ./
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf mkdir runtime operator && touch README.md && pip install -c constraints.txt ".[operator]"

COPY README.md ./
COPY runtime runtime
COPY operator operator
# The light core plus the `operator` extra; a non-editable install, so the image needs no sources.
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf pip install --no-deps --force-reinstall . && rm -rf build *.egg-info \
 && python -c "import sys, rlkube_operator.main; assert 'torch' not in sys.modules"

# Non-root, read-only root filesystem friendly (the chart mounts an emptyDir at /tmp).
USER 65532:65532
ENTRYPOINT ["rlkube-operator"]
