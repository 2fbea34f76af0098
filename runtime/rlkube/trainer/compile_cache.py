"""Compiled kernels live with the run, so a restarted trainer does not compile them again.

The trainer compiles FlexAttention (and its block masks) with `torch.compile`; on a fresh GPU
machine that is minutes of Inductor code generation and Triton autotuning before the first
step. Both keep on-disk caches, by default under `/tmp`, which a new pod does not have. Here:

- the caches go under `<output_dir>/compile_cache/<key>/` (`TORCHINDUCTOR_CACHE_DIR`, Triton's
  under it), where `<key>` names the torch, Python and device (CUDA version, compute
  capability and name; or the CPU architecture) so a different torch or GPU never reads a stale
  cache. Under the operator the output directory is on the run's PVC.
- with `trainer.perf.compile_cache_url` (a path or fsspec URL; the operator sets it under the
  run's object-store prefix when the output directory is a pod's emptyDir), torch's portable
  cache artifacts (`torch.compiler.save_cache_artifacts`: Inductor, AOTAutograd and autotuning
  results in one blob) are loaded from `<url>/<key>.bin` at start, and written back by rank 0
  after a step that compiled something. The blob is compiled code, so it is signed with the
  run's checkpoint key (`<key>.bin.sig`, rlkube.manifest) and one without a valid signature is
  refused (an error naming it; the trainer compiles afresh and overwrites it). The local
  directory cannot be signed (Inductor reads it itself): under the operator only the trainer's
  pods may write the run's volume where it lies.

`activate()` must run before anything compiles. A `TORCHINDUCTOR_CACHE_DIR` set by the user
(to anything but torch's default) is kept: their choice of place wins; the store still applies.
"""

import logging
import os
import platform
import re
import sys
from pathlib import Path

import fsspec
import torch

from rlkube.manifest import Refused, checkpoint_key, sign_blob, verify_blob

logger = logging.getLogger(__name__)


def cache_key(device: torch.device) -> str:
    """What compiled code depends on: torch, Python, and the device it was compiled for."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        target = f"cuda{torch.version.cuda}-sm{major}{minor}-{torch.cuda.get_device_name(device)}"
    else:
        target = f"{device.type}-{platform.machine()}"
    key = f"torch{torch.__version__}-py{sys.version_info.major}.{sys.version_info.minor}-{target}"
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", key)


def compiled_graphs() -> int:
    """Graphs Dynamo has compiled in this process so far (every recompile adds one)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


class CompileCache:
    def __init__(self, output_dir: str | Path, device: torch.device, url: str | None = None, main: bool = True):
        self.key = cache_key(device)
        self.local = Path(output_dir) / "compile_cache" / self.key
        self.remote = f"{url.rstrip('/')}/{self.key}.bin" if url else None
        self.main = main
        """Whether this rank writes the store's artifacts (every rank compiles the same)."""
        self.saved_at = compiled_graphs()

    def activate(self) -> None:
        """Point Inductor and Triton at the run's cache and load the store's artifacts."""
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        # importing torch._dynamo writes torch's default into the environment: only another value is the user's
        chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        if chosen is not None and os.path.abspath(chosen) != os.path.abspath(default_cache_dir()):
            logger.info("compile cache: TORCHINDUCTOR_CACHE_DIR=%s (set outside rlkube)", chosen)
        else:
            self.local.mkdir(parents=True, exist_ok=True)
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(self.local)
            os.environ.setdefault("TRITON_CACHE_DIR", str(self.local / "triton"))
            logger.info("compile cache: %s", self.local)
        if self.remote is None:
            return
        fs, path = fsspec.core.url_to_fs(self.remote)
        if not fs.exists(path):
            logger.info("compile cache: nothing at %s yet (this run compiles, then saves there)", self.remote)
            return
        blob = fs.cat_file(path)
        try:
            verify_blob(fs, path, blob, checkpoint_key(), self.remote)
        except Refused as e:
            logger.error("compile cache: %s; not loaded (this run compiles, then overwrites it)", e)
            return
        # a blob cut short by a killed writer loads as None (torch logs why): compile, then rewrite it
        info = torch.compiler.load_cache_artifacts(blob)
        logger.info("compile cache: loaded %s (%s)", self.remote, info)

    def save_if_compiled(self) -> None:
        """After a step: write the store's artifacts if anything compiled since the last save."""
        if self.remote is None or not self.main or compiled_graphs() == self.saved_at:
            return
        self.saved_at = compiled_graphs()
        artifacts = torch.compiler.save_cache_artifacts()
        if artifacts is None:
            return
        fs, path = fsspec.core.url_to_fs(self.remote)
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        sign_blob(fs, path, artifacts[0], checkpoint_key())
        logger.info("compile cache: saved %d bytes to %s", len(artifacts[0]), self.remote)
