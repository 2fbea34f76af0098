"""The EnvWorkers gRPC service of rlkube.proto: both ends of a worker's session.

Workers dial the orchestrator (its Rollouts port), not the other way round, so on Kubernetes
they can be a Deployment whose pods nobody needs to know: one bidirectional `Work` stream per
worker, a hello and then finished groups up, groups to run down. The orchestrator's side
adapts the stream to a `GroupHub` (its `WorkerHub`: rlkube.orchestrator.workers, above this
module, which knows only the protocol); the worker's side, `work`, runs each group it is sent
and redials whenever the session ends (orchestrator restarting, network gone). Groups of a
session that ended are abandoned with it: the hub has re-issued them elsewhere, so running them
on would only make answers it discards.

Both ends use the keepalive options of rlkube.transport.keepalive, so a peer that vanished
without a reset (a deleted pod) ends the session within ~15 s.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import grpc

from rlkube import auth
from rlkube.rollout_types import Rollout
from rlkube.scopes import WORK
from rlkube.transport import keepalive
from rlkube.transport import rlkube_pb2 as pb
from rlkube.transport import rlkube_pb2_grpc as pb_grpc
from rlkube.transport.channel import CHANNEL_OPTIONS
from rlkube.transport.rollout import to_message

logger = logging.getLogger(__name__)

REDIAL_S = 1.0

RunGroup = Callable[[pb.GroupTask], Awaitable[list[Rollout]]]
"""A worker's groups: a failure must come back as errored rollouts, not as an exception."""


class Session(Protocol):
    """One worker's session, as the hub keeps it."""

    worker_id: str
    outbox: asyncio.Queue[pb.GroupTask | None]
    """The groups to write to the worker's stream; None ends the session."""


class GroupHub(Protocol):
    """What the EnvWorkers service serves: the orchestrator's groups, handed out to the workers
    that join (rlkube.orchestrator.workers.WorkerHub)."""

    def join(self, hello: pb.WorkerHello) -> Session:
        """A worker's session starts; ValueError if the worker cannot serve this run."""

    def complete(self, session: Session, result: pb.GroupResult) -> None:
        """A finished group came back on `session`."""

    def leave(self, session: Session) -> None:
        """`session` ended: the groups it held go to other workers."""


class EnvWorkersService(pb_grpc.EnvWorkersServicer):
    def __init__(self, hub: GroupHub):
        self.hub = hub

    async def Work(self, request_iterator, context: grpc.aio.ServicerContext):
        first = await context.read()
        if first is grpc.aio.EOF or not first.HasField("hello"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a worker's session starts with a hello")
        try:
            session = self.hub.join(first.hello)
        except ValueError as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        reader = asyncio.ensure_future(self._results(context, session))
        try:
            while (task := await session.outbox.get()) is not None:
                await context.write(task)
        finally:
            reader.cancel()
            self.hub.leave(session)

    async def _results(self, context: grpc.aio.ServicerContext, session) -> None:
        """Hand each finished group to the hub until the worker's side ends, then end the session."""
        try:
            while (message := await context.read()) is not grpc.aio.EOF:
                self.hub.complete(session, message.result)
        except grpc.RpcError as e:
            logger.info("env worker %s: stream ended: %s", session.worker_id, e)
        finally:
            session.outbox.put_nowait(None)


async def work(address: str, hello: pb.WorkerHello, run_group: RunGroup) -> None:
    """Run the groups the orchestrator at `address` sends, session after session, until cancelled
    (or refused for a wrong token: `grpc.aio.AioRpcError` UNAUTHENTICATED)."""
    while True:
        try:
            await _session(address, hello, run_group)
            logger.info("orchestrator at %s ended the session; redialling", address)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNAUTHENTICATED:  # a wrong token stays wrong: redialling cannot help
                raise
            logger.info("orchestrator at %s: %s: %s; redialling in %gs", address, e.code().name, e.details(), REDIAL_S)
        await asyncio.sleep(REDIAL_S)


async def _session(address: str, hello: pb.WorkerHello, run_group: RunGroup) -> None:
    async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS + keepalive.CLIENT) as channel:
        call = pb_grpc.EnvWorkersStub(channel).Work(metadata=auth.grpc_metadata(WORK))
        writing = asyncio.Lock()  # one message at a time on the stream
        running: set[asyncio.Task] = set()

        async def run(task: pb.GroupTask) -> None:
            rollouts = await run_group(task)
            result = pb.GroupResult(dispatch_id=task.dispatch_id, rollouts=[to_message(r) for r in rollouts])
            try:
                async with writing:
                    await call.write(pb.WorkerMessage(result=result))
            except Exception as e:  # noqa: BLE001 - the session ended; the hub re-issued the group
                logger.info("dispatch %d finished after its session ended: %s", task.dispatch_id, e)

        try:
            async with writing:
                await call.write(pb.WorkerMessage(hello=hello))
            logger.info("serving groups for the orchestrator at %s", address)
            while (task := await call.read()) is not grpc.aio.EOF:
                job = asyncio.ensure_future(run(task))
                running.add(job)
                job.add_done_callback(running.discard)
        finally:
            for job in running:
                job.cancel()
            await asyncio.gather(*running, return_exceptions=True)
