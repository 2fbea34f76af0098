"""The pool trainer's Pool service (Attach, Detach, Status), both ends.

A member orchestrator attaches itself (`attach`): its name, its Rollouts address, its trainer
config and share weight; the answer says where its step-0 adapter is published. It then asks
`status(member)` now and then: a pool trainer that restarted has lost its roster (it lives in
memory), and the member attaches again. These calls need the member's own rollouts
credential, derived from the pool's token (`rlkube.scopes.member_scoped`): a member can attach,
detach or see only itself. The whole roster (`status("")`, for the operator) takes the pool's
own rollouts credential (`scoped(pool_token, ROLLOUTS)`). A pool trainer given no pool token (a
workstation) serves everyone and says so (`rlkube.auth.serve_open`).
"""

import logging
import time
import uuid
from concurrent import futures

import grpc

from rlkube import auth
from rlkube.scopes import ROLLOUTS, member_scoped, scoped
from rlkube.transport import rlkube_pb2 as pb
from rlkube.transport import rlkube_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

REFUSALS = ((ValueError, grpc.StatusCode.INVALID_ARGUMENT), (OverflowError, grpc.StatusCode.RESOURCE_EXHAUSTED))


class PoolUnavailable(ValueError):
    """The pool trainer's service did not answer within the call's time (it is starting, or restarting)."""


class PoolService(pb_grpc.PoolServicer):
    def __init__(self, roster, pool_token: str | None):
        """`roster`: rlkube.trainer.pool.roster.Roster; `pool_token`: None serves open."""
        self.roster, self.pool_token = roster, pool_token
        self.instance_id = uuid.uuid4().hex

    def _authorize(self, member: str, context: grpc.ServicerContext, pool_too: bool = False) -> None:
        """Member `member`'s own rollouts credential (the pool's own too with `pool_too`; "": the
        pool's alone)."""
        if self.pool_token is None:
            return
        presented = dict(context.invocation_metadata() or ()).get(auth.METADATA_KEY)
        accepted = [member_scoped(self.pool_token, member, ROLLOUTS)] if member else []
        if pool_too or not member:
            accepted.append(scoped(self.pool_token, ROLLOUTS))
        if not any(auth.is_authorized(presented, credential) for credential in accepted):
            whose = f"member {member!r}: present that member's" if member else "the whole roster: present the pool's"
            context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{whose} rollouts credential (Authorization: Bearer ...)")

    def Attach(self, request: pb.AttachRequest, context: grpc.ServicerContext) -> pb.AttachReply:
        self._authorize(request.member, context)
        try:
            location = self.roster.attach(request.member, request.orchestrator_address, request.trainer_config,
                                          request.weight)
        except tuple(e for e, _ in REFUSALS) as e:
            context.abort(next(code for kind, code in REFUSALS if isinstance(e, kind)), str(e))
        return pb.AttachReply(queued=True, policy0_location=location)

    def Detach(self, request: pb.DetachRequest, context: grpc.ServicerContext) -> pb.DetachReply:
        self._authorize(request.member, context)
        return pb.DetachReply(was_member=self.roster.detach(request.member))

    def Status(self, request: pb.PoolStatusRequest, context: grpc.ServicerContext) -> pb.PoolStatusReply:
        """`roster.status()`: that member's part alone when one is named."""
        self._authorize(request.member, context, pool_too=True)
        status = self.roster.status()
        members, left = status["members"], status["left"]
        if request.member:
            members = {k: v for k, v in members.items() if k == request.member}
            left = {k: v for k, v in left.items() if k == request.member}
        return pb.PoolStatusReply(
            members=[pb.PoolMember(name=name, step=m["step"], tokens=m["tokens"], weight=m["weight"],
                                   share=m["share"], ready_step=m["ready_step"]) for name, m in members.items()],
            left=left, instance_id=self.instance_id)


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
           timeout_s: float = 120.0) -> str:
    """Attach `member` (this process holds its rollouts credential), retrying while the pool
    trainer is not up; returns where its step-0 adapter is published (when it joins without
    a checkpoint). A refusal raises `ValueError` with the trainer's reason, `PoolUnavailable`
    a pool trainer that did not answer within `timeout_s`."""
    request = pb.AttachRequest(member=member, orchestrator_address=orchestrator_address,
                               trainer_config=trainer_config, weight=weight)
    return _call(pool_address, "Attach", request, timeout_s).policy0_location


def detach(pool_address: str, member: str, timeout_s: float = 10.0) -> bool:
    return _call(pool_address, "Detach", pb.DetachRequest(member=member), timeout_s).was_member


def status(pool_address: str, member: str = "", timeout_s: float = 10.0) -> pb.PoolStatusReply:
    """The roster (`member` "": all of it, with the pool's own rollouts credential), or the part of
    `member` (with its own): its entry in `members` while it is one, in `left` once it left."""
    return _call(pool_address, "Status", pb.PoolStatusRequest(member=member), timeout_s)


def _call(pool_address: str, method: str, request, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(pool_address) as channel:
        stub = getattr(pb_grpc.PoolStub(channel), method)
        while True:
            try:
                return stub(request, timeout=max(deadline - time.monotonic(), 0.1), metadata=auth.grpc_metadata(ROLLOUTS))
            except grpc.RpcError as e:
                gone = e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                if not gone or time.monotonic() > deadline:
                    error = PoolUnavailable if gone else ValueError
                    raise error(f"{method} at the pool trainer {pool_address}: {e.code().name}: {e.details()}") from None
            time.sleep(0.5)
