"""Leader election: several operator replicas, one reconciling at a time, through a Lease.

Why a `coordination.k8s.io/v1` Lease and not kopf's peering: peering is a pause switch, not an
election. Operators of equal priority that see each other all pause (none reconciles); with
different priorities the lower ones pause, so replicas of one Deployment would need distinct
priorities by hand, and a dead peer is only noticed when its KopfPeering record goes stale
(60 s by default), with a cluster-wide `KopfPeering` CRD to install. A Lease is what
kube-controller-manager and every controller-runtime operator use: a built-in API, one object
in the operator's namespace, `kubectl get lease` shows who leads.

The protocol is client-go's (`leaderelection`): the holder renews the Lease every
`retry_period`; a candidate takes it when the record it last saw has not changed for
`lease_duration` on its own clock (no clock skew between nodes matters), or at once when the
holder released it. Writes are JSON patches that `test` the resourceVersion they were made from,
so of two candidates racing for an expired Lease exactly one wins. kopf runs only while this
replica holds the Lease; a holder that cannot renew within `renew_deadline` (shorter than
`lease_duration`, so it stops before anyone else may start) or that sees another holder stops
at once: `run` exits the process and the pod restarts as a candidate. A graceful stop (SIGTERM,
a rolling update) lets the reconcile pass in flight finish, then releases the Lease, so the
other replica takes over without waiting for it to expire.

Every Lease call runs on the elector's own thread, never in the event loop's default executor:
that pool runs the reconcile passes, and passes held up by slow API calls or by runs' pods
(each read is bounded, `podread`, but many can be in flight) would otherwise queue the renewal
behind them until the leader gives up.
"""

import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlparse

import urllib3
from aiohttp import web
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import BaseModel, ConfigDict, Field, model_validator

log = logging.getLogger(__name__)

DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
JSON_PATCH = "application/json-patch+json"
# A lost race for the Lease: another write came first (409), or our `test` of the
# resourceVersion failed (422).
LOST_RACE = (409, 422)
API_ERRORS = (ApiException, urllib3.exceptions.HTTPError)

Operate = Callable[..., Coroutine[Any, Any, None]]


class LeadershipLost(Exception):
    """This replica no longer holds the Lease: it must stop reconciling now."""


class Election(BaseModel):
    """Who competes for which Lease, and the timing (seconds, as in client-go's defaults)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lease_name: str = Field(pattern=DNS_SUBDOMAIN, max_length=253)
    namespace: str = Field(pattern=DNS_LABEL, max_length=63)
    identity: str = Field(min_length=1, max_length=253)
    lease_duration: float = Field(15.0, gt=0)
    renew_deadline: float = Field(10.0, gt=0)
    retry_period: float = Field(2.0, gt=0)

    @model_validator(mode="after")
    def _holder_stops_before_anyone_takes_over(self) -> "Election":
        if not self.renew_deadline < self.lease_duration:
            raise ValueError(
                f"renew_deadline ({self.renew_deadline}) must be shorter than lease_duration "
                f"({self.lease_duration}): a holder that cannot renew must stop before another takes over")
        if not self.retry_period < self.renew_deadline:
            raise ValueError(
                f"retry_period ({self.retry_period}) must be shorter than renew_deadline "
                f"({self.renew_deadline}): the holder must get to retry a failed renewal")
        return self


def own_identity() -> str:
    """The pod's name (POD_NAME, from the downward API), else the host name made unique."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def _micro_time() -> str:
    """A Lease's MicroTime: RFC 3339 with microseconds."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseLock:
    """The Lease through the official client (blocking calls: run them off the event loop).

    `holder` is the identity last seen holding the Lease (None: nobody)."""

    def __init__(self, api: client.ApiClient, election: Election):
        self._leases = client.CoordinationV1Api(api)
        self.election = election
        self.holder: str | None = None
        self._observed: tuple | None = None
        self._observed_at = 0.0

    def try_acquire_or_renew(self) -> bool:
        """Take or renew the Lease; False when another holder's Lease is still valid or another
        candidate won the race. API errors other than a lost race are raised."""
        lease = self._read()
        if lease is None:
            return self._create()
        spec = lease.get("spec") or {}
        self._observe(lease)
        self.holder = spec.get("holderIdentity") or None
        if self.holder not in (None, self.election.identity) and not self._expired():
            return False
        renewing = self.holder == self.election.identity
        now = _micro_time()
        return self._write(lease, {
            "holderIdentity": self.election.identity,
            "leaseDurationSeconds": math.ceil(self.election.lease_duration),
            "acquireTime": spec.get("acquireTime") if renewing else now,
            "renewTime": now,
            "leaseTransitions": (spec.get("leaseTransitions") or 0) + (0 if renewing else 1),
        })

    def release(self) -> None:
        """Give the Lease up (holder emptied, so candidates take it without waiting for it to
        expire), if this replica still holds it."""
        lease = self._read()
        spec = (lease or {}).get("spec") or {}
        if spec.get("holderIdentity") != self.election.identity:
            return
        released = {k: v for k, v in spec.items() if k != "holderIdentity"} | {"renewTime": _micro_time()}
        if self._write(lease, released):
            self.holder = None
            log.info("released lease %s/%s", self.election.namespace, self.election.lease_name)

    def _observe(self, lease: dict) -> None:
        """Restart the expiry clock whenever the record changes (a renewal, a new holder)."""
        spec = lease.get("spec") or {}
        record = (spec.get("holderIdentity"), spec.get("renewTime"), lease["metadata"].get("resourceVersion"))
        if record != self._observed:
            self._observed, self._observed_at = record, time.monotonic()

    def _expired(self) -> bool:
        return time.monotonic() > self._observed_at + self.election.lease_duration

    def _read(self) -> dict | None:
        try:
            response = self._leases.read_namespaced_lease(
                self.election.lease_name, self.election.namespace,
                _preload_content=False, _request_timeout=self.election.renew_deadline)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return json.loads(response.data)

    def _create(self) -> bool:
        spec = {"holderIdentity": self.election.identity, "leaseDurationSeconds": math.ceil(self.election.lease_duration),
                "acquireTime": _micro_time(), "renewTime": _micro_time(), "leaseTransitions": 0}
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.election.lease_name, "namespace": self.election.namespace}, "spec": spec}
        try:
            self._leases.create_namespaced_lease(
                self.election.namespace, body, _preload_content=False, _request_timeout=self.election.renew_deadline)
        except ApiException as e:
            if e.status in LOST_RACE:
                return False
            raise
        self.holder = self.election.identity
        return True

    def _write(self, lease: dict, spec: dict) -> bool:
        """Replace the spec, only if the Lease is still the version read."""
        patch = [{"op": "test", "path": "/metadata/resourceVersion", "value": lease["metadata"]["resourceVersion"]},
                 {"op": "add", "path": "/spec", "value": spec}]
        try:
            self._leases.patch_namespaced_lease(
                self.election.lease_name, self.election.namespace, patch,
                _content_type=JSON_PATCH, _preload_content=False, _request_timeout=self.election.renew_deadline)
        except ApiException as e:
            if e.status in LOST_RACE:
                return False
            raise
        self.holder = spec.get("holderIdentity")
        return True


async def lead(lock: LeaseLock, operate: Operate, stop: asyncio.Event, *, standby_liveness: str | None = None) -> None:
    """Wait for the Lease (or `stop`), then run `operate(stop_flag=stop)` (kopf.operator, its
    other arguments bound) while renewing it. Returns after `operate` ends, the Lease released;
    raises LeadershipLost, with `operate` cancelled, as soon as the Lease is lost. A cancelled
    `lead` (a crash, in tests) cancels `operate` and releases nothing."""
    lease_thread = ThreadPoolExecutor(1, thread_name_prefix=f"lease-{lock.election.lease_name}")
    try:
        await _lead(lock, operate, stop, lease_thread, standby_liveness)
    finally:  # a renewal hung on a lost API server ends by its own request timeout
        lease_thread.shutdown(wait=False, cancel_futures=True)


async def _lead(lock: LeaseLock, operate: Operate, stop: asyncio.Event, lease_thread: ThreadPoolExecutor,
                standby_liveness: str | None) -> None:
    async with _serving_liveness(standby_liveness):
        if not await _acquire(lock, stop, lease_thread):
            return
    election = lock.election
    log.info("%s holds lease %s/%s: reconciling", election.identity, election.namespace, election.lease_name)
    operator = asyncio.create_task(operate(stop_flag=stop))
    try:
        await _renew_while_running(lock, operator, lease_thread)
    except BaseException:
        operator.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await operator
        raise
    await asyncio.get_running_loop().run_in_executor(lease_thread, lock.release)
    if not operator.cancelled():  # kopf ends by cancelling itself when stopped
        operator.result()


async def _acquire(lock: LeaseLock, stop: asyncio.Event, lease_thread: ThreadPoolExecutor) -> bool:
    """Try every retry_period until the Lease is ours (True) or `stop` is set (False)."""
    loop = asyncio.get_running_loop()
    waiting_for = None
    while not stop.is_set():
        try:
            if await loop.run_in_executor(lease_thread, lock.try_acquire_or_renew):
                return True
        except API_ERRORS as e:  # the API server unreachable or failing: keep trying
            log.warning("cannot read lease %s: %s", lock.election.lease_name, e)
        if lock.holder != waiting_for:
            waiting_for = lock.holder
            log.info("waiting for lease %s, held by %s", lock.election.lease_name, waiting_for)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), lock.election.retry_period)
    return False


async def _renew_while_running(lock: LeaseLock, operator: asyncio.Task, lease_thread: ThreadPoolExecutor) -> None:
    """Renew every retry_period until `operator` ends. A renewal counts from when it was sent
    (the Lease was written after that); a failed one is retried until renew_deadline has passed
    since the last success. Uses no tasks of its own: kopf cancels any task that is younger than
    it when it stops."""
    loop, election = asyncio.get_running_loop(), lock.election
    renewed_at = loop.time()
    while True:
        await asyncio.wait({operator}, timeout=election.retry_period)
        if operator.done():
            return
        sent_at, deadline = loop.time(), renewed_at + election.renew_deadline
        attempt = loop.run_in_executor(lease_thread, lock.try_acquire_or_renew)
        await asyncio.wait({attempt}, timeout=max(0.0, deadline - sent_at))
        error = attempt.exception() if attempt.done() else None
        if attempt.done() and error is None:
            if attempt.result():
                renewed_at = sent_at
                continue
            if lock.holder not in (None, election.identity):
                raise LeadershipLost(f"lease {election.lease_name} is held by {lock.holder}")
        if loop.time() >= deadline:
            raise LeadershipLost(f"lease {election.lease_name} not renewed for {election.renew_deadline} s")
        if error is not None:
            log.warning("cannot renew lease %s: %s", election.lease_name, error)


async def _standby_health(_: web.Request) -> web.Response:
    return web.json_response({"leader": False})


@contextlib.asynccontextmanager
async def _serving_liveness(endpoint: str | None):
    """Answer the liveness probe (`http://host:port/path`) while this replica waits, so that
    the kubelet does not restart a healthy candidate; kopf serves it once it runs."""
    if not endpoint:
        yield
        return
    url = urlparse(endpoint)
    app = web.Application()
    app.router.add_get(url.path or "/", _standby_health)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, url.hostname, url.port or 80).start()
    try:
        yield
    finally:
        await runner.cleanup()


async def _until_signalled(lock: LeaseLock, operate: Operate, liveness: str | None) -> None:
    """SIGTERM/SIGINT stop a waiting candidate; once kopf runs, it handles them itself."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await lead(lock, operate, stop, standby_liveness=liveness)


def run(lock: LeaseLock, operate: Operate, *, liveness: str | None) -> int:
    """main()'s loop under election: 0 after a graceful stop. A lost Lease ends the process at
    once with 1 (os._exit: a reconcile pass in a worker thread would otherwise go on writing);
    Kubernetes restarts the container, a candidate again."""
    try:
        asyncio.run(_until_signalled(lock, operate, liveness))
    except LeadershipLost as e:
        log.error("%s; exiting so that the pod restarts as a candidate", e)
        logging.shutdown()
        os._exit(1)
    return 0
