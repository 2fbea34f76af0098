"""The pool trainer's Pool service (Attach, Detach), both ends.

A member orchestrator attaches itself (`attach`): its name, its Rollouts address, its trainer
config and share weight. The call needs the member's own rollouts credential, derived from the
pool's token (`rlkube.scopes.member_scoped`): a member can attach or detach only itself. A
pool trainer given no pool token (a workstation) serves everyone and says so
(`rlkube.auth.serve_open`).
"""

import logging
import time
from concurrent import futures

import grpc

from rlkube import auth
from rlkube.scopes import ROLLOUTS, member_scoped
from rlkube.transport import rlkube_pb2 as pb
from rlkube.transport import rlkube_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

REFUSALS = ((ValueError, grpc.StatusCode.INVALID_ARGUMENT), (OverflowError, grpc.StatusCode.RESOURCE_EXHAUSTED))


class PoolService(pb_grpc.PoolServicer):
    def __init__(self, roster, pool_token: str | None):
        """`roster`: rlkube.trainer.pool.roster.Roster; `pool_token`: None serves open."""
        self.roster, self.pool_token = roster, pool_token

    def _authorize(self, member: str, context: grpc.ServicerContext) -> None:
        if self.pool_token is None:
            return
        presented = dict(context.invocation_metadata() or ()).get(auth.METADATA_KEY)
        if not auth.is_authorized(presented, member_scoped(self.pool_token, member, ROLLOUTS)):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, f"member {member!r}: present that member's rollouts "
                                                           "credential (Authorization: Bearer ...)")

    def Attach(self, request: pb.AttachRequest, context: grpc.ServicerContext) -> pb.AttachReply:
        self._authorize(request.member, context)
        try:
            self.roster.attach(request.member, request.orchestrator_address, request.trainer_config, request.weight)
        except tuple(e for e, _ in REFUSALS) as e:
            context.abort(next(code for kind, code in REFUSALS if isinstance(e, kind)), str(e))
        return pb.AttachReply(queued=True)

    def Detach(self, request: pb.DetachRequest, context: grpc.ServicerContext) -> pb.DetachReply:
        self._authorize(request.member, context)
        return pb.DetachReply(was_member=self.roster.detach(request.member))


def start_pool_server(roster, host: str, port: int, token: str | None) -> grpc.Server:
    """Serve the Pool service on host:port (0: a free one, `server.port`), checking members'
    credentials under the pool's `token` (None: open)."""
    if token is None:
        auth.serve_open("the pool trainer's Attach/Detach service")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_PoolServicer_to_server(PoolService(roster, token), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"pool gRPC server: cannot bind {host}:{port} (pool.host, pool.port)")
    server.start()
    server.port = bound
    logger.info("pool Attach/Detach service on %s:%d", host, bound)
    return server


def attach(pool_address: str, member: str, orchestrator_address: str, trainer_config: str, weight: float = 1.0,
           timeout_s: float = 120.0) -> None:
    """Attach `member` (this process holds its rollouts credential), retrying while the pool
    trainer is not up; a refusal raises `ValueError` with the trainer's reason."""
    request = pb.AttachRequest(member=member, orchestrator_address=orchestrator_address,
                               trainer_config=trainer_config, weight=weight)
    _call(pool_address, "Attach", request, timeout_s)


def detach(pool_address: str, member: str, timeout_s: float = 10.0) -> bool:
    return _call(pool_address, "Detach", pb.DetachRequest(member=member), timeout_s).was_member


def _call(pool_address: str, method: str, request, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(pool_address) as channel:
        stub = getattr(pb_grpc.PoolStub(channel), method)
        while True:
            try:
                return stub(request, timeout=max(deadline - time.monotonic(), 0.1), metadata=auth.grpc_metadata(ROLLOUTS))
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise ValueError(f"{method} at the pool trainer {pool_address}: {e.code().name}: {e.details()}") from None
            time.sleep(0.5)
