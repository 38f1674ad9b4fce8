from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListActionsRequest(_message.Message):
    __slots__ = ("node", "limit")
    NODE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    node: str
    limit: int
    def __init__(self, node: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ActionView(_message.Message):
    __slots__ = ("time", "action", "node", "job_id", "outcome", "detail", "why", "rule")
    TIME_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    time: float
    action: str
    node: str
    job_id: str
    outcome: str
    detail: str
    why: str
    rule: str
    def __init__(self, time: _Optional[float] = ..., action: _Optional[str] = ..., node: _Optional[str] = ..., job_id: _Optional[str] = ..., outcome: _Optional[str] = ..., detail: _Optional[str] = ..., why: _Optional[str] = ..., rule: _Optional[str] = ...) -> None: ...

class OffenderView(_message.Message):
    __slots__ = ("node", "gpu", "findings", "drains", "jobs_hurt", "mtbf_s", "serial", "jobs_held")
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    DRAINS_FIELD_NUMBER: _ClassVar[int]
    JOBS_HURT_FIELD_NUMBER: _ClassVar[int]
    MTBF_S_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    JOBS_HELD_FIELD_NUMBER: _ClassVar[int]
    node: str
    gpu: str
    findings: int
    drains: int
    jobs_hurt: int
    mtbf_s: float
    serial: str
    jobs_held: int
    def __init__(self, node: _Optional[str] = ..., gpu: _Optional[str] = ..., findings: _Optional[int] = ..., drains: _Optional[int] = ..., jobs_hurt: _Optional[int] = ..., mtbf_s: _Optional[float] = ..., serial: _Optional[str] = ..., jobs_held: _Optional[int] = ...) -> None: ...

class ListActionsResponse(_message.Message):
    __slots__ = ("actions", "gpus", "nodes")
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    actions: _containers.RepeatedCompositeFieldContainer[ActionView]
    gpus: _containers.RepeatedCompositeFieldContainer[OffenderView]
    nodes: _containers.RepeatedCompositeFieldContainer[OffenderView]
    def __init__(self, actions: _Optional[_Iterable[_Union[ActionView, _Mapping]]] = ..., gpus: _Optional[_Iterable[_Union[OffenderView, _Mapping]]] = ..., nodes: _Optional[_Iterable[_Union[OffenderView, _Mapping]]] = ...) -> None: ...
