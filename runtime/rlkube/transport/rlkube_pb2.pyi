from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class MicroBatch(_message.Message):
    __slots__ = ("step", "rank", "index", "count", "input_ids", "position_ids", "sample_ids", "loss_mask", "advantages", "inference_logprobs", "temperatures", "global_loss_tokens", "prefix_ids", "teacher_logprobs", "routed_experts")
    STEP_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    INPUT_IDS_FIELD_NUMBER: _ClassVar[int]
    POSITION_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_IDS_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    ADVANTAGES_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURES_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_LOSS_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_IDS_FIELD_NUMBER: _ClassVar[int]
    TEACHER_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    ROUTED_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    step: int
    rank: int
    index: int
    count: int
    input_ids: Tensor
    position_ids: Tensor
    sample_ids: Tensor
    loss_mask: Tensor
    advantages: Tensor
    inference_logprobs: Tensor
    temperatures: Tensor
    global_loss_tokens: int
    prefix_ids: Tensor
    teacher_logprobs: Tensor
    routed_experts: Tensor
    def __init__(self, step: _Optional[int] = ..., rank: _Optional[int] = ..., index: _Optional[int] = ..., count: _Optional[int] = ..., input_ids: _Optional[_Union[Tensor, _Mapping]] = ..., position_ids: _Optional[_Union[Tensor, _Mapping]] = ..., sample_ids: _Optional[_Union[Tensor, _Mapping]] = ..., loss_mask: _Optional[_Union[Tensor, _Mapping]] = ..., advantages: _Optional[_Union[Tensor, _Mapping]] = ..., inference_logprobs: _Optional[_Union[Tensor, _Mapping]] = ..., temperatures: _Optional[_Union[Tensor, _Mapping]] = ..., global_loss_tokens: _Optional[int] = ..., prefix_ids: _Optional[_Union[Tensor, _Mapping]] = ..., teacher_logprobs: _Optional[_Union[Tensor, _Mapping]] = ..., routed_experts: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class GetBatchRequest(_message.Message):
    __slots__ = ("step", "rank", "world_size", "micro_batch_rows")
    STEP_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCH_ROWS_FIELD_NUMBER: _ClassVar[int]
    step: int
    rank: int
    world_size: int
    micro_batch_rows: int
    def __init__(self, step: _Optional[int] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., micro_batch_rows: _Optional[int] = ...) -> None: ...

class PolicyReport(_message.Message):
    __slots__ = ("step", "location")
    STEP_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    step: int
    location: str
    def __init__(self, step: _Optional[int] = ..., location: _Optional[str] = ...) -> None: ...

class PolicyAck(_message.Message):
    __slots__ = ("accepted_step",)
    ACCEPTED_STEP_FIELD_NUMBER: _ClassVar[int]
    accepted_step: int
    def __init__(self, accepted_step: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Status(_message.Message):
    __slots__ = ("step", "policy_step", "phase", "reward", "max_steps", "has_reward", "batch_ready_step")
    STEP_FIELD_NUMBER: _ClassVar[int]
    POLICY_STEP_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    MAX_STEPS_FIELD_NUMBER: _ClassVar[int]
    HAS_REWARD_FIELD_NUMBER: _ClassVar[int]
    BATCH_READY_STEP_FIELD_NUMBER: _ClassVar[int]
    step: int
    policy_step: int
    phase: str
    reward: float
    max_steps: int
    has_reward: bool
    batch_ready_step: int
    def __init__(self, step: _Optional[int] = ..., policy_step: _Optional[int] = ..., phase: _Optional[str] = ..., reward: _Optional[float] = ..., max_steps: _Optional[int] = ..., has_reward: _Optional[bool] = ..., batch_ready_step: _Optional[int] = ...) -> None: ...

class AttachRequest(_message.Message):
    __slots__ = ("member", "orchestrator_address", "trainer_config", "weight")
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    ORCHESTRATOR_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TRAINER_CONFIG_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    member: str
    orchestrator_address: str
    trainer_config: str
    weight: float
    def __init__(self, member: _Optional[str] = ..., orchestrator_address: _Optional[str] = ..., trainer_config: _Optional[str] = ..., weight: _Optional[float] = ...) -> None: ...

class AttachReply(_message.Message):
    __slots__ = ("queued", "policy0_location")
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    POLICY0_LOCATION_FIELD_NUMBER: _ClassVar[int]
    queued: bool
    policy0_location: str
    def __init__(self, queued: _Optional[bool] = ..., policy0_location: _Optional[str] = ...) -> None: ...

class DetachRequest(_message.Message):
    __slots__ = ("member",)
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    member: str
    def __init__(self, member: _Optional[str] = ...) -> None: ...

class DetachReply(_message.Message):
    __slots__ = ("was_member",)
    WAS_MEMBER_FIELD_NUMBER: _ClassVar[int]
    was_member: bool
    def __init__(self, was_member: _Optional[bool] = ...) -> None: ...

class PoolStatusRequest(_message.Message):
    __slots__ = ("member",)
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    member: str
    def __init__(self, member: _Optional[str] = ...) -> None: ...

class PoolMember(_message.Message):
    __slots__ = ("name", "step", "tokens", "weight", "share", "ready_step")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    READY_STEP_FIELD_NUMBER: _ClassVar[int]
    name: str
    step: int
    tokens: int
    weight: float
    share: float
    ready_step: int
    def __init__(self, name: _Optional[str] = ..., step: _Optional[int] = ..., tokens: _Optional[int] = ..., weight: _Optional[float] = ..., share: _Optional[float] = ..., ready_step: _Optional[int] = ...) -> None: ...

class PoolStatusReply(_message.Message):
    __slots__ = ("members", "left", "instance_id")
    class LeftEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    LEFT_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[PoolMember]
    left: _containers.ScalarMap[str, str]
    instance_id: str
    def __init__(self, members: _Optional[_Iterable[_Union[PoolMember, _Mapping]]] = ..., left: _Optional[_Mapping[str, str]] = ..., instance_id: _Optional[str] = ...) -> None: ...

class WeightsRequest(_message.Message):
    __slots__ = ("step",)
    STEP_FIELD_NUMBER: _ClassVar[int]
    step: int
    def __init__(self, step: _Optional[int] = ...) -> None: ...

class WeightsChunk(_message.Message):
    __slots__ = ("step", "file", "data", "last_of_file")
    STEP_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    LAST_OF_FILE_FIELD_NUMBER: _ClassVar[int]
    step: int
    file: str
    data: bytes
    last_of_file: bool
    def __init__(self, step: _Optional[int] = ..., file: _Optional[str] = ..., data: _Optional[bytes] = ..., last_of_file: _Optional[bool] = ...) -> None: ...

class RolloutSample(_message.Message):
    __slots__ = ("token_ids", "loss_mask", "logprobs", "temperature", "routed_experts", "policy_versions")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    ROUTED_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    loss_mask: _containers.RepeatedScalarFieldContainer[bool]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    temperature: float
    routed_experts: Tensor
    policy_versions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., loss_mask: _Optional[_Iterable[bool]] = ..., logprobs: _Optional[_Iterable[float]] = ..., temperature: _Optional[float] = ..., routed_experts: _Optional[_Union[Tensor, _Mapping]] = ..., policy_versions: _Optional[_Iterable[int]] = ...) -> None: ...

class RolloutResult(_message.Message):
    __slots__ = ("env", "example_id", "reward", "samples", "num_turns", "is_truncated", "error", "metrics", "served_versions")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ENV_FIELD_NUMBER: _ClassVar[int]
    EXAMPLE_ID_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    NUM_TURNS_FIELD_NUMBER: _ClassVar[int]
    IS_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    SERVED_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    env: str
    example_id: str
    reward: float
    samples: _containers.RepeatedCompositeFieldContainer[RolloutSample]
    num_turns: int
    is_truncated: bool
    error: str
    metrics: _containers.ScalarMap[str, float]
    served_versions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, env: _Optional[str] = ..., example_id: _Optional[str] = ..., reward: _Optional[float] = ..., samples: _Optional[_Iterable[_Union[RolloutSample, _Mapping]]] = ..., num_turns: _Optional[int] = ..., is_truncated: _Optional[bool] = ..., error: _Optional[str] = ..., metrics: _Optional[_Mapping[str, float]] = ..., served_versions: _Optional[_Iterable[str]] = ...) -> None: ...

class WorkerHello(_message.Message):
    __slots__ = ("worker_id", "max_groups", "envs")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_GROUPS_FIELD_NUMBER: _ClassVar[int]
    ENVS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    max_groups: int
    envs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, worker_id: _Optional[str] = ..., max_groups: _Optional[int] = ..., envs: _Optional[_Iterable[str]] = ...) -> None: ...

class GroupResult(_message.Message):
    __slots__ = ("dispatch_id", "rollouts")
    DISPATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ROLLOUTS_FIELD_NUMBER: _ClassVar[int]
    dispatch_id: int
    rollouts: _containers.RepeatedCompositeFieldContainer[RolloutResult]
    def __init__(self, dispatch_id: _Optional[int] = ..., rollouts: _Optional[_Iterable[_Union[RolloutResult, _Mapping]]] = ...) -> None: ...

class WorkerMessage(_message.Message):
    __slots__ = ("hello", "result")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    hello: WorkerHello
    result: GroupResult
    def __init__(self, hello: _Optional[_Union[WorkerHello, _Mapping]] = ..., result: _Optional[_Union[GroupResult, _Mapping]] = ...) -> None: ...

class GroupTask(_message.Message):
    __slots__ = ("dispatch_id", "env", "example_id", "group_size", "temperature", "model")
    DISPATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    EXAMPLE_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    dispatch_id: int
    env: str
    example_id: str
    group_size: int
    temperature: float
    model: str
    def __init__(self, dispatch_id: _Optional[int] = ..., env: _Optional[str] = ..., example_id: _Optional[str] = ..., group_size: _Optional[int] = ..., temperature: _Optional[float] = ..., model: _Optional[str] = ...) -> None: ...
