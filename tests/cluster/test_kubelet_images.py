"""The kubelet with images (images.PodmanImages): a pod runs its image's files, not the host's.

Needs podman and, but for the unbuilt-image test, the runtime image in podman's store (`make
images`); without them the tests skip, under CI too, as the GPU and kind tests do (a machine
without the images has nothing to check them on). Each test fails where the kubelet falls back to the host's files (the venv stand-in):
the model file exists only in the image, the host's root is writable, the stand-in has no USER,
WORKDIR or CMD, and it runs any `spec.image`."""

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from e2e.localcluster.images import PodmanImages
from tests.cluster.test_kubelet import kmock_options, kubelet_cluster, main_status, phase, pod  # noqa: F401 (a fixture)
from tests.operator.cluster import NS

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
RUNTIME = f"ghcr.io/rlkube/rlkube-runtime-cpu:{VERSION}"
IN_IMAGE_ONLY = "/opt/rlkube/models/tiny-reverse-text/config.json"  # made by the image's build
MODEL_WEIGHTS = "/opt/rlkube/models/tiny-reverse-text/model.safetensors"  # root's, read by uid 1000


def image_missing(ref: str | None = None) -> str | None:
    """Why images cannot be run here (None: they can)."""
    if shutil.which("podman") is None:
        return "podman is not installed (apt-get install podman buildah runc; images/README.md)"
    if ref and subprocess.run(["podman", "image", "exists", ref], check=False).returncode != 0:
        return f"{ref} is not in podman's store: build it with `make images`"
    return None


def skip_without(missing: str | None) -> None:
    if missing is not None:
        pytest.skip(missing)


@pytest.fixture
async def cluster(kmock, tmp_path):
    skip_without(image_missing())
    async with kubelet_cluster(kmock, tmp_path, images=PodmanImages()) as cluster:
        yield cluster


async def test_the_pod_runs_the_images_files_as_its_user_on_a_read_only_root(cluster, tmp_path):
    """No runAsUser: the image's USER (1000), its HOME and WORKDIR; a file only the image has;
    the root read-only; the claim (root's, before fsGroup) writable through fsGroup."""
    skip_without(image_missing(RUNTIME))
    assert not Path(IN_IMAGE_ONLY).exists()  # or the test proves nothing
    await cluster.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "claim"},
                          "spec": {"accessModes": ["ReadWriteOnce"]}})
    probe = (
        "import os\n"
        f"print('image file', os.path.exists({IN_IMAGE_ONLY!r}))\n"
        f"print('image model', len(open({MODEL_WEIGHTS!r}, 'rb').read(8)))\n"
        "print('id', os.getuid(), os.getgid(), sorted(os.getgroups()), os.environ['HOME'], os.getcwd())\n"
        "for path in ('/data/out', '/opt/rlkube/x', '/x'):\n"
        "    try:\n"
        "        open(path, 'a').close(); print('wrote', path)\n"
        "    except OSError as e: print('refused', path, e.strerror)\n"
    )
    await cluster.create(pod(
        "from-image", ["python", "-c", probe], securityContext={"fsGroup": 1000},
        volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "claim"}}],
        container={"image": RUNTIME, "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                   "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                                       "capabilities": {"drop": ["ALL"]}}}))
    await cluster.until(lambda: phase(cluster, "from-image") in ("Succeeded", "Failed"), 60, "the pod to end")
    out = cluster.logs("from-image").splitlines()
    assert phase(cluster, "from-image") == "Succeeded", out
    assert out == [
        "image file True",
        "image model 8",
        "id 1000 1000 [1000] /home/rlkube /home/rlkube",
        "wrote /data/out",
        "refused /opt/rlkube/x Read-only file system",
        "refused /x Read-only file system",
    ]
    assert (tmp_path / "pvcs" / NS / "claim" / "out").stat().st_uid == 1000
    assert main_status(cluster, "from-image")["imageID"].startswith("sha256:")


async def test_the_images_cmd_exit_codes_termination_messages_and_exec_probes(cluster):
    """No command: the image's CMD (`rlkube --help`). A command's exit code and the message it left
    at /dev/termination-log; an exec probe runs inside the image (it reads the image's file)."""
    skip_without(image_missing(RUNTIME))
    await cluster.create(pod("cmd", None, container={"image": RUNTIME}))
    await cluster.create(pod("fails", ["sh", "-c", "echo no model >/dev/termination-log; exit 3"],
                             container={"image": RUNTIME}))
    await cluster.create(pod("probed", ["sleep", "60"], container={
        "image": RUNTIME, "readinessProbe": {"exec": {"command": ["cat", IN_IMAGE_ONLY]}, "periodSeconds": 1}}))
    await cluster.until(lambda: phase(cluster, "cmd") in ("Succeeded", "Failed"), 60, "the CMD pod to end")
    assert phase(cluster, "cmd") == "Succeeded" and "usage: rlkube" in cluster.logs("cmd")
    await cluster.until(lambda: phase(cluster, "fails") == "Failed", 60, "the failing pod to fail")
    assert main_status(cluster, "fails")["state"]["terminated"] | {"startedAt": None, "finishedAt": None} == {
        "exitCode": 3, "reason": "Error", "message": "no model\n", "startedAt": None, "finishedAt": None,
        "containerID": main_status(cluster, "fails")["containerID"]}
    await cluster.until(lambda: main_status(cluster, "probed")["ready"], 30, "the exec probe to pass")
    await cluster.delete("Pod", "probed")


async def test_the_image_compiles_cpu_kernels_as_the_pods_run_it(cluster):
    """vLLM's CPU engine runs parts of its model through torch.compile even with enforce_eager, so
    the image must compile a kernel as a run's pods are: uid 1000, read-only root, $HOME and the
    kernel cache on an emptyDir at /tmp. The venv stand-in passes on any host with g++ and
    Python's headers; an image without them failed every engine's first request
    (InvalidCxxCompiler, then `Python.h: No such file`)."""
    skip_without(image_missing(RUNTIME))
    compile_a_kernel = "import torch; print(torch.compile(lambda x: (2 * x).sin() + 1)(torch.zeros(3)).tolist())"
    await cluster.create(pod(
        "compiles", ["python", "-c", compile_a_kernel], volumes=[{"name": "tmp", "emptyDir": {}}],
        container={"image": RUNTIME, "env": [{"name": "HOME", "value": "/tmp"}],
                   "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                   "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                                       "capabilities": {"drop": ["ALL"]}}}))
    await cluster.until(lambda: phase(cluster, "compiles") in ("Succeeded", "Failed"), 180, "the pod to end")
    out = cluster.logs("compiles")
    assert phase(cluster, "compiles") == "Succeeded", out[-3000:]
    assert out.splitlines()[-1] == "[1.0, 1.0, 1.0]"


async def test_a_volume_under_an_images_symlink_lands_inside_the_container(cluster, tmp_path):
    """The image's /var/run is a link to /run: the volume must follow it inside the image, not
    to the host's /run."""
    skip_without(image_missing(RUNTIME))
    target = f"/var/run/rlkube-test-{tmp_path.name}"
    await cluster.create(pod("linked", ["sh", "-c", f"echo hi > {target}/x && cat /run/{Path(target).name}/x"],
                             volumes=[{"name": "scratch", "emptyDir": {}}],
                             container={"image": RUNTIME, "volumeMounts": [{"name": "scratch", "mountPath": target}]}))
    await cluster.until(lambda: phase(cluster, "linked") in ("Succeeded", "Failed"), 60, "the pod to end")
    assert (phase(cluster, "linked"), cluster.logs("linked")) == ("Succeeded", "hi\n")
    assert not Path(f"/run/{Path(target).name}").exists()


async def test_a_pod_whose_image_was_never_built_waits_in_image_pull_backoff(cluster):
    never = "ghcr.io/rlkube/never-built:0.0.0"
    await cluster.create(pod("unbuilt", ["true"], container={"image": never}))
    reasons = set()

    def waiting() -> str | None:
        state = main_status(cluster, "unbuilt")["state"]
        reasons.add(state.get("waiting", {}).get("reason"))
        return {"ErrImagePull", "ImagePullBackOff"} <= reasons and state.get("waiting", {}).get("message")

    message = await cluster.until(waiting, 30, "ErrImagePull, then ImagePullBackOff", every=0.05)
    assert f'image "{never}" is not in this node\'s image store' in message and "make images" in message
    assert phase(cluster, "unbuilt") == "Pending"
