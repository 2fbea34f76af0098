# The rlkube operator: kopf + the official kubernetes client + rlkube.config. No torch, no vLLM.
#   docker build -f images/operator.Dockerfile -t ghcr.io/rlkube/rlkube-operator:0.1.0 .
FROM python:3.11.7-slim-bookworm

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /opt/rlkube
COPY pyproject.toml constraints.txt README.md ./
COPY runtime runtime
COPY operator operator
# The light core plus the `operator` extra; a non-editable install, so the image needs no sources.
RUN pip install -c constraints.txt ".[operator]" \
 && python -c "import sys, rlkube_operator.main; assert 'torch' not in sys.modules"

# Non-root, read-only root filesystem friendly (the chart mounts an emptyDir at /tmp).
USER 65532:65532
ENTRYPOINT ["rlkube-operator"]
