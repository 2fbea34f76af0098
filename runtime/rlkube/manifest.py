"""Signed manifests: what the trainer loads is what the trainer wrote.

The trainer's checkpoints and its compile cache sit where other programs may write: the run's
volume (mounted by other pods) or its object-store prefix (whose credentials the orchestrator
holds too). Loading them runs code: DCP reads a checkpoint's `.metadata` with `pickle`, and
torch's compile-cache artifacts are compiled code. So the trainer signs what it writes and
checks the signature before anything reads the files:

- a checkpoint part gets `MANIFEST.json` (written after every other file of the part, before
  the `COMPLETE` marker): each file's relative path, size and SHA-256, and an HMAC-SHA256 of
  that list bound to the part's place (`<process>/step_N`, so a signed part copied to another
  step does not pass);
- a compile-cache blob gets `<blob>.sig`, an HMAC of its bytes bound to its name.

The key is the run's checkpoint key, `RLKUBE_CHECKPOINT_KEY`: the operator derives it per run
from its own key and gives it to the trainer's pods alone (the orchestrator, env workers and
servers never see it); locally whoever starts `rlkube rl` or `rlkube sft` may set it. Without a
key, manifests are written unsigned and a part's files are still checked against its manifest
(sizes and hashes: a torn or altered file is caught, a forged manifest is not), and parts
without a manifest load as before. With a key, a part or blob without a valid signature is
refused (`Refused`, naming the file). No torch here: fsspec only.
"""

import hashlib
import hmac
import json
import logging
import os

import fsspec

from rlkube.withheld import CHECKPOINT_KEY_ENV

logger = logging.getLogger(__name__)

KEY_ENV = CHECKPOINT_KEY_ENV
MANIFEST = "MANIFEST.json"
SIGNATURE_SUFFIX = ".sig"
VERSION = 1
_CHUNK = 8 << 20


class Refused(ValueError):
    """A file the trainer was about to load is not what the trainer wrote."""

    def __init__(self, path: str, reason: str):
        self.path = path
        super().__init__(f"refused {path}: {reason}")


def checkpoint_key() -> bytes | None:
    """The run's checkpoint key, None when none is configured."""
    value = os.environ.get(KEY_ENV)
    return value.encode() if value else None


def _mac(key: bytes, purpose: str, payload: bytes) -> str:
    return hmac.new(key, purpose.encode() + b"\0" + payload, hashlib.sha256).hexdigest()


def _fs(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, path = fsspec.core.url_to_fs(url)
    fs.invalidate_cache()
    return fs, path.rstrip("/")


def part_files(url: str, skip: tuple[str, ...]) -> list[str]:
    """Every file under the part `url`, as sorted paths relative to it, but the names `skip`
    (the marker and the manifest)."""
    fs, path = _fs(url)
    names = (f[len(path) + 1:] for f in fs.find(path, withdirs=False))
    return sorted(n for n in names if n not in skip)


def digest_files(url: str, names: list[str]) -> dict[str, dict]:
    """`{name: {"size", "sha256"}}` of the files `names` under `url`, read in chunks."""
    fs, path = _fs(url)
    out = {}
    for name in names:
        sha, size = hashlib.sha256(), 0
        with fs.open(f"{path}/{name}", "rb") as f:
            while chunk := f.read(_CHUNK):
                sha.update(chunk)
                size += len(chunk)
        out[name] = {"size": size, "sha256": sha.hexdigest()}
    return out


def digest_bytes(data: bytes) -> dict:
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _body(files: dict[str, dict], place: str) -> bytes:
    return json.dumps({"version": VERSION, "place": place, "files": files}, sort_keys=True).encode()


def manifest_bytes(files: dict[str, dict], place: str, key: bytes | None) -> bytes:
    """The manifest of a part at `place` (`<process>/step_N`) holding `files`."""
    mac = _mac(key, place, _body(files, place)) if key else None
    return json.dumps({"version": VERSION, "place": place, "files": files, "mac": mac}, sort_keys=True,
                      indent=1).encode()


def read_manifest(url: str, place: str, key: bytes | None) -> dict[str, dict] | None:
    """The files a part's manifest lists, authenticated with `key`; None for a part without a
    manifest when there is no key. `Refused` for a manifest that is missing (with a key),
    unreadable, of another place, or whose signature does not match."""
    fs, path = _fs(url)
    where = f"{url.rstrip('/')}/{MANIFEST}"
    if not fs.exists(f"{path}/{MANIFEST}"):
        if key is not None:
            raise Refused(where, f"the part has no manifest, and {KEY_ENV} is set: it was not written by this "
                          "run's trainer (or by a version before signed checkpoints)")
        logger.warning("%s: no manifest (a checkpoint from before manifests): loaded unchecked", url)
        return None
    try:
        manifest = json.loads(fs.cat_file(f"{path}/{MANIFEST}"))
        files, mac = manifest["files"], manifest["mac"]
        if manifest["version"] != VERSION or not isinstance(files, dict):
            raise ValueError(f"version {manifest['version']!r}")
    except (ValueError, KeyError, TypeError) as e:
        raise Refused(where, f"not a manifest this trainer reads ({e})") from None
    if manifest["place"] != place:
        raise Refused(where, f"it is the manifest of {manifest['place']!r}, not of {place!r}")
    if key is not None:
        if not isinstance(mac, str) or not hmac.compare_digest(mac, _mac(key, place, _body(files, place))):
            raise Refused(where, f"its signature does not match the run's checkpoint key ({KEY_ENV})"
                          + ("" if mac else ": it is unsigned"))
    elif mac:
        logger.warning("%s: signed, but %s is not set: its signature is not checked", where, KEY_ENV)
    return files


def check_files(url: str, listed: dict[str, dict], present: list[str], digests: dict[str, dict]) -> None:
    """`Refused`, naming the file, for a file present but not listed (planted), listed but
    missing, or whose size or SHA-256 (`digests`, of some of `present`) differs from the list."""
    base = url.rstrip("/")
    for name in present:
        if name not in listed:
            raise Refused(f"{base}/{name}", "the part's manifest does not list it (a file planted after the save)")
    for name in listed:
        if name not in present:
            raise Refused(f"{base}/{name}", "the part's manifest lists it, and it is missing")
    for name, got in digests.items():
        want = listed[name]
        if got["size"] != want["size"]:
            raise Refused(f"{base}/{name}", f"{got['size']} bytes, the manifest says {want['size']}")
        if not hmac.compare_digest(got["sha256"], want["sha256"]):
            raise Refused(f"{base}/{name}", "its SHA-256 differs from the manifest's (altered after the save)")


# --- single blobs (the compile cache) -----------------------------------------------------
def sign_blob(fs: fsspec.AbstractFileSystem, path: str, data: bytes, key: bytes | None) -> None:
    """Write `data` to `path`, then its signature beside it (a stale one is removed first)."""
    sig = path + SIGNATURE_SUFFIX
    if fs.exists(sig):
        fs.rm(sig)
    fs.pipe_file(path, data)
    if key is not None:
        fs.pipe_file(sig, _mac(key, path.rsplit("/", 1)[-1], data).encode())


def verify_blob(fs: fsspec.AbstractFileSystem, path: str, data: bytes, key: bytes | None, url: str) -> None:
    """`Refused` (naming `url`) unless `data`, read from `path`, carries the run's signature;
    anything passes without a key."""
    if key is None:
        return
    sig = path + SIGNATURE_SUFFIX
    if not fs.exists(sig):
        raise Refused(url, f"no signature ({url}{SIGNATURE_SUFFIX}) while {KEY_ENV} is set")
    if not hmac.compare_digest(fs.cat_file(sig).decode(errors="replace").strip(),
                               _mac(key, path.rsplit("/", 1)[-1], data)):
        raise Refused(url, f"its signature does not match the run's checkpoint key ({KEY_ENV})")
