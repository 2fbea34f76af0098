"""rlkube's vLLM worker extension: load a published weight snapshot in place.

vLLM mixes this class into its worker (`--worker-extension-cls`), and the orchestrator reaches
it through vLLM's `/collective_rpc` route (see `rlkube.inference.client.update_weights`), so
every worker of a replica (all tensor-parallel ranks) loads the same snapshot.

A location is one of:
- a local directory `.../step_N` (a PVC);
- an fsspec URL `s3://bucket/run/weights/step_N`: downloaded to a temporary directory first;
- `grpc://host:port`: snapshot `step` pulled from the trainer's weight server into memory.

Either way, a snapshot not published yet is waited for up to `timeout` seconds.
"""

import logging
import time

from rlkube.transport.weights_grpc import fetch_snapshot
from rlkube.transport.weights_snapshot import iter_safetensors
from rlkube.transport.weights_storage import local_snapshot

logger = logging.getLogger(__name__)

GRPC_SCHEME = "grpc://"


class WeightLoaderExtension:
    """Methods added to vLLM's worker; `self` is the worker (it has `reload_weights`)."""

    def rlkube_load_weights(self, location: str, step: str = "-1", timeout: str = "600") -> str:
        """Load the snapshot at `location` into the running model. Arguments arrive as strings
        (vLLM's `/collective_rpc` only forwards strings). Returns a one-line summary."""
        start = time.perf_counter()
        if location.startswith(GRPC_SCHEME):
            files = fetch_snapshot(location.removeprefix(GRPC_SCHEME), int(step), float(timeout))
            self.reload_weights(weights_iterator=iter_safetensors(files))
            size = sum(map(len, files.values()))
        else:
            with local_snapshot(location, float(timeout)) as path:
                self.reload_weights(weights_path=path)
            size = None
        took = time.perf_counter() - start
        logger.info("loaded weights of step %s from %s in %.2fs", step, location, took)
        return f"step {step} from {location} in {took:.3f}s" + (f" ({size} bytes)" if size else "")
