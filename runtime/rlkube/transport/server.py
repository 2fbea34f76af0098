"""The orchestrator's gRPC server: the trainer pulls batches and reports new policies here
(and env workers dial it for groups to run: rlkube.transport.env_workers).

The server knows nothing about rollouts: it adapts a `BatchSource` (the orchestrator) to the
`Rollouts` service of rlkube.proto. It runs on the orchestrator's asyncio loop (`grpc.aio`).

Every answer carries the orchestrator's `instance_id` (random per process) in the initial
metadata under `rlkube-orchestrator-id`, sent before the call waits for anything: a trainer
that reaches an orchestrator other than the one it started with learns it at once
(`rlkube.transport.client.OrchestratorRestarted`). A request that names the instance it
expects (same key) and reaches another is refused (FAILED_PRECONDITION) before it acts: a
restarted orchestrator never takes a policy report meant for its predecessor.

Every call needs the run's token (`rlkube.auth`): anything else is answered UNAUTHENTICATED.
"""

import logging
from typing import Protocol

import grpc

from rlkube import auth
from rlkube.transport import keepalive
from rlkube.transport import rlkube_pb2 as pb
from rlkube.transport import rlkube_pb2_grpc as pb_grpc
from rlkube.transport.channel import CHANNEL_OPTIONS
from rlkube.transport.microbatch import to_message

logger = logging.getLogger(__name__)

INSTANCE_ID_KEY = "rlkube-orchestrator-id"


class BatchSource(Protocol):
    """What the Rollouts service serves. Errors: ValueError for a bad request (answered
    INVALID_ARGUMENT), LookupError for a step that will never exist (NOT_FOUND)."""

    instance_id: str
    """Random per orchestrator process; a new one means the run's batch state started over."""

    async def get_batch(self, step: int, rank: int, world_size: int, micro_batch_rows: int) -> list[dict]:
        """The rank's micro-batches for `step`, waiting until the step's batch is ready."""

    async def report_policy(self, step: int, location: str) -> int:
        """Policy `step` is published at `location`; returns the step accepted."""

    def status(self) -> dict:
        """{"phase", "step", "max_steps", "reward", "policy_step", ...} (see orchestrator/status.py)."""


class RolloutsService(pb_grpc.RolloutsServicer):
    def __init__(self, source: BatchSource):
        self.source = source

    async def _identify(self, context: grpc.aio.ServicerContext) -> None:
        mine = self.source.instance_id
        await context.send_initial_metadata(((INSTANCE_ID_KEY, mine),))
        expected = dict(context.invocation_metadata() or ()).get(INSTANCE_ID_KEY)
        if expected not in (None, mine):
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"this is orchestrator {mine}, not {expected}"
            )

    async def GetBatch(self, request: pb.GetBatchRequest, context: grpc.aio.ServicerContext):
        await self._identify(context)
        try:
            batches = await self.source.get_batch(
                request.step, request.rank, request.world_size, request.micro_batch_rows or 1
            )
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except LookupError as e:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        for index, micro_batch in enumerate(batches):
            yield to_message(micro_batch, request.step, request.rank, index, len(batches))

    async def ReportPolicy(self, request: pb.PolicyReport, context: grpc.aio.ServicerContext) -> pb.PolicyAck:
        await self._identify(context)
        try:
            accepted = await self.source.report_policy(request.step, request.location)
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return pb.PolicyAck(accepted_step=accepted)

    async def GetStatus(self, request: pb.StatusRequest, context: grpc.aio.ServicerContext) -> pb.Status:
        await self._identify(context)
        status = self.source.status()
        reward = status.get("reward")
        return pb.Status(
            step=status["step"],
            policy_step=status["policy_step"],
            phase=status["phase"],
            reward=reward if reward is not None else 0.0,
            has_reward=reward is not None,
            max_steps=status["max_steps"],
            batch_ready_step=status.get("batch_ready_step", 0),
        )


async def start_server(source: BatchSource | None, host: str, port: int, workers=None) -> grpc.aio.Server:
    """Serve `source` on host:port (port 0 picks a free one: read it from `server.port`), and
    the EnvWorkers service over `workers` (a `GroupHub`: the orchestrator's `WorkerHub`) when given."""
    interceptors = auth.server_interceptors("the orchestrator's gRPC (rollouts, env workers)",
                                              ("Rollouts", "EnvWorkers"), aio=True)
    server = grpc.aio.server(options=CHANNEL_OPTIONS + keepalive.SERVER, interceptors=interceptors)
    if source is not None:
        pb_grpc.add_RolloutsServicer_to_server(RolloutsService(source), server)
    if workers is not None:
        from rlkube.transport.env_workers import EnvWorkersService

        pb_grpc.add_EnvWorkersServicer_to_server(EnvWorkersService(workers), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"rollouts gRPC server: cannot bind {host}:{port}")
    await server.start()
    server.port = bound
    logger.info("rollouts gRPC server listening on %s:%d", host, bound)
    return server


async def stop_server(server: grpc.aio.Server, grace_s: float = 5.0) -> None:
    """Finish in-flight streams for up to `grace_s`, then cancel them."""
    await server.stop(grace_s)
