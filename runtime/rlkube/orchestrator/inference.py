"""The inference replicas as the orchestrator sees them: where a rollout goes, and how a new
policy reaches all of them.

Routing is sticky per example (a stable hash of env and example id picks the replica), so the
`group_size` rollouts of one task, and every later visit of that task, share a replica and hit
its prefix cache. Concurrency is bounded across replicas by one semaphore
(`client.max_concurrent`): a rollout waits for a slot before it starts (backpressure).

Replicas join and rejoin the run's policy here: `rlkube inference` starts with generation
paused and weight version "default" (`inference.start_paused`), so requests sent to it wait.
`sync` brings every replica that does not serve the current policy to it (pause, load the
policy unless it is the base model's 0, tag the version, resume); the orchestrator runs it
before its first rollout and then every `client.resync_interval_s` (`watch`), so a replica that
restarted mid-run serves the current policy before any of its rollouts count. A policy update
passes a replica that does not answer (that `sync` is for).

A replica that does not answer is marked down (`mark_down`: by a rollout that lost it, or by
`sync`), and rollouts routed to it go to the healthy replicas instead until `sync` sees it back
on the policy, or, where no `sync` runs (an env worker: `watch_reachable`), until
`client.resync_interval_s` has passed and the next rollout probes it. Rollouts that were in
flight on it when it died failed with it, or, when `sync`/`watch_reachable` finds that it does
not even accept a connection any more (a vanished pod or node sends no reset), are abandoned
(`call_on`) instead of waiting out `client.timeout_s`; either way they come back marked as lost (`rlkube.orchestrator.rollouts`)
and are re-issued, never trained.

A LoRA run whose replicas serve the adapter with vLLM's LoRA support (`client.lora_adapter`)
loads each policy as that adapter, and requests name it from the first policy update on
(`request_model`); before it they name the base model, which is policy 0. A request sent with
the base model's name just before that first update finishes on the base model.
"""

import asyncio
import logging
import time
import zlib
from collections import defaultdict
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

from rlkube.config import ClientConfig, SamplingConfig
from rlkube.inference.client import InferenceError, ReplicaUnreachable

logger = logging.getLogger(__name__)


Policy = tuple[int, str | None]
"""(step, where its weights are: None for the base model, policy 0)."""


def serves_at_least(version: str | None, step: int) -> bool:
    """rlkube tags weight versions with policy steps; vLLM starts at "default"."""
    return version is not None and version.isdigit() and int(version) >= step


async def accepts_connections(url: str, timeout_s: float = 5.0) -> bool:
    """Whether a TCP connection to the URL's host and port opens: not when its name does not
    resolve, nothing listens, or the host is gone (a vanished pod or node)."""
    parts = urlsplit(url)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, parts.port or 80), timeout_s)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


def pick_replica(env_name: str, example_id: str, num_replicas: int) -> int:
    return zlib.crc32(f"{env_name}/{example_id}".encode()) % num_replicas


def model_contexts(base_urls: list[str], model: str, renderer_model: str, sampling: SamplingConfig, timeout_s: float) -> list:
    """One verifiers `ModelContext` per replica, using the token-in/token-out training client."""
    from verifiers.v1 import ModelContext, Sampling, TrainClientConfig
    from verifiers.v1.configs.client import ClientTimeoutConfig

    from rlkube.auth import TOKEN_ENV
    from rlkube.models.renderer import renderer_config_for

    renderer = renderer_config_for(renderer_model)
    vf_sampling = Sampling(temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_tokens)
    return [
        ModelContext(
            model=model,
            client=TrainClientConfig(
                base_url=url.rstrip("/") + "/v1",
                api_key_var=TOKEN_ENV,  # the run's token, as verifiers' API key
                renderer=renderer,
                renderer_model_name=renderer_model,
                timeout=ClientTimeoutConfig(read=timeout_s),
            ),
            sampling=vf_sampling,
        )
        for url in base_urls
    ]


class InferencePool:
    def __init__(
        self, config: ClientConfig, model: str, renderer_model: str, sampling: SamplingConfig,
        trainer_sends_weights: bool = False,
    ):
        self.config = config
        self.model = model
        self.trainer_sends_weights = trainer_sends_weights
        """`weights.type = "nccl"`: the trainer pauses, loads, tags and resumes the replicas."""
        self.base_urls = list(config.base_urls)
        self.adapter = config.lora_adapter
        self.contexts = {
            name: model_contexts(self.base_urls, name, renderer_model, sampling, config.timeout_s)
            for name in filter(None, (model, self.adapter))
        }
        self.slots = asyncio.Semaphore(config.max_concurrent)
        self.updating = asyncio.Lock()
        """Held while replicas change weights: `load_policy` and `sync` never interleave."""
        self.loaded: Policy = (0, None)
        """The newest policy `load_policy` put on every replica."""
        self.down: dict[int, float] = {}
        """Replicas marked down (index -> monotonic time of the newest mark); `mark_up` clears."""
        self.calls: dict[int, set[asyncio.Task]] = defaultdict(set)
        """Rollouts in flight per replica (`call_on`)."""
        self.abandoned: set[asyncio.Task] = set()

    @property
    def request_model(self) -> str:
        """The model name requests name now: the policy adapter once a policy is loaded as one."""
        return self.adapter if self.adapter is not None and self.loaded[0] > 0 else self.model

    def context_for(self, env_name: str, example_id: str, model: str | None = None):
        """The replica context of a task, requesting `model` (`request_model` when None)."""
        return self.context_at(self.replica_for(env_name, example_id), model)

    def context_at(self, replica: int, model: str | None = None):
        return self.contexts[model or self.request_model][replica]

    def replica_for(self, env_name: str, example_id: str) -> int:
        """The task's sticky replica, or while it is down, one of the healthy ones (the same
        for every rollout of the task); the sticky one when all are down."""
        sticky = pick_replica(env_name, example_id, len(self.base_urls))
        healthy = [i for i in range(len(self.base_urls)) if not self.is_down(i)]
        if sticky in healthy or not healthy:
            return sticky
        return healthy[pick_replica(env_name, example_id, len(healthy))]

    # --- replicas that do not answer -------------------------------------------------------

    def mark_down(self, replica: int) -> None:
        if not self.is_down(replica):
            logger.warning("inference replica %s is down: its rollouts go to the others", self.base_urls[replica])
        self.down[replica] = time.monotonic()

    def mark_up(self, replica: int) -> None:
        if self.down.pop(replica, None) is not None:
            logger.info("inference replica %s serves again", self.base_urls[replica])

    def is_down(self, replica: int) -> bool:
        marked = self.down.get(replica)
        return marked is not None and time.monotonic() - marked < self.config.resync_interval_s

    def down_since(self, replica: int, since: float) -> bool:
        """Whether the replica was marked down at `since` (monotonic) or later."""
        return self.down.get(replica, -1.0) >= since

    async def call_on(self, replica: int, call: Awaitable):
        """`await call` (a rollout on `replica`), or None if it was abandoned because the replica
        stopped answering (`_lost`). Cancelling the caller cancels the call as usual."""
        task = asyncio.ensure_future(call)
        self.calls[replica].add(task)
        try:
            result = await task
            return None if task in self.abandoned else result
        except asyncio.CancelledError:
            if task not in self.abandoned or asyncio.current_task().cancelling():
                raise
            return None
        finally:
            self.calls[replica].discard(task)
            self.abandoned.discard(task)

    def _lost(self, replica: int) -> None:
        """The replica does not answer: mark it down and abandon the rollouts in flight on it
        (a silent peer would hold them for `client.timeout_s`)."""
        self.mark_down(replica)
        if calls := self.calls.pop(replica, set()):
            logger.warning("abandoning %d rollout(s) in flight on %s", len(calls), self.base_urls[replica])
        for task in calls:
            self.abandoned.add(task)
            task.cancel()

    async def watch_reachable(self) -> None:
        """Where no `sync` runs (an env worker; the orchestrator drives the weights): every
        `client.resync_interval_s`, a replica that does not answer is lost (`_lost`), one that
        answers is up again (a restarted one holds the requests it gets while paused, until the
        orchestrator brings it to the policy)."""
        while True:
            await asyncio.sleep(self.config.resync_interval_s)
            states = await asyncio.gather(*(self._state(replica) for replica in range(len(self.base_urls))))
            for replica, state in enumerate(states):
                if state is not None:
                    self.mark_up(replica)

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
        a rollout then spans two versions, which its `policy_min`/`policy_max` record).

        A replica that does not answer (it died, or is restarting) is left to `sync`, which
        brings it to the newest loaded policy once it is back; a replica that answers with an
        error (a snapshot it cannot load) fails the update."""
        from rlkube.inference.client import pause, resume, update_weights

        async def one(url: str) -> bool:
            try:
                await pause(url, mode="keep")
                try:
                    await update_weights(url, step, location, timeout=timeout_s, as_adapter=self.adapter is not None)
                finally:
                    await resume(url)
            except ReplicaUnreachable as e:
                logger.warning("replica %s missed policy %d (it is brought to it when it answers again): %s", url, step, e)
                return False
            return True

        async with self.updating:
            loaded = await asyncio.gather(*(one(url) for url in self.base_urls))
            self.loaded = (step, location)
        logger.info("policy %d loaded on %d of %d replica(s) from %s", step, sum(loaded), len(loaded), location)

    # --- replicas that (re)start ---------------------------------------------------------

    async def sync(self, policy: Policy, timeout_s: float, fresh: bool = False) -> list[str]:
        """Bring every replica that does not serve `policy` (or a newer one this pool loaded)
        to it; returns the URLs of those it synced. A replica that does not answer, or fails
        meanwhile, is left for the next call.

        A replica needs it when its version is older than the policy ("default": it
        (re)started), or when it is paused while the orchestrator drives its weights (a previous
        orchestrator stopped between its pause and resume). When the trainer sends the weights
        (NCCL) it pauses the replicas around each broadcast, and a newer version means it ran
        ahead: both are fine.
        `fresh`: the run starts from the base model, so a replica serving any policy (of an
        abandoned attempt, or of an earlier run on a server kept running) reloads the model's own
        weights."""
        async with self.updating:
            step, location = max(policy, self.loaded, key=lambda p: p[0])
            states = await asyncio.gather(*(self._state(replica) for replica in range(len(self.base_urls))))
            stale = []
            for replica, (url, state) in enumerate(zip(self.base_urls, states)):
                if state is None:
                    continue
                version, paused = state
                if fresh and version not in ("default", "0"):
                    logger.info("replica %s serves policy %s of an earlier run: reloading the base model", url, version)
                    stale.append(url)
                elif not serves_at_least(version, step) or (paused and not self.trainer_sends_weights):
                    stale.append(url)
                else:
                    self.mark_up(replica)
            results = await asyncio.gather(
                *(self._sync_one(url, step, location, timeout_s) for url in stale), return_exceptions=True
            )
        synced = []
        for url, result in zip(stale, results):
            if isinstance(result, InferenceError):  # died again meanwhile: the next call retries
                logger.warning("could not bring replica %s to policy %d: %s", url, step, result)
            elif isinstance(result, BaseException):
                raise result
            else:
                logger.info("replica %s brought to policy %d", url, step)
                self.mark_up(self.base_urls.index(url))
                synced.append(url)
        return synced

    async def watch(self, policy: Callable[[], Policy], timeout_s: float) -> None:
        """`sync` every `client.resync_interval_s`, with the current `policy()`, until cancelled."""
        while True:
            await asyncio.sleep(self.config.resync_interval_s)
            await self.sync(policy(), timeout_s)

    async def _state(self, replica: int) -> tuple[str | None, bool] | None:
        """(weight version, paused) of a replica; None if it does not answer. It is lost only
        if it does not even accept a connection: a busy engine may take longer than the read
        timeout to answer, and abandoning its rollouts then would only add to its load."""
        from rlkube.inference.client import is_paused, weight_version

        url = self.base_urls[replica]
        try:
            return await weight_version(url), await is_paused(url)
        except InferenceError as e:
            logger.warning("inference replica %s does not answer: %s", url, e)
            if not await accepts_connections(url):
                self._lost(replica)
            return None

    async def _sync_one(self, url: str, step: int, location: str | None, timeout_s: float) -> None:
        """Pause, load `step`, tag the version, resume. Requests queued meanwhile run after it.
        The base model (policy 0) is only reloaded into a replica that served another policy: a
        (re)started engine has it, and an empty prefix cache."""
        from rlkube.inference.client import (
            load_base_weights,
            pause,
            resume,
            set_weight_version,
            update_weights,
            weight_version,
        )

        if step > 0 and (location is None or self.trainer_sends_weights):
            raise RuntimeError(
                f"inference replica {url} restarted, and policy {step} cannot be loaded into it: "
                "with weights.type = 'nccl' only the trainer sends weights, over an NCCL group the "
                "new replica is not part of; the run must restart from its newest checkpoint"
            )
        await pause(url, mode="keep")
        if step > 0:
            await update_weights(url, step, location, timeout=timeout_s, as_adapter=self.adapter is not None)
        else:
            if await weight_version(url) not in ("default", "0"):
                await load_base_weights(url, self.model, timeout_s)
            await set_weight_version(url, step)
        await resume(url)
