"""Start one container process: `ip netns exec <netns> python launch.py <spec.json>`.

`ip netns exec` has put us in the pod's network namespace, in a mount namespace of our own
where `/etc/netns/<netns>/hosts` is bound onto `/etc/hosts`. This script (stdlib only, it runs
before any "image" is set up) then takes a private mount and UTS namespace, binds each volume
onto its mountPath, sets the pod's hostname, and execs the container's command with its env and
working directory. The pid stays the same through every exec, so the kubelet's process group is
the container's.

Sources are opened before anything is mounted, so a volume mounted on `/tmp` cannot hide the
source of another volume that lives under `/tmp`. Mount targets missing on the host were created
by the kubelet; targets inside another volume are created here, inside that volume.

The repository and its virtualenv stand in for the image (`spec["image"]`). A volume mounted
over a directory that holds them (an emptyDir on `/tmp` of a checkout under `/tmp`) would hide
the image, so each is bound back at its own path inside that volume.
"""

import ctypes
import json
import os
import socket
import sys

CLONE_NEWNS, CLONE_NEWUTS = 0x00020000, 0x04000000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18

libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, flags: int) -> None:
    src = source.encode() if source else None
    _check(libc.mount(src, target.encode(), None, flags, None), f"mount {source} on {target}")


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    _check(libc.unshare(CLONE_NEWNS | CLONE_NEWUTS), "unshare")
    mount(None, "/", MS_REC | MS_PRIVATE)
    mounts = sorted(spec["mounts"], key=lambda m: m["target"].rstrip("/").count("/"))
    sources = [os.open(m["source"], os.O_PATH) for m in mounts]
    image = [(path, os.open(path, os.O_PATH)) for path in spec.get("image", [])]
    for m, fd in zip(mounts, sources):
        if not os.path.lexists(m["target"]):
            if os.path.isdir(m["source"]):
                os.makedirs(m["target"])
            else:
                os.makedirs(os.path.dirname(m["target"]), exist_ok=True)
                open(m["target"], "a").close()
        mount(f"/proc/self/fd/{fd}", m["target"], MS_BIND | MS_REC)
        if m["read_only"]:
            mount(None, m["target"], MS_BIND | MS_REMOUNT | MS_RDONLY)
        os.close(fd)
    for path, fd in image:
        if any(path.startswith(m["target"].rstrip("/") + "/") for m in mounts):
            os.makedirs(path, exist_ok=True)
            mount(f"/proc/self/fd/{fd}", path, MS_BIND | MS_REC)
        os.close(fd)
    socket.sethostname(spec["hostname"])
    os.makedirs(spec["cwd"], exist_ok=True)  # exists unless it lies inside a volume
    os.chdir(spec["cwd"])
    try:
        os.execvpe(spec["argv"][0], spec["argv"], spec["env"])
    except OSError as e:  # what a runtime reports as StartError; 127 like a shell
        print(f"localcluster: cannot start {spec['argv'][0]!r}: {e}", file=sys.stderr)
        sys.exit(127)


if __name__ == "__main__":
    main(sys.argv[1])
