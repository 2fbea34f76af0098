"""gRPC keepalive for calls that wait a long time on a peer in another pod (a Fetch waiting for
its step, a GetBatch waiting for its batch).

A pod that dies takes its network namespace with it: no reset reaches the other side, whose
call would otherwise wait out its whole deadline (up to an hour). Clients ping every 10 s and
give the connection up after 5 s without an answer (UNAVAILABLE: a GetBatch retries, reaching
the peer's replacement through the same Service name; a Fetch fails, see `fetch_snapshot`);
servers accept pings that often, and ping their clients likewise, so a session with an env
worker whose pod vanished ends and its groups are re-issued (rlkube.orchestrator.workers).
"""

CLIENT = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.ping_timeout_ms", 5_000),  # grpcio 1.85 times keepalive pings out by this one
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]
SERVER = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.ping_timeout_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
]
