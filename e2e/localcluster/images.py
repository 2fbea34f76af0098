"""Where a container's files come from: its image, from this node's image store (podman's), or
the project's virtualenv standing in for every image (the fast tests).

`PodmanImages` answers `spec.image` as a kubelet with `imagePullPolicy: Never` would (there is no
registry to pull from: `make images` builds the images into the store, as `kind load
docker-image` loads them into a kind node): an image not in the store raises `ImageNotPresent`,
which the kubelet reports as ErrImagePull, then ImagePullBackOff, retrying as a kubelet does. A
present image is mounted once (`podman image mount`, read-only) and becomes each container's
lower layer (launch.py puts a writable layer of the container's own over it and makes it the
root). Its config supplies what the pod spec leaves out: ENTRYPOINT and CMD, ENV, USER,
WORKDIR.

`VenvImage` is the stand-in of the fast tests: every `spec.image` is the host's root filesystem
with the venv's `bin` leading PATH; the checkout, the venv and the Python it was made from must
stay visible to the pod (launch.py binds them back where a volume or a closed directory would hide
them).
"""

import asyncio
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What the stand-in passes from the kubelet's environment: caches and offline switches.
PASSED_ENV_PREFIXES = ("LANG", "LC_", "TZ", "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "VLLM_", "TORCH")
REPO = Path(__file__).resolve().parents[2]


class ImageNotPresent(Exception):
    """The image is not in this node's store; its message is the container's waiting message."""


@dataclass(frozen=True)
class Image:
    """What the kubelet and launch.py need of an image."""

    ref: str
    id: str = ""
    rootfs: str | None = None
    """The image's mounted root filesystem (read-only), or None: the host's root (the stand-in)."""
    env: dict[str, str] = field(default_factory=dict)
    user: str = ""
    workdir: str = ""
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    host_paths: list[str] = field(default_factory=list)
    """Host directories the stand-in must keep visible (launch.py's bind_image)."""

    def passwd_entry(self, uid: int) -> tuple[str, int, str] | None:
        """(name, gid, home) of `uid` in the image's /etc/passwd, if it has one."""
        for fields in self._passwd():
            if fields[2] == str(uid):
                return fields[0], int(fields[3]), fields[5]
        return None

    def user_ids(self) -> tuple[int, int | None] | None:
        """USER as (uid, gid or None), names looked up in the image's /etc/passwd; None: unset."""
        if not self.user:
            return None
        name, _, group = self.user.partition(":")
        if name.isdigit():
            uid = int(name)
        else:
            entry = next((f for f in self._passwd() if f[0] == name), None)
            if entry is None:
                raise ImageNotPresent(f"image {self.ref}: USER {name!r} is not in its /etc/passwd")
            uid, group = int(entry[2]), group or entry[3]
        return uid, int(group) if group.isdigit() else None

    def _passwd(self) -> list[list[str]]:
        if self.rootfs is None:
            return []
        path = Path(self.rootfs) / "etc" / "passwd"
        lines = path.read_text().splitlines() if path.is_file() else []
        return [f for f in (line.split(":") for line in lines) if len(f) >= 7]


class PodmanImages:
    """The images of this node's podman/buildah store (root's: the kubelet runs as root)."""

    def __init__(self, podman: str = "podman"):
        self.podman = podman
        self._mounted: dict[str, Image] = {}
        self._lock = asyncio.Lock()

    async def get(self, ref: str) -> Image:
        async with self._lock:  # one mount per image, however many containers start at once
            code, out, err = await self._podman("image", "inspect", ref)
            if code != 0:
                raise ImageNotPresent(
                    f'image "{ref}" is not in this node\'s image store and the local cluster pulls '
                    f"nothing (imagePullPolicy Never): build it (`make images`) or load it with "
                    f"`podman load` ({err.strip().splitlines()[-1] if err.strip() else code})")
            info = json.loads(out)[0]
            if info["Id"] not in self._mounted:
                code, out, err = await self._podman("image", "mount", info["Id"])
                if code != 0:
                    raise RuntimeError(f"podman image mount {ref}: {err.strip()}")
                config = info.get("Config") or {}
                env = dict(e.partition("=")[::2] for e in config.get("Env") or [])
                self._mounted[info["Id"]] = Image(
                    ref=ref, id=f"sha256:{info['Id']}", rootfs=out.strip(), env=env,
                    user=config.get("User") or "", workdir=config.get("WorkingDir") or "",
                    entrypoint=config.get("Entrypoint") or [], cmd=config.get("Cmd") or [])
            return self._mounted[info["Id"]]

    def close(self) -> None:
        """Unmount what this kubelet mounted (podman counts the mounts of each image)."""
        for image_id in self._mounted:
            subprocess.run([self.podman, "image", "unmount", image_id.removeprefix("sha256:")],
                           capture_output=True, check=False)
        self._mounted.clear()

    async def _podman(self, *args: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            self.podman, *args, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        return proc.returncode, out.decode(), err.decode()


class VenvImage:
    """The stand-in: every image is the host with `venv` (default `<repo>/.venv`) on PATH."""

    def __init__(self, venv: Path | None = None):
        venv = venv or os.environ.get("RLKUBE_LOCALCLUSTER_VENV") or REPO / ".venv"
        self.venv = Path(venv).absolute()

    async def get(self, ref: str) -> Image:
        # a compile cache folder of the host's process is not the pod's (another uid may not write it)
        env = {k: v for k, v in os.environ.items()
               if k.startswith(PASSED_ENV_PREFIXES) and not k.endswith("_CACHE_DIR")}
        env |= {"PATH": f"{self.venv}/bin:{SYSTEM_PATH}", "VIRTUAL_ENV": str(self.venv)}
        return Image(ref=ref, env=env, host_paths=self.host_paths())

    def host_paths(self) -> list[str]:
        """What stands in for the image: the checkout, the venv and the Python it was made from."""
        paths = [REPO, self.venv]
        cfg = self.venv / "pyvenv.cfg"
        for line in cfg.read_text().splitlines() if cfg.exists() else []:
            key, _, value = line.partition("=")
            if key.strip() == "home":
                paths.append(Path(value.strip()).parent)
        return list(dict.fromkeys(str(p) for p in paths))

    def close(self) -> None:
        pass
