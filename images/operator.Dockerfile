# The rlkube operator: kopf + the official kubernetes client + rlkube.config. No torch, no vLLM.
#   make images   (images/build.sh: buildah or Docker, the machine's package indexes)
#   docker build -f images/operator.Dockerfile -t ghcr.io/rlkube/rlkube-operator:0.1.0 .
FROM python:3.11.7-slim-bookworm

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

# Where packages come from (images/build.sh passes the machine's; PyPI by default).
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_FIND_LINKS=

WORKDIR /opt/rlkube
# Dependencies first: with empty package folders (and an empty README, which pyproject names),
# `.[operator]` installs every dependency and no code, so a change to the sources or the README
# rebuilds from the COPYs below, not from here.
COPY pyproject.toml constraints.txt ./
RUN mkdir runtime operator && touch README.md && pip install -c constraints.txt ".[operator]"

COPY README.md ./
COPY runtime runtime
COPY operator operator
# The light core plus the `operator` extra; a non-editable install, so the image needs no sources.
RUN pip install --no-deps --force-reinstall . && rm -rf build *.egg-info \
 && python -c "import sys, rlkube_operator.main; assert 'torch' not in sys.modules"

# Non-root, read-only root filesystem friendly (the chart mounts an emptyDir at /tmp).
USER 65532:65532
ENTRYPOINT ["rlkube-operator"]
