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

With an image (`spec["rootfs"]`: its mounted files, `lower`, and a directory of the container's
own, `dir`), the container's root is an overlay of a fresh writable layer over the image's files,
with /proc, /sys (read-only) and a /dev of its own (a tmpfs with null, zero, full, random,
urandom, tty and a /dev/shm); the volumes are bound inside it, and `pivot_root` makes it `/`:
nothing of the host's files is left in the container's view but what is bound there.

Without one, the repository and its virtualenv stand in for the image (`spec["image"]`). A volume mounted
over a directory that holds them (an emptyDir on `/tmp` of a checkout under `/tmp`) would hide
the image, so each is bound back at its own path inside that volume. A directory above them that
the container's user may not enter (a checkout or a Python under root's 0700 home, as a CI
machine has them) is covered with an empty tmpfs that it may enter, holding only the image's
paths bound back: the pod sees them, not the rest of that directory.

Then, from `spec["identity"]` (podenv.identity): the root filesystem remounted read-only
(`readOnlyRootFilesystem`; the volumes stay as mounted), the capability bounding set emptied
(`drop: [ALL]`), the supplementary groups, group and user set, and `no_new_privs`.
"""

import ctypes
import json
import os
import socket
import sys

CLONE_NEWNS, CLONE_NEWUTS = 0x00020000, 0x04000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
MNT_DETACH, SYS_PIVOT_ROOT = 2, 155  # x86_64
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38

ROOT = {"uid": 0, "gid": 0, "groups": [0], "no_new_privs": False, "drop_all_capabilities": False,
        "read_only_root": False}
libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, flags: int, fstype: str | None = None, data: str | None = None) -> None:
    args = [x.encode() if x else None for x in (source, target, fstype)]
    _check(libc.mount(*args, flags, data.encode() if data else None), f"mount {source} on {target}")


def enter_image(rootfs: dict) -> str:
    """Mount the container's root filesystem (see the module docstring); returns where it is."""
    upper, work, root = (os.path.join(rootfs["dir"], d) for d in ("upper", "work", "root"))
    for d in (upper, work, root):
        os.makedirs(d, exist_ok=True)
    mount("overlay", root, 0, "overlay", f"lowerdir={rootfs['lower']},upperdir={upper},workdir={work}")
    for d in ("proc", "sys", "dev"):
        os.makedirs(f"{root}/{d}", exist_ok=True)
    mount("proc", f"{root}/proc", MS_NOSUID | MS_NODEV, "proc")
    mount("/sys", f"{root}/sys", MS_BIND | MS_REC)
    mount(None, f"{root}/sys", MS_BIND | MS_REMOUNT | MS_RDONLY)
    mount("tmpfs", f"{root}/dev", MS_NOSUID, "tmpfs", "mode=0755")
    for name in DEVICES:
        open(f"{root}/dev/{name}", "w").close()
        mount(f"/dev/{name}", f"{root}/dev/{name}", MS_BIND)
    os.makedirs(f"{root}/dev/shm")
    mount("shm", f"{root}/dev/shm", MS_NOSUID | MS_NODEV, "tmpfs", "mode=1777")
    for name, target in [("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")]:
        os.symlink(target, f"{root}/dev/{name}")
    return root


def in_root(root: str, path: str) -> str:
    """Where `path` of the container lies on the host before `pivot_to(root)`: its symlinks
    resolved inside `root` (an image's `/var/run -> /run` must not lead to the host's /run)."""
    if not root:
        return path
    parts, done, hops = path.strip("/").split("/"), "", 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            done = done.rsplit("/", 1)[0]
            continue
        link = root + done + "/" + part
        if os.path.islink(link) and hops < 40:
            hops += 1
            target = os.readlink(link)
            parts = target.strip("/").split("/") + parts
            if target.startswith("/"):
                done = ""
            continue
        done += "/" + part
    return root + done


def pivot_to(root: str) -> None:
    """Make `root` the process's `/` and detach the host's root from its mount namespace."""
    os.chdir(root)
    _check(libc.syscall(SYS_PIVOT_ROOT, b".", b"."), "pivot_root")
    _check(libc.umount2(b".", MNT_DETACH), "detach the host's root")
    os.chdir("/")


def may_enter(path: str, ident: dict) -> bool:
    """Whether the container's user may search directory `path` (its x permission bits)."""
    st = os.stat(path)
    if ident["uid"] == 0 or st.st_mode & 0o001:
        return True
    return bool(st.st_mode & 0o100 if st.st_uid == ident["uid"] else
                st.st_mode & 0o010 and st.st_gid in ident["groups"])


def closed_ancestor(path: str, ident: dict) -> str | None:
    """The highest directory above `path` the container's user may not enter, if any. One a
    volume hides (a checkout under `/tmp`, below an emptyDir on `/tmp`) is not there to stop it:
    `bind_image` creates it inside the volume, open to everyone."""
    parts = path.rstrip("/").split("/")
    for i in range(2, len(parts)):
        ancestor = "/".join(parts[:i])
        if not os.path.isdir(ancestor):
            return None
        if not may_enter(ancestor, ident):
            return ancestor
    return None


def bind_image(image: list[tuple[str, int]], mounts: list[dict], ident: dict) -> None:
    """Bind each image path back where a volume hid it, or under a tmpfs over a directory the
    user may not enter (see the module docstring)."""
    covered = set()
    for path, _ in image:
        if (closed := closed_ancestor(path, ident)) and closed not in covered:
            mount("tmpfs", closed, 0, "tmpfs", "mode=0755")
            covered.add(closed)
    for path, fd in image:
        hidden = any(path.startswith(m["target"].rstrip("/") + "/") for m in mounts)
        if hidden or any(path.startswith(c + "/") for c in covered):
            os.makedirs(path, exist_ok=True)
            mount(f"/proc/self/fd/{fd}", path, MS_BIND | MS_REC)
            if ident["read_only_root"]:
                mount(None, path, MS_BIND | MS_REMOUNT | MS_RDONLY)
        os.close(fd)


def become(ident: dict) -> None:
    """Drop to the container's identity (after every mount: that needs root)."""
    if ident["drop_all_capabilities"]:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
        for cap in range(last + 1):
            _check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
    os.setgroups(ident["groups"])
    os.setgid(ident["gid"])
    os.setuid(ident["uid"])
    if ident["no_new_privs"]:
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    _check(libc.unshare(CLONE_NEWNS | CLONE_NEWUTS), "unshare")
    mount(None, "/", MS_REC | MS_PRIVATE)
    mounts = sorted(spec["mounts"], key=lambda m: m["target"].rstrip("/").count("/"))
    sources = [os.open(m["source"], os.O_PATH) for m in mounts]
    image = [(path, os.open(path, os.O_PATH)) for path in spec.get("image", [])]
    root = enter_image(spec["rootfs"]) if spec.get("rootfs") else ""
    for m, fd in zip(mounts, sources):
        target = in_root(root, m["target"])
        if not os.path.lexists(target):
            if os.path.isdir(m["source"]):
                os.makedirs(target)
            else:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                open(target, "a").close()
        mount(f"/proc/self/fd/{fd}", target, MS_BIND | MS_REC)
        if m["read_only"]:
            mount(None, target, MS_BIND | MS_REMOUNT | MS_RDONLY)
        os.close(fd)
    ident = spec.get("identity") or ROOT
    bind_image(image, mounts, ident)
    socket.sethostname(spec["hostname"])
    os.makedirs(in_root(root, spec["cwd"]), exist_ok=True)  # exists unless it lies inside a volume or the image lacks it
    if root:
        pivot_to(root)
    os.chdir(spec["cwd"])
    if ident["read_only_root"]:
        mount(None, "/", MS_BIND | MS_REMOUNT | MS_RDONLY)
    become(ident)
    try:
        os.execvpe(spec["argv"][0], spec["argv"], spec["env"])
    except OSError as e:  # what a runtime reports as StartError; 127 like a shell
        print(f"localcluster: cannot start {spec['argv'][0]!r}: {e}", file=sys.stderr)
        sys.exit(127)


if __name__ == "__main__":
    main(sys.argv[1])
