"""The message-size options of the orchestrator's gRPC channels, shared by both ends of both
of its services (Rollouts: rlkube.transport.server and .client; EnvWorkers:
rlkube.transport.env_workers)."""

MAX_MESSAGE_BYTES = 1 << 30
"""One micro-batch may be large (rows x seq_len x 33 bytes); gRPC's 4 MiB default is not."""

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
