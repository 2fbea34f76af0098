"""Env workers, the orchestrator's side: groups out to worker processes, scored rollouts back.

With `orchestrator.env_workers`, rollouts run in `rlkube env-worker` processes (a Deployment on
Kubernetes) that dial the orchestrator's gRPC port (`rlkube.transport.env_workers`), while the
orchestrator keeps the policy clock, the buffer, advantages and packing. `WorkerHub.run_group`
is the scheduler's `run_group`: a group waits here until a connected worker has room, goes to
the one with the most room, and resolves when its rollouts come back.

Bounds: the scheduler has at most `max_groups_in_flight` groups out, which bounds the queue
here; a worker is never sent more groups than the `max_groups` of its hello, so nothing waits
inside a worker, and a slow worker holds no more than it runs while the others take new groups.

Loss: when a worker's session ends (its process died; its pod vanished and keepalive gave the
connection up), the groups it held go back to the front of the queue, each re-issued once under
a new dispatch id. A worker that hangs with its connection open cannot hold its groups for
ever either: a group held `timeout_s` is re-issued to another worker too. A group is answered
once (the first answer is trained); any other answer, or one naming a dispatch id its session
does not hold, is discarded: no group is trained twice.

Policy versions: a rollout's `policy_min` is the clock when its group was dispatched and its
`policy_max` the clock when it came back. A worker starts a group when it arrives (it has room
by construction), so these bound the versions it ran under as the in-process reads do; the
engine's own reports (`served_versions`) come back with each rollout, and stale rollouts are
dropped by the buffer as on the in-process path.
"""

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from rlkube.orchestrator.clock import PolicyClock
from rlkube.rollout_types import Rollout
from rlkube.transport import rlkube_pb2 as pb
from rlkube.transport.rollout import from_message

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Group:
    env: str
    example_id: str
    size: int
    future: asyncio.Future
    out: int = 0
    """Dispatches of it that workers hold (two once a timeout re-issued it)."""


@dataclass
class Dispatch:
    group: Group
    policy_min: int
    """The clock when it was sent."""
    deadline: asyncio.TimerHandle


class WorkerSession:
    """One connected worker: the dispatches it holds, and the tasks not yet written to its
    stream (never more than it holds, plus the end-of-session marker)."""

    def __init__(self, worker_id: str, max_groups: int):
        self.worker_id, self.max_groups = worker_id, max_groups
        self.held: dict[int, Dispatch] = {}
        self.outbox: asyncio.Queue[pb.GroupTask | None] = asyncio.Queue(maxsize=max_groups + 1)

    def room(self) -> int:
        return self.max_groups - len(self.held)

    def holds(self, group: Group) -> bool:
        return any(d.group is group for d in self.held.values())


class WorkerHub:
    def __init__(self, clock: PolicyClock, group_size: int, envs: list[str], timeout_s: float,
                 request_model: Callable[[], str] = lambda: ""):
        self.clock, self.group_size, self.envs, self.timeout_s = clock, group_size, envs, timeout_s
        self.request_model = request_model
        """The model name a group's requests name when it is sent (`InferencePool.request_model`;
        "": the worker's own choice)."""
        self.sessions: list[WorkerSession] = []
        self.waiting: deque[Group] = deque()
        self.dispatch_ids = itertools.count(1)
        self.reissued = 0
        """Groups sent again because the worker holding them was lost or timed out."""
        self.discarded = 0
        """Answers not trained: a group's second answer, or a dispatch its session does not hold."""

    def metrics(self) -> dict[str, float]:
        """Logged with each batch: totals since the start."""
        return {
            "env_workers/connected": float(len(self.sessions)),
            "env_workers/reissued_groups": float(self.reissued),
            "env_workers/discarded_answers": float(self.discarded),
        }

    async def run_group(self, runner, example_id: str, task, size: int | None = None) -> list[Rollout]:
        """The scheduler's `run_group` (`size` rollouts, `group_size` when None): `task` itself
        stays here, the worker finds it by id."""
        group = Group(runner.name, example_id, size or self.group_size, asyncio.get_running_loop().create_future())
        if not self.sessions and not self.waiting:
            logger.warning("no env worker is connected: groups wait for one to dial in")
        self.waiting.append(group)
        self._dispatch()
        try:
            return await group.future
        finally:
            if group in self.waiting:  # cancelled before a worker took it
                self.waiting.remove(group)

    def join(self, hello: pb.WorkerHello) -> WorkerSession:
        """A worker's session starts; ValueError if it lacks an environment."""
        if missing := sorted(set(self.envs) - set(hello.envs)):
            raise ValueError(f"env worker {hello.worker_id} has not loaded environment(s) {missing}")
        session = WorkerSession(hello.worker_id, max(1, hello.max_groups))
        self.sessions.append(session)
        logger.info("env worker %s joined (%d groups at once; %d worker(s))",
                    session.worker_id, session.max_groups, len(self.sessions))
        self._dispatch()
        return session

    def leave(self, session: WorkerSession) -> None:
        """A worker's session ended: what only it held is re-issued, ahead of newer groups."""
        self.sessions.remove(session)
        groups = [self._release(session, dispatch_id).group for dispatch_id in list(session.held)]
        lost = [g for g in groups if g.out == 0 and self._unanswered(g)]
        self.waiting.extendleft(reversed(lost))
        self.reissued += len(lost)
        logger.log(logging.WARNING if lost else logging.INFO, "env worker %s left holding %d group(s): %d re-issued "
                   "(%d worker(s) left)", session.worker_id, len(groups), len(lost), len(self.sessions))
        self._dispatch()

    def complete(self, session: WorkerSession, result: pb.GroupResult) -> None:
        dispatch = self._release(session, result.dispatch_id) if result.dispatch_id in session.held else None
        if dispatch is None or dispatch.group.future.done():
            self.discarded += 1
            logger.info("env worker %s answered dispatch %d, which is not waited for: discarded",
                        session.worker_id, result.dispatch_id)
        else:
            policy_max = self.clock.policy_step
            rollouts = [from_message(r, dispatch.policy_min, policy_max) for r in result.rollouts]
            dispatch.group.future.set_result(rollouts)
        self._dispatch()

    def _unanswered(self, group: Group) -> bool:
        return not group.future.done() and group not in self.waiting

    def _release(self, session: WorkerSession, dispatch_id: int) -> Dispatch:
        dispatch = session.held.pop(dispatch_id)
        dispatch.deadline.cancel()
        dispatch.group.out -= 1
        return dispatch

    def _expire(self, session: WorkerSession, dispatch_id: int) -> None:
        group = session.held[dispatch_id].group
        if group.out == 1 and self._unanswered(group):
            logger.warning("env worker %s has held %s/%s for %gs: re-issued to another worker",
                           session.worker_id, group.env, group.example_id, self.timeout_s)
            self.waiting.appendleft(group)
            self.reissued += 1
            self._dispatch()

    def _dispatch(self) -> None:
        """Send waiting groups, oldest first, each to the worker with the most room that does
        not hold it already."""
        for group in list(self.waiting):
            if not any(s.room() > 0 for s in self.sessions):
                return
            session = max((s for s in self.sessions if not s.holds(group)), key=WorkerSession.room, default=None)
            if session is None or session.room() <= 0:
                continue
            self.waiting.remove(group)
            dispatch_id = next(self.dispatch_ids)
            deadline = asyncio.get_running_loop().call_later(self.timeout_s, self._expire, session, dispatch_id)
            session.held[dispatch_id] = Dispatch(group, self.clock.policy_step, deadline)
            group.out += 1
            session.outbox.put_nowait(
                pb.GroupTask(dispatch_id=dispatch_id, env=group.env, example_id=group.example_id,
                             group_size=group.size, model=self.request_model())
            )
