from clusterwatch.v1 import agent_pb2 as _agent_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetJobRequest(_message.Message):
    __slots__ = ("job_id", "trend_points")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TREND_POINTS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    trend_points: int
    def __init__(self, job_id: _Optional[str] = ..., trend_points: _Optional[int] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("include_ended",)
    INCLUDE_ENDED_FIELD_NUMBER: _ClassVar[int]
    include_ended: bool
    def __init__(self, include_ended: _Optional[bool] = ...) -> None: ...

class JobInfo(_message.Message):
    __slots__ = ("job_id", "name", "user", "account", "partition", "state", "submit_time", "start_time", "end_time", "time_limit_s", "nodes", "cpus", "memory_bytes", "gpus", "source", "ranks_expected", "note", "exit_code", "qos", "cluster")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    ACCOUNT_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_TIME_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    TIME_LIMIT_S_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    RANKS_EXPECTED_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    QOS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    name: str
    user: str
    account: str
    partition: str
    state: str
    submit_time: float
    start_time: float
    end_time: float
    time_limit_s: float
    nodes: _containers.RepeatedScalarFieldContainer[str]
    cpus: int
    memory_bytes: int
    gpus: int
    source: str
    ranks_expected: int
    note: str
    exit_code: int
    qos: str
    cluster: str
    def __init__(self, job_id: _Optional[str] = ..., name: _Optional[str] = ..., user: _Optional[str] = ..., account: _Optional[str] = ..., partition: _Optional[str] = ..., state: _Optional[str] = ..., submit_time: _Optional[float] = ..., start_time: _Optional[float] = ..., end_time: _Optional[float] = ..., time_limit_s: _Optional[float] = ..., nodes: _Optional[_Iterable[str]] = ..., cpus: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., gpus: _Optional[int] = ..., source: _Optional[str] = ..., ranks_expected: _Optional[int] = ..., note: _Optional[str] = ..., exit_code: _Optional[int] = ..., qos: _Optional[str] = ..., cluster: _Optional[str] = ...) -> None: ...

class ProcessView(_message.Message):
    __slots__ = ("node", "pid", "start_time", "user", "command", "rank", "mapped_by", "last_seen", "cpu_percent", "rss_bytes", "rss_peak_bytes", "gpu_memory_bytes", "gpu_memory_peak_bytes", "gpu_utilization", "gpu_uuids", "gpu_memory_trend", "rss_trend", "threads", "open_fds", "samples_held", "alive", "step", "steps_per_s", "loss", "lr", "stalled_since", "first_seen", "cpu_seconds", "gpu_allocated_bytes", "gpu_reserved_bytes", "gpu_alloc_retries", "state", "wchan", "state_since")
    NODE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    MAPPED_BY_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_FIELD_NUMBER: _ClassVar[int]
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    RSS_PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    GPU_UUIDS_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_TREND_FIELD_NUMBER: _ClassVar[int]
    RSS_TREND_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    OPEN_FDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_HELD_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STEPS_PER_S_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    STALLED_SINCE_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEEN_FIELD_NUMBER: _ClassVar[int]
    CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    GPU_ALLOCATED_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_ALLOC_RETRIES_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    WCHAN_FIELD_NUMBER: _ClassVar[int]
    STATE_SINCE_FIELD_NUMBER: _ClassVar[int]
    node: str
    pid: int
    start_time: float
    user: str
    command: str
    rank: int
    mapped_by: str
    last_seen: float
    cpu_percent: float
    rss_bytes: int
    rss_peak_bytes: int
    gpu_memory_bytes: int
    gpu_memory_peak_bytes: int
    gpu_utilization: float
    gpu_uuids: _containers.RepeatedScalarFieldContainer[str]
    gpu_memory_trend: _containers.RepeatedScalarFieldContainer[float]
    rss_trend: _containers.RepeatedScalarFieldContainer[float]
    threads: int
    open_fds: int
    samples_held: int
    alive: bool
    step: int
    steps_per_s: float
    loss: float
    lr: float
    stalled_since: float
    first_seen: float
    cpu_seconds: float
    gpu_allocated_bytes: int
    gpu_reserved_bytes: int
    gpu_alloc_retries: int
    state: str
    wchan: str
    state_since: float
    def __init__(self, node: _Optional[str] = ..., pid: _Optional[int] = ..., start_time: _Optional[float] = ..., user: _Optional[str] = ..., command: _Optional[str] = ..., rank: _Optional[int] = ..., mapped_by: _Optional[str] = ..., last_seen: _Optional[float] = ..., cpu_percent: _Optional[float] = ..., rss_bytes: _Optional[int] = ..., rss_peak_bytes: _Optional[int] = ..., gpu_memory_bytes: _Optional[int] = ..., gpu_memory_peak_bytes: _Optional[int] = ..., gpu_utilization: _Optional[float] = ..., gpu_uuids: _Optional[_Iterable[str]] = ..., gpu_memory_trend: _Optional[_Iterable[float]] = ..., rss_trend: _Optional[_Iterable[float]] = ..., threads: _Optional[int] = ..., open_fds: _Optional[int] = ..., samples_held: _Optional[int] = ..., alive: _Optional[bool] = ..., step: _Optional[int] = ..., steps_per_s: _Optional[float] = ..., loss: _Optional[float] = ..., lr: _Optional[float] = ..., stalled_since: _Optional[float] = ..., first_seen: _Optional[float] = ..., cpu_seconds: _Optional[float] = ..., gpu_allocated_bytes: _Optional[int] = ..., gpu_reserved_bytes: _Optional[int] = ..., gpu_alloc_retries: _Optional[int] = ..., state: _Optional[str] = ..., wchan: _Optional[str] = ..., state_since: _Optional[float] = ...) -> None: ...

class GpuView(_message.Message):
    __slots__ = ("node", "uuid", "index", "name", "utilization", "memory_used_bytes", "memory_total_bytes", "memory_peak_bytes", "power_watts", "utilization_trend", "processes", "busy_seconds", "covered_seconds", "activity", "cost")
    NODE_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    POWER_WATTS_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_TREND_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    BUSY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    COVERED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ACTIVITY_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    node: str
    uuid: str
    index: int
    name: str
    utilization: float
    memory_used_bytes: int
    memory_total_bytes: int
    memory_peak_bytes: int
    power_watts: float
    utilization_trend: _containers.RepeatedScalarFieldContainer[float]
    processes: int
    busy_seconds: float
    covered_seconds: float
    activity: _agent_pb2.GpuActivity
    cost: GpuCost
    def __init__(self, node: _Optional[str] = ..., uuid: _Optional[str] = ..., index: _Optional[int] = ..., name: _Optional[str] = ..., utilization: _Optional[float] = ..., memory_used_bytes: _Optional[int] = ..., memory_total_bytes: _Optional[int] = ..., memory_peak_bytes: _Optional[int] = ..., power_watts: _Optional[float] = ..., utilization_trend: _Optional[_Iterable[float]] = ..., processes: _Optional[int] = ..., busy_seconds: _Optional[float] = ..., covered_seconds: _Optional[float] = ..., activity: _Optional[_Union[_agent_pb2.GpuActivity, _Mapping]] = ..., cost: _Optional[_Union[GpuCost, _Mapping]] = ...) -> None: ...

class GpuCost(_message.Message):
    __slots__ = ("energy_joules", "shared", "energy_resets", "throttle_seconds", "sm_active_seconds", "utilization_seconds")
    class ThrottleSecondsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ENERGY_JOULES_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    ENERGY_RESETS_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SM_ACTIVE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    energy_joules: float
    shared: bool
    energy_resets: int
    throttle_seconds: _containers.ScalarMap[str, float]
    sm_active_seconds: _containers.RepeatedScalarFieldContainer[float]
    utilization_seconds: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, energy_joules: _Optional[float] = ..., shared: _Optional[bool] = ..., energy_resets: _Optional[int] = ..., throttle_seconds: _Optional[_Mapping[str, float]] = ..., sm_active_seconds: _Optional[_Iterable[float]] = ..., utilization_seconds: _Optional[_Iterable[float]] = ...) -> None: ...

class AlertView(_message.Message):
    __slots__ = ("rule", "state", "severity", "node", "pid", "gpu", "rank", "since", "fired_at", "resolved_at", "description", "ended_while_firing", "cause", "cause_node", "cause_rank", "cause_gpu", "cause_xid")
    RULE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    FIRED_AT_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_AT_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    ENDED_WHILE_FIRING_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    CAUSE_NODE_FIELD_NUMBER: _ClassVar[int]
    CAUSE_RANK_FIELD_NUMBER: _ClassVar[int]
    CAUSE_GPU_FIELD_NUMBER: _ClassVar[int]
    CAUSE_XID_FIELD_NUMBER: _ClassVar[int]
    rule: str
    state: str
    severity: str
    node: str
    pid: int
    gpu: str
    rank: int
    since: float
    fired_at: float
    resolved_at: float
    description: str
    ended_while_firing: bool
    cause: str
    cause_node: str
    cause_rank: int
    cause_gpu: str
    cause_xid: int
    def __init__(self, rule: _Optional[str] = ..., state: _Optional[str] = ..., severity: _Optional[str] = ..., node: _Optional[str] = ..., pid: _Optional[int] = ..., gpu: _Optional[str] = ..., rank: _Optional[int] = ..., since: _Optional[float] = ..., fired_at: _Optional[float] = ..., resolved_at: _Optional[float] = ..., description: _Optional[str] = ..., ended_while_firing: _Optional[bool] = ..., cause: _Optional[str] = ..., cause_node: _Optional[str] = ..., cause_rank: _Optional[int] = ..., cause_gpu: _Optional[str] = ..., cause_xid: _Optional[int] = ...) -> None: ...

class NodeView(_message.Message):
    __slots__ = ("node", "last_seen", "agent_up", "memory_total_bytes", "gpu_pids_note", "tmpfs_bytes", "tmpfs_shared_with", "tmpfs_truncated")
    NODE_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_FIELD_NUMBER: _ClassVar[int]
    AGENT_UP_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_PIDS_NOTE_FIELD_NUMBER: _ClassVar[int]
    TMPFS_BYTES_FIELD_NUMBER: _ClassVar[int]
    TMPFS_SHARED_WITH_FIELD_NUMBER: _ClassVar[int]
    TMPFS_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    node: str
    last_seen: float
    agent_up: bool
    memory_total_bytes: int
    gpu_pids_note: str
    tmpfs_bytes: int
    tmpfs_shared_with: _containers.RepeatedScalarFieldContainer[str]
    tmpfs_truncated: bool
    def __init__(self, node: _Optional[str] = ..., last_seen: _Optional[float] = ..., agent_up: _Optional[bool] = ..., memory_total_bytes: _Optional[int] = ..., gpu_pids_note: _Optional[str] = ..., tmpfs_bytes: _Optional[int] = ..., tmpfs_shared_with: _Optional[_Iterable[str]] = ..., tmpfs_truncated: _Optional[bool] = ...) -> None: ...

class HealthView(_message.Message):
    __slots__ = ("time", "rule", "severity", "node", "gpu", "rank", "pid", "description", "advice", "action")
    TIME_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    ADVICE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    time: float
    rule: str
    severity: str
    node: str
    gpu: str
    rank: int
    pid: int
    description: str
    advice: str
    action: str
    def __init__(self, time: _Optional[float] = ..., rule: _Optional[str] = ..., severity: _Optional[str] = ..., node: _Optional[str] = ..., gpu: _Optional[str] = ..., rank: _Optional[int] = ..., pid: _Optional[int] = ..., description: _Optional[str] = ..., advice: _Optional[str] = ..., action: _Optional[str] = ...) -> None: ...

class JobView(_message.Message):
    __slots__ = ("job", "nodes", "processes", "gpus", "alerts", "provenance_json", "tags", "now", "health", "train_answers")
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    JOB_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    ALERTS_FIELD_NUMBER: _ClassVar[int]
    PROVENANCE_JSON_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    NOW_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    TRAIN_ANSWERS_FIELD_NUMBER: _ClassVar[int]
    job: JobInfo
    nodes: _containers.RepeatedCompositeFieldContainer[NodeView]
    processes: _containers.RepeatedCompositeFieldContainer[ProcessView]
    gpus: _containers.RepeatedCompositeFieldContainer[GpuView]
    alerts: _containers.RepeatedCompositeFieldContainer[AlertView]
    provenance_json: str
    tags: _containers.ScalarMap[str, str]
    now: float
    health: _containers.RepeatedCompositeFieldContainer[HealthView]
    train_answers: _containers.RepeatedCompositeFieldContainer[TrainAnswerView]
    def __init__(self, job: _Optional[_Union[JobInfo, _Mapping]] = ..., nodes: _Optional[_Iterable[_Union[NodeView, _Mapping]]] = ..., processes: _Optional[_Iterable[_Union[ProcessView, _Mapping]]] = ..., gpus: _Optional[_Iterable[_Union[GpuView, _Mapping]]] = ..., alerts: _Optional[_Iterable[_Union[AlertView, _Mapping]]] = ..., provenance_json: _Optional[str] = ..., tags: _Optional[_Mapping[str, str]] = ..., now: _Optional[float] = ..., health: _Optional[_Iterable[_Union[HealthView, _Mapping]]] = ..., train_answers: _Optional[_Iterable[_Union[TrainAnswerView, _Mapping]]] = ...) -> None: ...

class AskTrainingRequest(_message.Message):
    __slots__ = ("job_id", "rank", "kind", "timeout_s")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    rank: int
    kind: str
    timeout_s: float
    def __init__(self, job_id: _Optional[str] = ..., rank: _Optional[int] = ..., kind: _Optional[str] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class TrainAnswerView(_message.Message):
    __slots__ = ("request_id", "node", "pid", "start_time", "rank", "kind", "status", "message", "payload", "truncated", "asked_by", "asked_at", "answered_at")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    ASKED_BY_FIELD_NUMBER: _ClassVar[int]
    ASKED_AT_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_AT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    node: str
    pid: int
    start_time: float
    rank: int
    kind: str
    status: str
    message: str
    payload: str
    truncated: bool
    asked_by: str
    asked_at: float
    answered_at: float
    def __init__(self, request_id: _Optional[str] = ..., node: _Optional[str] = ..., pid: _Optional[int] = ..., start_time: _Optional[float] = ..., rank: _Optional[int] = ..., kind: _Optional[str] = ..., status: _Optional[str] = ..., message: _Optional[str] = ..., payload: _Optional[str] = ..., truncated: _Optional[bool] = ..., asked_by: _Optional[str] = ..., asked_at: _Optional[float] = ..., answered_at: _Optional[float] = ...) -> None: ...

class AskTrainingResponse(_message.Message):
    __slots__ = ("answers", "stack_groups")
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    STACK_GROUPS_FIELD_NUMBER: _ClassVar[int]
    answers: _containers.RepeatedCompositeFieldContainer[TrainAnswerView]
    stack_groups: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, answers: _Optional[_Iterable[_Union[TrainAnswerView, _Mapping]]] = ..., stack_groups: _Optional[_Iterable[str]] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "firing_alerts")
    class FiringAlertsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    JOBS_FIELD_NUMBER: _ClassVar[int]
    FIRING_ALERTS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobInfo]
    firing_alerts: _containers.ScalarMap[str, int]
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobInfo, _Mapping]]] = ..., firing_alerts: _Optional[_Mapping[str, int]] = ...) -> None: ...

class ListAlertsRequest(_message.Message):
    __slots__ = ("job_id", "include_resolved", "limit")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_RESOLVED_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    include_resolved: bool
    limit: int
    def __init__(self, job_id: _Optional[str] = ..., include_resolved: _Optional[bool] = ..., limit: _Optional[int] = ...) -> None: ...

class AlertEntry(_message.Message):
    __slots__ = ("job_id", "alert")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ALERT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    alert: AlertView
    def __init__(self, job_id: _Optional[str] = ..., alert: _Optional[_Union[AlertView, _Mapping]] = ...) -> None: ...

class ListAlertsResponse(_message.Message):
    __slots__ = ("alerts",)
    ALERTS_FIELD_NUMBER: _ClassVar[int]
    alerts: _containers.RepeatedCompositeFieldContainer[AlertEntry]
    def __init__(self, alerts: _Optional[_Iterable[_Union[AlertEntry, _Mapping]]] = ...) -> None: ...

class GetTraceRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class TraceChunk(_message.Message):
    __slots__ = ("lines",)
    LINES_FIELD_NUMBER: _ClassVar[int]
    lines: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, lines: _Optional[_Iterable[str]] = ...) -> None: ...

class ListHealthRequest(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: str
    def __init__(self, node: _Optional[str] = ...) -> None: ...

class XidCount(_message.Message):
    __slots__ = ("xid", "count")
    XID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    xid: int
    count: int
    def __init__(self, xid: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class GpuHealthRow(_message.Message):
    __slots__ = ("node", "gpu", "index", "severity", "lost", "findings", "xids", "temperature_c", "ecc_uncorrected_volatile", "throttle_reasons", "jobs", "recovery_action")
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    XIDS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    ECC_UNCORRECTED_VOLATILE_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_REASONS_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_ACTION_FIELD_NUMBER: _ClassVar[int]
    node: str
    gpu: str
    index: int
    severity: str
    lost: bool
    findings: _containers.RepeatedCompositeFieldContainer[HealthView]
    xids: _containers.RepeatedCompositeFieldContainer[XidCount]
    temperature_c: int
    ecc_uncorrected_volatile: int
    throttle_reasons: _containers.RepeatedScalarFieldContainer[str]
    jobs: _containers.RepeatedScalarFieldContainer[str]
    recovery_action: str
    def __init__(self, node: _Optional[str] = ..., gpu: _Optional[str] = ..., index: _Optional[int] = ..., severity: _Optional[str] = ..., lost: _Optional[bool] = ..., findings: _Optional[_Iterable[_Union[HealthView, _Mapping]]] = ..., xids: _Optional[_Iterable[_Union[XidCount, _Mapping]]] = ..., temperature_c: _Optional[int] = ..., ecc_uncorrected_volatile: _Optional[int] = ..., throttle_reasons: _Optional[_Iterable[str]] = ..., jobs: _Optional[_Iterable[str]] = ..., recovery_action: _Optional[str] = ...) -> None: ...

class NodeHealthRow(_message.Message):
    __slots__ = ("node", "severity", "findings", "jobs", "ports")
    NODE_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    node: str
    severity: str
    findings: _containers.RepeatedCompositeFieldContainer[HealthView]
    jobs: _containers.RepeatedScalarFieldContainer[str]
    ports: _containers.RepeatedCompositeFieldContainer[FabricPortView]
    def __init__(self, node: _Optional[str] = ..., severity: _Optional[str] = ..., findings: _Optional[_Iterable[_Union[HealthView, _Mapping]]] = ..., jobs: _Optional[_Iterable[str]] = ..., ports: _Optional[_Iterable[_Union[FabricPortView, _Mapping]]] = ...) -> None: ...

class FabricPortView(_message.Message):
    __slots__ = ("port", "state", "rate_gbps", "highest_rate_gbps", "link_layer", "counters")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    PORT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RATE_GBPS_FIELD_NUMBER: _ClassVar[int]
    HIGHEST_RATE_GBPS_FIELD_NUMBER: _ClassVar[int]
    LINK_LAYER_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    port: str
    state: str
    rate_gbps: float
    highest_rate_gbps: float
    link_layer: str
    counters: _containers.ScalarMap[str, int]
    def __init__(self, port: _Optional[str] = ..., state: _Optional[str] = ..., rate_gbps: _Optional[float] = ..., highest_rate_gbps: _Optional[float] = ..., link_layer: _Optional[str] = ..., counters: _Optional[_Mapping[str, int]] = ...) -> None: ...

class ListHealthResponse(_message.Message):
    __slots__ = ("gpus", "nodes")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    gpus: _containers.RepeatedCompositeFieldContainer[GpuHealthRow]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeHealthRow]
    def __init__(self, gpus: _Optional[_Iterable[_Union[GpuHealthRow, _Mapping]]] = ..., nodes: _Optional[_Iterable[_Union[NodeHealthRow, _Mapping]]] = ...) -> None: ...
