"""Each run's reconcile loop: one kopf daemon per RLRun/SFTRun that passes when something
happened to the run or its children, and otherwise only on a slow resync.

What it saves the API server:
- events of the run's children (watched pods, Jobs, StatefulSets and Deployments carrying the
  run's uid label) and new generations of the run wake its loop at once, so the resync can be
  slow (`interval`) without the operator reacting late;
- the status is written only where it changed: the loop remembers the status it wrote (the
  operator is its only writer), so a pass compares with that, not with a watch event that may
  not have arrived yet;
- progress alone (step, reward, checkpoint from the orchestrator's GET /status, no API read) is
  written at most every `progress_interval` seconds; phase and condition changes at once;
- a finished run (Succeeded/Failed) passes only on events, or when its
  `ttlSecondsAfterFinished` is due.

kopf runs one daemon per object, so two passes never race on the same run.
"""

import asyncio
import json
import logging
import math
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import kopf
from kubernetes.client.exceptions import ApiException

from rlkube_operator import metrics
from rlkube_operator.conditions import printable
from rlkube_operator.names import RUN_UID_LABEL, RunRef
from rlkube_operator.reconcile import Reconciler, Result

log = logging.getLogger(__name__)

PROGRESS_FIELDS = frozenset({"step", "reward", "evalReward", "lastCheckpointStep"})
FINISHED = ("Succeeded", "Failed")


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Pacing:
    interval: float = 60.0
    """Seconds between resyncs of a live run that nothing woke."""

    progress_interval: float = 60.0
    """Seconds between two writes of progress alone (step, reward, checkpoint)."""


@dataclass
class _RunState:
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    generation: int | None = None
    """The run's generation at the start of the last pass: a watch event of a newer one wakes it."""
    status: dict | None = None
    """The status as last written (None: not yet, read it from the body)."""
    written_at: float = -math.inf


def status_patch(written: dict, new: dict, progress_due: bool) -> dict:
    """The fields of `new` that differ from the status `written`; nothing while only progress
    fields changed and their write is not due yet."""
    changed = {k: v for k, v in new.items() if written.get(k) != v}
    if changed.keys() <= PROGRESS_FIELDS and not progress_due:
        return {}
    return changed


def seconds_to_expiry(spec: dict, status: dict, now: str) -> float | None:
    """Seconds before a finished run's `ttlSecondsAfterFinished` is due; None without one."""
    ttl, end = spec.get("ttlSecondsAfterFinished"), status.get("completionTime")
    if ttl is None or not end:
        return None
    return ttl - (datetime.fromisoformat(now) - datetime.fromisoformat(end)).total_seconds()


class RunLoops:
    """The daemons of all runs, and the watch handlers that wake them."""

    def __init__(self, reconciler: Reconciler, pacing: Pacing):
        self.reconciler = reconciler
        self.pacing = pacing
        self._runs: dict[str, _RunState] = {}

    def wake_for_child(self, type: str | None, labels: kopf.Labels, **_) -> None:
        """kopf `on.event` of a child or pod: its run passes now. Not for the listing that
        starts each watch (type None): a reconnecting watch lists every child again, which
        would wake every run; a change made while it was away waits for the resync."""
        if type is None:
            return
        if (state := self._runs.get(labels.get(RUN_UID_LABEL, ""))) is not None:
            state.wakeup.set()

    def wake_for_run(self, meta: kopf.Meta, **_) -> None:
        """kopf `on.event` of the run: a new generation (spec change) passes now; status writes,
        the loop's own, do not."""
        state = self._runs.get(meta.uid or "")
        if state is not None and meta.get("generation") != state.generation:
            state.wakeup.set()

    async def run(self, kind: str, body: kopf.Body, meta: kopf.Meta, stopped: kopf.DaemonStopped, **_) -> None:
        """kopf daemon of one run: pass, then sleep until woken, due, or stopped."""
        state = self._runs.setdefault(meta.uid, _RunState())
        try:
            while not stopped:
                timeout = await self._pass(kind, body, state)
                await _sleep(state.wakeup, stopped, timeout)
        finally:
            self._runs.pop(meta.uid, None)

    async def _pass(self, kind: str, body: kopf.Body, state: _RunState) -> float | None:
        """One reconcile and its status write; the seconds until the next is due (None: only
        when woken)."""
        state.wakeup.clear()
        plain = json.loads(json.dumps(body, default=dict))
        if state.status is not None:
            plain["status"] = state.status
        state.generation = plain["metadata"].get("generation")
        started, now = time.monotonic(), now_iso()
        try:
            result = await asyncio.to_thread(self.reconciler.reconcile, kind, plain, now)
        finally:
            metrics.RECONCILE_SECONDS.labels(kind).observe(time.monotonic() - started)
        metrics.RECONCILES.labels(kind, "error" if result.error else "ok").inc()
        for type_, reason, message in result.events:
            kopf.event(body, type=type_, reason=printable(reason), message=printable(message)[:1024])
        if result.status.get("message"):
            result.status["message"] = printable(result.status["message"])
        written = plain.get("status") or {}
        pending = await self._write_status(kind, plain["metadata"], state, written, result.status)
        meta = plain["metadata"]
        metrics.record_run(kind, meta["namespace"], meta["name"], result.status)
        return self._next_pass(plain.get("spec") or {}, state, result, pending, now)

    async def _write_status(self, kind: str, meta: dict, state: _RunState, written: dict, new: dict) -> bool:
        """Write what changed; True when a progress update is left for later."""
        progress_due = time.monotonic() - state.written_at >= self.pacing.progress_interval
        patch = status_patch(written, new, progress_due)
        if not patch:
            state.status = written
            return any(written.get(k) != new.get(k) for k in PROGRESS_FIELDS)
        run = RunRef(kind, meta["name"], meta["namespace"], meta["uid"])
        try:
            await asyncio.to_thread(self.reconciler.kube.patch_status, run, patch)
        except ApiException as e:  # written on a later pass, from the same remembered status
            log.warning("status of %s %s/%s not written: %s %s", kind, run.namespace, run.name, e.status, e.reason)
            state.status = written
            return True
        state.status, state.written_at = new, time.monotonic()
        return False

    def _next_pass(self, spec: dict, state: _RunState, result: Result, pending: bool, now: str) -> float | None:
        interval = self.pacing.interval
        if pending:
            return max(0.0, min(interval, state.written_at + self.pacing.progress_interval - time.monotonic()))
        if result.error or result.status.get("phase") not in FINISHED:
            return interval
        left = seconds_to_expiry(spec, result.status, now)
        # Already due: this pass deleted the run, or could not (retried at the resync).
        return interval if left is not None and left <= 0 else left


async def _sleep(wakeup: asyncio.Event, stopped: kopf.DaemonStopped, timeout: float | None) -> None:
    waiters = [asyncio.ensure_future(wakeup.wait()), asyncio.ensure_future(stopped.wait())]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
