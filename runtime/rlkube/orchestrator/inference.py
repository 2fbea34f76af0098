"""The inference replicas as the orchestrator sees them: where a rollout goes, and how a new
policy reaches all of them.

Routing is sticky per example (rendezvous hashing of env, example id and replica URL picks the
replica), so the `group_size` rollouts of one task, and every later visit of that task, share a
replica and hit its prefix cache; a replica that joins takes over only its share of the tasks,
and one that is down hands over only its own. Concurrency is bounded across replicas by one
semaphore (`client.max_concurrent`): a rollout waits for a slot before it starts (backpressure).

Replicas join and rejoin the run's policy here: `rlkube inference` starts with generation
paused and weight version "default" (`inference.start_paused`), so requests sent to it wait.
`sync` brings every replica that does not serve the current policy to it (pause, load the
policy unless it is the base model's 0, tag the version, resume); the orchestrator runs it
before its first rollout and then every `client.resync_interval_s` (`watch`), so a replica that
restarted mid-run serves the current policy before any of its rollouts count. A policy update
passes a replica that does not answer (that `sync` is for), and one that stops accepting
connections while it is being updated is lost then, not after the call's timeout: the update
of every replica waits for the slowest.

A replica that does not answer is marked down (`mark_down`: by a rollout that lost it, or by
`sync`), and rollouts routed to it go to the healthy replicas instead until `sync` sees it back
on the policy, or, where no `sync` runs (an env worker: `watch_reachable`), until
`client.resync_interval_s` has passed and the next rollout probes it. Rollouts that were in
flight on it when it died failed with it, or, when `sync`/`watch_reachable` finds that it does
not even accept a connection any more (a vanished pod or node sends no reset), are abandoned
(`call_on`) instead of waiting out `client.timeout_s`; either way they come back marked as lost (`rlkube.orchestrator.rollouts`)
and are re-issued, never trained.

The set of replicas may change while the run goes on (`client.base_urls_file`, which the
operator keeps as `spec.inference.replicas` says: `kubectl scale rlrun`). The file is read again
at every `sync` (and `watch_reachable`): a replica it newly lists joins the routing only once
`sync` has brought it to the current policy (an env worker's pool: once it answers unpaused,
which only the orchestrator's `sync` makes it), so it never gets a request before; one it no
longer lists leaves the routing at once and drains: its rollouts in flight finish, or, when it
stops accepting connections (its pod is deleted), are abandoned and re-issued like a lost
replica's. Routing keys replicas by URL, so a rollout in flight keeps its replica whatever the
list becomes; the sticky assignment of tasks to replicas changes with the count (each task's
prefix cache is cold once).

A LoRA run whose replicas serve the adapter with vLLM's LoRA support (`client.lora_adapter`)
loads each policy as that adapter, and requests name it from the first policy update on
(`request_model`); before it they name the base model, which is policy 0. A request sent with
the base model's name just before that first update finishes on the base model.

A pool member (`member`: `orchestrator.pool.member`) shares the replicas with the pool's other
members: every request names its adapter, from policy 0 on (the step-0 adapter the pool
trainer publishes when it joins: LoRA's B = 0, the base model's outputs), so no request of its
shares a batch unnamed with another member's. It loads each policy as its adapter, by name,
without pausing the server (the others are generating), and a replica's version is its
adapter's step there (`rlkube.inference.client.adapter_step`), not the server's weight version,
which a pool does not set. Nor do its rollouts take their tokens' versions from the engine's
report (that same server version): their lag counts from the clock's version at their start.
"""

import asyncio
import hashlib
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
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


def pick_replica(env_name: str, example_id: str, urls: Sequence[str]) -> str:
    """The task's replica among `urls`: the one whose hash with the task is highest (rendezvous
    hashing). A task moves only when its replica leaves or a new one outranks it, so scaling N
    replicas to N+1 moves about 1/(N+1) of the tasks, where `hash % N` would move N/(N+1) of
    them and lose their prefix caches."""
    task = f"{env_name}/{example_id}"
    return max(urls, key=lambda url: hashlib.blake2b(f"{task}@{url}".encode(), digest_size=8).digest())


def model_contexts(base_urls: list[str], model: str, renderer_model: str, sampling: SamplingConfig, timeout_s: float) -> list:
    """One verifiers `ModelContext` per replica, using the token-in/token-out training client."""
    from verifiers.v1 import ModelContext, Sampling, TrainClientConfig
    from verifiers.v1.configs.client import ClientTimeoutConfig

    from rlkube.auth import http_headers
    from rlkube.models.renderer import renderer_config_for
    from rlkube.scopes import GENERATE

    renderer = renderer_config_for(renderer_model)
    vf_sampling = Sampling(temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_tokens)
    return [
        ModelContext(
            model=model,
            client=TrainClientConfig(
                base_url=url.rstrip("/") + "/v1",
                headers=http_headers(GENERATE),  # the run's credential, from memory: never an env var of env code
                renderer=renderer,
                renderer_model_name=renderer_model,
                timeout=ClientTimeoutConfig(read=timeout_s),
            ),
            sampling=vf_sampling,
        )
        for url in base_urls
    ]


def listed_urls(path: str) -> list[str]:
    """The base URLs a `client.base_urls_file` lists (one a line, blank lines ignored); empty
    when the file is missing or unreadable."""
    try:
        with open(path) as f:
            return [line.strip() for line in f if line.strip()]
    except OSError:
        return []


class InferencePool:
    def __init__(
        self, config: ClientConfig, model: str, renderer_model: str, sampling: SamplingConfig,
        trainer_sends_weights: bool = False, member: str | None = None,
    ):
        self.config = config
        self.member = member
        """A pool member's name: its adapter's model name on the pool's replicas (None: a solo run)."""
        self.model = model
        self.renderer_model, self.sampling = renderer_model, sampling
        self.trainer_sends_weights = trainer_sends_weights
        """`weights.type = "nccl"`: the trainer pauses, loads, tags and resumes the replicas."""
        self.base_urls = self._listed() or list(config.base_urls)
        """The replicas requests are routed to, by URL."""
        self.adapter = member or config.lora_adapter
        self.contexts: dict[str, dict[str, object]] = {name: {} for name in filter(None, (model, self.adapter))}
        """model name -> replica URL -> its verifiers `ModelContext` (`context_at`)."""
        self.slots = asyncio.Semaphore(config.max_concurrent)
        self.updating = asyncio.Lock()
        """Held while replicas change weights or the set of replicas changes: `load_policy` and
        `sync` never interleave."""
        self.loaded: Policy = (0, None)
        """The newest policy `load_policy` put on every replica."""
        self.down: dict[str, float] = {}
        """Replicas marked down (URL -> monotonic time of the newest mark); `mark_up` clears."""
        self.calls: dict[str, set[asyncio.Task]] = defaultdict(set)
        """Rollouts in flight per replica (`call_on`)."""
        self.abandoned: set[asyncio.Task] = set()
        self.draining: set[str] = set()
        """Replicas no longer listed that had rollouts in flight when they left (`refresh`)."""
        self.joined: set[str] = set()
        """Replicas that joined while the process ran (`_join`)."""
        self.served_by_joined = 0
        """Rollouts those replicas served since the last `metrics()`."""

    @property
    def request_model(self) -> str:
        """The model name requests name now: the policy adapter once a policy is loaded as one
        (a pool member's always: its step-0 adapter before its first policy)."""
        if self.member is not None:
            return self.member
        return self.adapter if self.adapter is not None and self.loaded[0] > 0 else self.model

    @property
    def engine_versions(self) -> bool:
        """Whether the engine's per-token weight versions are this run's policy steps (not on a
        pool, whose server version is no member's)."""
        return self.member is None

    def context_for(self, env_name: str, example_id: str, model: str | None = None):
        """The replica context of a task, requesting `model` (`request_model` when None)."""
        return self.context_at(self.replica_for(env_name, example_id), model)

    def context_at(self, replica: str, model: str | None = None):
        """The context of the replica at URL `replica`, made on first use."""
        model = model or self.request_model
        contexts = self.contexts[model]
        if replica not in contexts:
            contexts[replica] = model_contexts(
                [replica], model, self.renderer_model, self.sampling, self.config.timeout_s)[0]
        return contexts[replica]

    def replica_for(self, env_name: str, example_id: str) -> str:
        """The task's sticky replica (a URL), or while it is down, one of the healthy ones (the
        same for every rollout of the task); the sticky one when all are down."""
        healthy = [url for url in self.base_urls if not self.is_down(url)]
        return pick_replica(env_name, example_id, healthy or self.base_urls)

    # --- the set of replicas ---------------------------------------------------------------

    def _listed(self) -> list[str]:
        return listed_urls(self.config.base_urls_file) if self.config.base_urls_file else []

    def refresh(self) -> tuple[list[str], list[str]]:
        """Read `client.base_urls_file` again: replicas it no longer lists leave the routing at
        once (those with rollouts in flight drain, `settle_draining`); returns the listing and
        the listed replicas not routed yet, which the caller adds (`_join`, in the listing's
        order) once they serve the policy."""
        listed = self._listed()
        if not listed or not any(u in listed for u in self.base_urls):
            return listed, []  # routing keeps its replicas until a listed one has joined
        for url in [u for u in self.base_urls if u not in listed]:
            self.base_urls.remove(url)
            self.down.pop(url, None)
            logger.info("inference replica %s left the pool (%d in flight drain)", url, len(self.calls.get(url, ())))
            if self.calls.get(url):
                self.draining.add(url)
        return listed, [url for url in listed if url not in self.base_urls]

    def _join(self, url: str, listed: list[str]) -> None:
        """Route requests to `url` too, in the order of `listed` (what `refresh` read, which
        lists every routed replica and `url`)."""
        self.base_urls = [u for u in listed if u in self.base_urls or u == url]
        self.joined.add(url)
        logger.info("inference replica %s joined the pool: %d replica(s)", url, len(self.base_urls))

    async def settle_draining(self) -> None:
        """A draining replica is done when its rollouts are; one that no longer accepts
        connections (its pod is gone) loses them (`_lost`: they are re-issued)."""
        for url in list(self.draining):
            if self.calls.get(url) and not await accepts_connections(url):
                self._lost(url)
            if not self.calls.get(url):
                self.draining.discard(url)

    def served(self, replica: str) -> None:
        """A rollout on `replica` finished (it did not lose its replica)."""
        self.served_by_joined += replica in self.joined

    def metrics(self) -> dict[str, float]:
        """`inference/replicas` routed to now, `inference/draining`, and
        `rollouts/on_joined_replicas`: served since the last call by replicas that joined while
        the process ran (a scale-up's)."""
        served, self.served_by_joined = self.served_by_joined, 0
        return {"inference/replicas": float(len(self.base_urls)), "inference/draining": float(len(self.draining)),
                "rollouts/on_joined_replicas": float(served)}

    # --- replicas that do not answer -------------------------------------------------------

    def mark_down(self, replica: str) -> None:
        if not self.is_down(replica):
            logger.warning("inference replica %s is down: its rollouts go to the others", replica)
        self.down[replica] = time.monotonic()

    def mark_up(self, replica: str) -> None:
        if self.down.pop(replica, None) is not None:
            logger.info("inference replica %s serves again", replica)

    def is_down(self, replica: str) -> bool:
        marked = self.down.get(replica)
        return marked is not None and time.monotonic() - marked < self.config.resync_interval_s

    def down_since(self, replica: str, since: float) -> bool:
        """Whether the replica was marked down at `since` (monotonic) or later."""
        return self.down.get(replica, -1.0) >= since

    async def call_on(self, replica: str, call: Awaitable):
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

    def _lost(self, replica: str) -> None:
        """The replica does not answer: mark it down and abandon the rollouts in flight on it
        (a silent peer would hold them for `client.timeout_s`)."""
        self.mark_down(replica)
        if calls := self.calls.pop(replica, set()):
            logger.warning("abandoning %d rollout(s) in flight on %s", len(calls), replica)
        for task in calls:
            self.abandoned.add(task)
            task.cancel()

    async def watch_reachable(self) -> None:
        """Where no `sync` runs (an env worker; the orchestrator drives the weights): every
        `client.resync_interval_s`, a replica that does not answer is lost (`_lost`), one that
        answers is up again (a restarted one holds the requests it gets while paused, until the
        orchestrator brings it to the policy). A newly listed replica joins once it answers
        unpaused: only the orchestrator's `sync` resumes a new replica, after loading the policy."""
        while True:
            await asyncio.sleep(self.config.resync_interval_s)
            listed, joining = self.refresh()
            urls = self.base_urls + joining
            states = await asyncio.gather(*(self._state(url) for url in urls))
            for url, state in zip(urls, states):
                if state is None:
                    continue
                if url in joining:
                    if state[1] or state[0] in (None, "default"):
                        continue
                    self._join(url, listed)
                self.mark_up(url)
            await self.settle_draining()

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

        async def update(url: str) -> None:
            if self.member is not None:  # the others generate on: the adapter is loaded in place
                await update_weights(url, step, location, timeout=timeout_s, as_adapter=True, adapter_name=self.member)
                return
            await pause(url, mode="keep")
            try:
                await update_weights(url, step, location, timeout=timeout_s, as_adapter=self.adapter is not None)
            finally:
                await resume(url)

        async def one(url: str) -> bool:
            try:
                await self._while_reachable(url, update(url))
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
            listed, joining = self.refresh()
            step, location = max(policy, self.loaded, key=lambda p: p[0])
            urls = self.base_urls + joining
            states = await asyncio.gather(*(self._state(url) for url in urls))
            stale, current = [], []
            for url, state in zip(urls, states):
                if state is None:
                    continue
                version, paused = state
                if fresh and version not in ("default", "0"):
                    logger.info("replica %s serves policy %s of an earlier run: reloading the base model", url, version)
                    stale.append(url)
                elif not serves_at_least(version, step) or (paused and not self.trainer_sends_weights):
                    stale.append(url)
                else:
                    current.append(url)
            results = await asyncio.gather(
                *(self._while_reachable(url, self._sync_one(url, step, location, timeout_s)) for url in stale),
                return_exceptions=True,
            )
            synced = []
            for url, result in zip(stale, results):
                if isinstance(result, InferenceError):  # died again meanwhile: the next call retries
                    logger.warning("could not bring replica %s to policy %d: %s", url, step, result)
                elif isinstance(result, BaseException):
                    raise result
                else:
                    logger.info("replica %s brought to policy %d", url, step)
                    synced.append(url)
            for url in current + synced:
                if url in joining:  # it serves the policy: from now on it gets requests
                    self._join(url, listed)
                self.mark_up(url)
            await self.settle_draining()
        return synced

    async def watch(self, policy: Callable[[], Policy], timeout_s: float) -> None:
        """`sync` every `client.resync_interval_s`, with the current `policy()`, until cancelled."""
        while True:
            await asyncio.sleep(self.config.resync_interval_s)
            await self.sync(policy(), timeout_s)

    async def _while_reachable(self, url: str, call: Awaitable):
        """`await call` (a weight update of `url`), abandoned as soon as the replica accepts no
        connection (checked every `client.resync_interval_s`): it is then lost (`_lost`) and
        `ReplicaUnreachable` raised. A replica gone with its network leaves the request silent
        until its timeout (a minute for a pause, `timeout_s` for a load), and the update of every
        other replica, which holds `updating`, would wait for it."""
        task = asyncio.ensure_future(call)
        try:
            while not (await asyncio.wait({task}, timeout=self.config.resync_interval_s))[0]:
                if not await accepts_connections(url):
                    self._lost(url)
                    raise ReplicaUnreachable(f"{url} stopped accepting connections during a weight update")
            return task.result()
        finally:
            task.cancel()

    async def _state(self, url: str) -> tuple[str | None, bool] | None:
        """(weight version, paused) of a replica; None if it does not answer. It is lost only
        if it does not even accept a connection: a busy engine may take longer than the read
        timeout to answer, and abandoning its rollouts then would only add to its load."""
        from rlkube.inference.client import adapter_step, is_paused, weight_version

        try:
            if self.member is not None:  # its adapter's step there; the shared server's pause is not its own
                step = await adapter_step(url, self.member)
                return ("default" if step is None else str(step)), False
            return await weight_version(url), await is_paused(url)
        except InferenceError as e:
            logger.warning("inference replica %s does not answer: %s", url, e)
            if not await accepts_connections(url):
                self._lost(url)
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
        if self.member is not None:  # its adapter, step 0 included, without pausing the others
            if location is None:
                raise RuntimeError(f"pool member {self.member}: policy {step} has no location to load its adapter from")
            await update_weights(url, step, location, timeout=timeout_s, as_adapter=True, adapter_name=self.member)
            return
        await pause(url, mode="keep")
        if step > 0:
            await update_weights(url, step, location, timeout=timeout_s, as_adapter=self.adapter is not None)
        else:
            if await weight_version(url) not in ("default", "0"):
                await load_base_weights(url, self.model, timeout_s)
            await set_weight_version(url, step)
        await resume(url)
