"""The inference replicas as the orchestrator sees them: where a rollout goes, and how a new
policy reaches all of them.

Routing is sticky per example (a stable hash of env and example id picks the replica), so the
`group_size` rollouts of one task, and every later visit of that task, share a replica and hit
its prefix cache. Concurrency is bounded across replicas by one semaphore
(`client.max_concurrent`): a rollout waits for a slot before it starts (backpressure).
"""

import asyncio
import logging
import zlib
from contextlib import asynccontextmanager

from rlkube.config import ClientConfig, SamplingConfig

logger = logging.getLogger(__name__)


def pick_replica(env_name: str, example_id: str, num_replicas: int) -> int:
    return zlib.crc32(f"{env_name}/{example_id}".encode()) % num_replicas


def model_contexts(base_urls: list[str], model: str, renderer_model: str, sampling: SamplingConfig, timeout_s: float) -> list:
    """One verifiers `ModelContext` per replica, using the token-in/token-out training client."""
    from verifiers.v1 import ModelContext, Sampling, TrainClientConfig
    from verifiers.v1.configs.client import ClientTimeoutConfig

    from rlkube.models.renderer import renderer_config_for

    renderer = renderer_config_for(renderer_model)
    vf_sampling = Sampling(temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_tokens)
    return [
        ModelContext(
            model=model,
            client=TrainClientConfig(
                base_url=url.rstrip("/") + "/v1",
                api_key_var="RLKUBE_INFERENCE_API_KEY",
                renderer=renderer,
                renderer_model_name=renderer_model,
                timeout=ClientTimeoutConfig(read=timeout_s),
            ),
            sampling=vf_sampling,
        )
        for url in base_urls
    ]


class InferencePool:
    def __init__(self, config: ClientConfig, model: str, renderer_model: str, sampling: SamplingConfig):
        self.config = config
        self.base_urls = list(config.base_urls)
        self.contexts = model_contexts(self.base_urls, model, renderer_model, sampling, config.timeout_s)
        self.slots = asyncio.Semaphore(config.max_concurrent)

    def context_for(self, env_name: str, example_id: str):
        return self.contexts[pick_replica(env_name, example_id, len(self.base_urls))]

    @asynccontextmanager
    async def slot(self):
        async with self.slots:
            yield

    async def wait_until_healthy(self, timeout_s: float) -> None:
        from rlkube.inference.client import wait_until_healthy

        await asyncio.gather(*(wait_until_healthy(url, timeout_s) for url in self.base_urls))

    async def load_policy(self, step: int, location: str, timeout_s: float = 600) -> None:
        """Pause, load policy `step` from `location`, resume: on every replica at once.
        Pausing keeps in-flight requests; they finish on the new weights after `resume` (such
        a rollout then spans two versions, which its `policy_min`/`policy_max` record)."""
        from rlkube.inference.client import pause, resume, update_weights

        async def one(url: str) -> None:
            await pause(url, mode="keep")
            try:
                await update_weights(url, step, location, timeout=timeout_s)
            finally:
                await resume(url)

        await asyncio.gather(*(one(url) for url in self.base_urls))
        logger.info("policy %d loaded on %d replica(s) from %s", step, len(self.base_urls), location)
