from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GpuPidsHidden(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GPU_PIDS_SEEN: _ClassVar[GpuPidsHidden]
    GPU_PIDS_OTHER_NAMESPACE: _ClassVar[GpuPidsHidden]
    GPU_PIDS_NOT_IN_PROC: _ClassVar[GpuPidsHidden]
GPU_PIDS_SEEN: GpuPidsHidden
GPU_PIDS_OTHER_NAMESPACE: GpuPidsHidden
GPU_PIDS_NOT_IN_PROC: GpuPidsHidden

class GpuInfo(_message.Message):
    __slots__ = ("uuid", "index", "name", "memory_total_bytes", "parent_uuid", "serial")
    UUID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    PARENT_UUID_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    index: int
    name: str
    memory_total_bytes: int
    parent_uuid: str
    serial: str
    def __init__(self, uuid: _Optional[str] = ..., index: _Optional[int] = ..., name: _Optional[str] = ..., memory_total_bytes: _Optional[int] = ..., parent_uuid: _Optional[str] = ..., serial: _Optional[str] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("node", "boot_id", "agent_version", "gpus", "interval_s", "gpu_source", "sent_at", "node_memory_total_bytes", "send_interval_s", "gpu_pids_hidden")
    NODE_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    GPU_SOURCE_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    NODE_MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SEND_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    GPU_PIDS_HIDDEN_FIELD_NUMBER: _ClassVar[int]
    node: str
    boot_id: str
    agent_version: str
    gpus: _containers.RepeatedCompositeFieldContainer[GpuInfo]
    interval_s: float
    gpu_source: str
    sent_at: float
    node_memory_total_bytes: int
    send_interval_s: float
    gpu_pids_hidden: GpuPidsHidden
    def __init__(self, node: _Optional[str] = ..., boot_id: _Optional[str] = ..., agent_version: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[GpuInfo, _Mapping]]] = ..., interval_s: _Optional[float] = ..., gpu_source: _Optional[str] = ..., sent_at: _Optional[float] = ..., node_memory_total_bytes: _Optional[int] = ..., send_interval_s: _Optional[float] = ..., gpu_pids_hidden: _Optional[_Union[GpuPidsHidden, str]] = ...) -> None: ...

class ProcessLabels(_message.Message):
    __slots__ = ("ppid", "uid", "user", "command", "job_id", "rank", "local_rank", "step_id", "mapped_by")
    PPID_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RANK_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    MAPPED_BY_FIELD_NUMBER: _ClassVar[int]
    ppid: int
    uid: int
    user: str
    command: str
    job_id: str
    rank: int
    local_rank: int
    step_id: str
    mapped_by: str
    def __init__(self, ppid: _Optional[int] = ..., uid: _Optional[int] = ..., user: _Optional[str] = ..., command: _Optional[str] = ..., job_id: _Optional[str] = ..., rank: _Optional[int] = ..., local_rank: _Optional[int] = ..., step_id: _Optional[str] = ..., mapped_by: _Optional[str] = ...) -> None: ...

class ProcessTable(_message.Message):
    __slots__ = ("time", "pid", "start_time", "labels", "cpu_percent", "rss_bytes", "threads", "open_fds", "gpu_count", "gpu", "gpu_memory_bytes", "gpu_sm_utilization", "label_sets", "gpu_uuids", "states")
    TIME_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    OPEN_FDS_FIELD_NUMBER: _ClassVar[int]
    GPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_SM_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    LABEL_SETS_FIELD_NUMBER: _ClassVar[int]
    GPU_UUIDS_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    time: _containers.RepeatedScalarFieldContainer[float]
    pid: _containers.RepeatedScalarFieldContainer[int]
    start_time: _containers.RepeatedScalarFieldContainer[float]
    labels: _containers.RepeatedScalarFieldContainer[int]
    cpu_percent: _containers.RepeatedScalarFieldContainer[float]
    rss_bytes: _containers.RepeatedScalarFieldContainer[int]
    threads: _containers.RepeatedScalarFieldContainer[int]
    open_fds: _containers.RepeatedScalarFieldContainer[int]
    gpu_count: _containers.RepeatedScalarFieldContainer[int]
    gpu: _containers.RepeatedScalarFieldContainer[int]
    gpu_memory_bytes: _containers.RepeatedScalarFieldContainer[int]
    gpu_sm_utilization: _containers.RepeatedScalarFieldContainer[float]
    label_sets: _containers.RepeatedCompositeFieldContainer[ProcessLabels]
    gpu_uuids: _containers.RepeatedScalarFieldContainer[str]
    states: _containers.RepeatedCompositeFieldContainer[ProcessState]
    def __init__(self, time: _Optional[_Iterable[float]] = ..., pid: _Optional[_Iterable[int]] = ..., start_time: _Optional[_Iterable[float]] = ..., labels: _Optional[_Iterable[int]] = ..., cpu_percent: _Optional[_Iterable[float]] = ..., rss_bytes: _Optional[_Iterable[int]] = ..., threads: _Optional[_Iterable[int]] = ..., open_fds: _Optional[_Iterable[int]] = ..., gpu_count: _Optional[_Iterable[int]] = ..., gpu: _Optional[_Iterable[int]] = ..., gpu_memory_bytes: _Optional[_Iterable[int]] = ..., gpu_sm_utilization: _Optional[_Iterable[float]] = ..., label_sets: _Optional[_Iterable[_Union[ProcessLabels, _Mapping]]] = ..., gpu_uuids: _Optional[_Iterable[str]] = ..., states: _Optional[_Iterable[_Union[ProcessState, _Mapping]]] = ...) -> None: ...

class ProcessState(_message.Message):
    __slots__ = ("row", "state", "wchan")
    ROW_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    WCHAN_FIELD_NUMBER: _ClassVar[int]
    row: int
    state: str
    wchan: str
    def __init__(self, row: _Optional[int] = ..., state: _Optional[str] = ..., wchan: _Optional[str] = ...) -> None: ...

class GpuSample(_message.Message):
    __slots__ = ("time", "uuid", "utilization", "memory_used_bytes", "memory_total_bytes", "power_watts", "activity", "energy_mj")
    TIME_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    POWER_WATTS_FIELD_NUMBER: _ClassVar[int]
    ACTIVITY_FIELD_NUMBER: _ClassVar[int]
    ENERGY_MJ_FIELD_NUMBER: _ClassVar[int]
    time: float
    uuid: str
    utilization: float
    memory_used_bytes: int
    memory_total_bytes: int
    power_watts: float
    activity: GpuActivity
    energy_mj: int
    def __init__(self, time: _Optional[float] = ..., uuid: _Optional[str] = ..., utilization: _Optional[float] = ..., memory_used_bytes: _Optional[int] = ..., memory_total_bytes: _Optional[int] = ..., power_watts: _Optional[float] = ..., activity: _Optional[_Union[GpuActivity, _Mapping]] = ..., energy_mj: _Optional[int] = ...) -> None: ...

class GpuActivity(_message.Message):
    __slots__ = ("window_s", "sm_active", "sm_occupancy", "tensor_active", "dram_active", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s")
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    SM_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    SM_OCCUPANCY_FIELD_NUMBER: _ClassVar[int]
    TENSOR_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    DRAM_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    PCIE_TX_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    PCIE_RX_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    NVLINK_TX_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    NVLINK_RX_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    window_s: float
    sm_active: float
    sm_occupancy: float
    tensor_active: float
    dram_active: float
    pcie_tx_bytes_per_s: float
    pcie_rx_bytes_per_s: float
    nvlink_tx_bytes_per_s: float
    nvlink_rx_bytes_per_s: float
    def __init__(self, window_s: _Optional[float] = ..., sm_active: _Optional[float] = ..., sm_occupancy: _Optional[float] = ..., tensor_active: _Optional[float] = ..., dram_active: _Optional[float] = ..., pcie_tx_bytes_per_s: _Optional[float] = ..., pcie_rx_bytes_per_s: _Optional[float] = ..., nvlink_tx_bytes_per_s: _Optional[float] = ..., nvlink_rx_bytes_per_s: _Optional[float] = ...) -> None: ...

class TrainingSample(_message.Message):
    __slots__ = ("time", "pid", "start_time", "step", "loss", "lr", "epoch", "metrics", "tags", "gpu_memory")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TIME_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_FIELD_NUMBER: _ClassVar[int]
    time: float
    pid: int
    start_time: float
    step: int
    loss: float
    lr: float
    epoch: float
    metrics: _containers.ScalarMap[str, float]
    tags: _containers.ScalarMap[str, str]
    gpu_memory: _containers.RepeatedCompositeFieldContainer[AllocatorSample]
    def __init__(self, time: _Optional[float] = ..., pid: _Optional[int] = ..., start_time: _Optional[float] = ..., step: _Optional[int] = ..., loss: _Optional[float] = ..., lr: _Optional[float] = ..., epoch: _Optional[float] = ..., metrics: _Optional[_Mapping[str, float]] = ..., tags: _Optional[_Mapping[str, str]] = ..., gpu_memory: _Optional[_Iterable[_Union[AllocatorSample, _Mapping]]] = ...) -> None: ...

class AllocatorSample(_message.Message):
    __slots__ = ("device_index", "gpu_uuid", "allocated_bytes", "reserved_bytes", "alloc_retries", "inactive_split_bytes")
    DEVICE_INDEX_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_BYTES_FIELD_NUMBER: _ClassVar[int]
    RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    ALLOC_RETRIES_FIELD_NUMBER: _ClassVar[int]
    INACTIVE_SPLIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    device_index: int
    gpu_uuid: str
    allocated_bytes: int
    reserved_bytes: int
    alloc_retries: int
    inactive_split_bytes: int
    def __init__(self, device_index: _Optional[int] = ..., gpu_uuid: _Optional[str] = ..., allocated_bytes: _Optional[int] = ..., reserved_bytes: _Optional[int] = ..., alloc_retries: _Optional[int] = ..., inactive_split_bytes: _Optional[int] = ...) -> None: ...

class Provenance(_message.Message):
    __slots__ = ("pid", "start_time", "json")
    PID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    pid: int
    start_time: float
    json: str
    def __init__(self, pid: _Optional[int] = ..., start_time: _Optional[float] = ..., json: _Optional[str] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("kind", "job_id", "uid", "user", "gpu_uuids", "time", "exit_code", "gpu_indexes")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[JobEvent.Kind]
        START: _ClassVar[JobEvent.Kind]
        END: _ClassVar[JobEvent.Kind]
    KIND_UNSPECIFIED: JobEvent.Kind
    START: JobEvent.Kind
    END: JobEvent.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    GPU_UUIDS_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEXES_FIELD_NUMBER: _ClassVar[int]
    kind: JobEvent.Kind
    job_id: str
    uid: int
    user: str
    gpu_uuids: _containers.RepeatedScalarFieldContainer[str]
    time: float
    exit_code: int
    gpu_indexes: str
    def __init__(self, kind: _Optional[_Union[JobEvent.Kind, str]] = ..., job_id: _Optional[str] = ..., uid: _Optional[int] = ..., user: _Optional[str] = ..., gpu_uuids: _Optional[_Iterable[str]] = ..., time: _Optional[float] = ..., exit_code: _Optional[int] = ..., gpu_indexes: _Optional[str] = ...) -> None: ...

class AgentCounters(_message.Message):
    __slots__ = ("samples_sent", "samples_dropped", "read_errors", "buffered_batches", "job_output_files", "job_output_refused", "job_output_errors")
    SAMPLES_SENT_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_DROPPED_FIELD_NUMBER: _ClassVar[int]
    READ_ERRORS_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_BATCHES_FIELD_NUMBER: _ClassVar[int]
    JOB_OUTPUT_FILES_FIELD_NUMBER: _ClassVar[int]
    JOB_OUTPUT_REFUSED_FIELD_NUMBER: _ClassVar[int]
    JOB_OUTPUT_ERRORS_FIELD_NUMBER: _ClassVar[int]
    samples_sent: int
    samples_dropped: int
    read_errors: int
    buffered_batches: int
    job_output_files: int
    job_output_refused: int
    job_output_errors: int
    def __init__(self, samples_sent: _Optional[int] = ..., samples_dropped: _Optional[int] = ..., read_errors: _Optional[int] = ..., buffered_batches: _Optional[int] = ..., job_output_files: _Optional[int] = ..., job_output_refused: _Optional[int] = ..., job_output_errors: _Optional[int] = ...) -> None: ...

class HealthEvent(_message.Message):
    __slots__ = ("time", "uuid", "kind", "xid", "data", "pid", "process", "pci", "source", "text", "kernel_boot_id", "kmsg_seq", "sxid", "fatal", "device")
    class Source(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        SOURCE_UNSPECIFIED: _ClassVar[HealthEvent.Source]
        NVML: _ClassVar[HealthEvent.Source]
        KMSG: _ClassVar[HealthEvent.Source]
    SOURCE_UNSPECIFIED: HealthEvent.Source
    NVML: HealthEvent.Source
    KMSG: HealthEvent.Source
    TIME_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    XID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    PROCESS_FIELD_NUMBER: _ClassVar[int]
    PCI_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    KERNEL_BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    KMSG_SEQ_FIELD_NUMBER: _ClassVar[int]
    SXID_FIELD_NUMBER: _ClassVar[int]
    FATAL_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    time: float
    uuid: str
    kind: str
    xid: int
    data: int
    pid: int
    process: str
    pci: str
    source: HealthEvent.Source
    text: str
    kernel_boot_id: str
    kmsg_seq: int
    sxid: int
    fatal: bool
    device: str
    def __init__(self, time: _Optional[float] = ..., uuid: _Optional[str] = ..., kind: _Optional[str] = ..., xid: _Optional[int] = ..., data: _Optional[int] = ..., pid: _Optional[int] = ..., process: _Optional[str] = ..., pci: _Optional[str] = ..., source: _Optional[_Union[HealthEvent.Source, str]] = ..., text: _Optional[str] = ..., kernel_boot_id: _Optional[str] = ..., kmsg_seq: _Optional[int] = ..., sxid: _Optional[int] = ..., fatal: _Optional[bool] = ..., device: _Optional[str] = ...) -> None: ...

class FabricPort(_message.Message):
    __slots__ = ("time", "device", "port", "state", "phys_state", "rate_gbps", "width", "speed", "link_layer", "counters", "expected_gbps")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    TIME_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PHYS_STATE_FIELD_NUMBER: _ClassVar[int]
    RATE_GBPS_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    SPEED_FIELD_NUMBER: _ClassVar[int]
    LINK_LAYER_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_GBPS_FIELD_NUMBER: _ClassVar[int]
    time: float
    device: str
    port: int
    state: int
    phys_state: int
    rate_gbps: float
    width: int
    speed: str
    link_layer: str
    counters: _containers.ScalarMap[str, int]
    expected_gbps: float
    def __init__(self, time: _Optional[float] = ..., device: _Optional[str] = ..., port: _Optional[int] = ..., state: _Optional[int] = ..., phys_state: _Optional[int] = ..., rate_gbps: _Optional[float] = ..., width: _Optional[int] = ..., speed: _Optional[str] = ..., link_layer: _Optional[str] = ..., counters: _Optional[_Mapping[str, int]] = ..., expected_gbps: _Optional[float] = ...) -> None: ...

class GpuHealth(_message.Message):
    __slots__ = ("time", "uuid", "ecc_corrected_volatile", "ecc_uncorrected_volatile", "ecc_corrected_aggregate", "ecc_uncorrected_aggregate", "remapped_rows_corrected", "remapped_rows_uncorrected", "remapped_rows_pending", "remapped_rows_failure", "retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending", "clock_event_reasons", "violation_seconds", "temperature_c", "pcie_replays", "nvlink_errors")
    class ViolationSecondsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class NvlinkErrorsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    TIME_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    ECC_CORRECTED_VOLATILE_FIELD_NUMBER: _ClassVar[int]
    ECC_UNCORRECTED_VOLATILE_FIELD_NUMBER: _ClassVar[int]
    ECC_CORRECTED_AGGREGATE_FIELD_NUMBER: _ClassVar[int]
    ECC_UNCORRECTED_AGGREGATE_FIELD_NUMBER: _ClassVar[int]
    REMAPPED_ROWS_CORRECTED_FIELD_NUMBER: _ClassVar[int]
    REMAPPED_ROWS_UNCORRECTED_FIELD_NUMBER: _ClassVar[int]
    REMAPPED_ROWS_PENDING_FIELD_NUMBER: _ClassVar[int]
    REMAPPED_ROWS_FAILURE_FIELD_NUMBER: _ClassVar[int]
    RETIRED_PAGES_SBE_FIELD_NUMBER: _ClassVar[int]
    RETIRED_PAGES_DBE_FIELD_NUMBER: _ClassVar[int]
    RETIRED_PAGES_PENDING_FIELD_NUMBER: _ClassVar[int]
    CLOCK_EVENT_REASONS_FIELD_NUMBER: _ClassVar[int]
    VIOLATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    PCIE_REPLAYS_FIELD_NUMBER: _ClassVar[int]
    NVLINK_ERRORS_FIELD_NUMBER: _ClassVar[int]
    time: float
    uuid: str
    ecc_corrected_volatile: int
    ecc_uncorrected_volatile: int
    ecc_corrected_aggregate: int
    ecc_uncorrected_aggregate: int
    remapped_rows_corrected: int
    remapped_rows_uncorrected: int
    remapped_rows_pending: bool
    remapped_rows_failure: bool
    retired_pages_sbe: int
    retired_pages_dbe: int
    retired_pages_pending: bool
    clock_event_reasons: int
    violation_seconds: _containers.ScalarMap[str, float]
    temperature_c: int
    pcie_replays: int
    nvlink_errors: _containers.ScalarMap[str, int]
    def __init__(self, time: _Optional[float] = ..., uuid: _Optional[str] = ..., ecc_corrected_volatile: _Optional[int] = ..., ecc_uncorrected_volatile: _Optional[int] = ..., ecc_corrected_aggregate: _Optional[int] = ..., ecc_uncorrected_aggregate: _Optional[int] = ..., remapped_rows_corrected: _Optional[int] = ..., remapped_rows_uncorrected: _Optional[int] = ..., remapped_rows_pending: _Optional[bool] = ..., remapped_rows_failure: _Optional[bool] = ..., retired_pages_sbe: _Optional[int] = ..., retired_pages_dbe: _Optional[int] = ..., retired_pages_pending: _Optional[bool] = ..., clock_event_reasons: _Optional[int] = ..., violation_seconds: _Optional[_Mapping[str, float]] = ..., temperature_c: _Optional[int] = ..., pcie_replays: _Optional[int] = ..., nvlink_errors: _Optional[_Mapping[str, int]] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("seq", "sent_at", "processes", "gpus", "training", "provenance", "job_events", "counters", "health_events", "gpu_health", "fabric_ports", "tmpfs_scans")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    TRAINING_FIELD_NUMBER: _ClassVar[int]
    PROVENANCE_FIELD_NUMBER: _ClassVar[int]
    JOB_EVENTS_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    HEALTH_EVENTS_FIELD_NUMBER: _ClassVar[int]
    GPU_HEALTH_FIELD_NUMBER: _ClassVar[int]
    FABRIC_PORTS_FIELD_NUMBER: _ClassVar[int]
    TMPFS_SCANS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    sent_at: float
    processes: ProcessTable
    gpus: _containers.RepeatedCompositeFieldContainer[GpuSample]
    training: _containers.RepeatedCompositeFieldContainer[TrainingSample]
    provenance: _containers.RepeatedCompositeFieldContainer[Provenance]
    job_events: _containers.RepeatedCompositeFieldContainer[JobEvent]
    counters: AgentCounters
    health_events: _containers.RepeatedCompositeFieldContainer[HealthEvent]
    gpu_health: _containers.RepeatedCompositeFieldContainer[GpuHealth]
    fabric_ports: _containers.RepeatedCompositeFieldContainer[FabricPort]
    tmpfs_scans: _containers.RepeatedCompositeFieldContainer[TmpfsScan]
    def __init__(self, seq: _Optional[int] = ..., sent_at: _Optional[float] = ..., processes: _Optional[_Union[ProcessTable, _Mapping]] = ..., gpus: _Optional[_Iterable[_Union[GpuSample, _Mapping]]] = ..., training: _Optional[_Iterable[_Union[TrainingSample, _Mapping]]] = ..., provenance: _Optional[_Iterable[_Union[Provenance, _Mapping]]] = ..., job_events: _Optional[_Iterable[_Union[JobEvent, _Mapping]]] = ..., counters: _Optional[_Union[AgentCounters, _Mapping]] = ..., health_events: _Optional[_Iterable[_Union[HealthEvent, _Mapping]]] = ..., gpu_health: _Optional[_Iterable[_Union[GpuHealth, _Mapping]]] = ..., fabric_ports: _Optional[_Iterable[_Union[FabricPort, _Mapping]]] = ..., tmpfs_scans: _Optional[_Iterable[_Union[TmpfsScan, _Mapping]]] = ...) -> None: ...

class TmpfsUse(_message.Message):
    __slots__ = ("uid", "user", "bytes", "files")
    UID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    uid: int
    user: str
    bytes: int
    files: int
    def __init__(self, uid: _Optional[int] = ..., user: _Optional[str] = ..., bytes: _Optional[int] = ..., files: _Optional[int] = ...) -> None: ...

class TmpfsScan(_message.Message):
    __slots__ = ("time", "uses", "truncated", "entries")
    TIME_FIELD_NUMBER: _ClassVar[int]
    USES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    time: float
    uses: _containers.RepeatedCompositeFieldContainer[TmpfsUse]
    truncated: bool
    entries: int
    def __init__(self, time: _Optional[float] = ..., uses: _Optional[_Iterable[_Union[TmpfsUse, _Mapping]]] = ..., truncated: _Optional[bool] = ..., entries: _Optional[int] = ...) -> None: ...

class AgentMessage(_message.Message):
    __slots__ = ("hello", "batch", "train_answer")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    TRAIN_ANSWER_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    batch: Batch
    train_answer: TrainAnswer
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., batch: _Optional[_Union[Batch, _Mapping]] = ..., train_answer: _Optional[_Union[TrainAnswer, _Mapping]] = ...) -> None: ...

class TrainAnswer(_message.Message):
    __slots__ = ("id", "pid", "start_time", "status", "message", "payload", "truncated")
    ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    id: str
    pid: int
    start_time: float
    status: str
    message: str
    payload: str
    truncated: bool
    def __init__(self, id: _Optional[str] = ..., pid: _Optional[int] = ..., start_time: _Optional[float] = ..., status: _Optional[str] = ..., message: _Optional[str] = ..., payload: _Optional[str] = ..., truncated: _Optional[bool] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("seq",)
    SEQ_FIELD_NUMBER: _ClassVar[int]
    seq: int
    def __init__(self, seq: _Optional[int] = ...) -> None: ...

class SignalRequest(_message.Message):
    __slots__ = ("pid", "start_time", "signal", "reason")
    PID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    pid: int
    start_time: float
    signal: int
    reason: str
    def __init__(self, pid: _Optional[int] = ..., start_time: _Optional[float] = ..., signal: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class TrainRequest(_message.Message):
    __slots__ = ("id", "pid", "start_time", "kind", "asked_by", "args")
    class ArgsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ASKED_BY_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    id: str
    pid: int
    start_time: float
    kind: str
    asked_by: str
    args: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[str] = ..., pid: _Optional[int] = ..., start_time: _Optional[float] = ..., kind: _Optional[str] = ..., asked_by: _Optional[str] = ..., args: _Optional[_Mapping[str, str]] = ...) -> None: ...

class CollectorMessage(_message.Message):
    __slots__ = ("ack", "signal", "train_request")
    ACK_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    TRAIN_REQUEST_FIELD_NUMBER: _ClassVar[int]
    ack: Ack
    signal: SignalRequest
    train_request: TrainRequest
    def __init__(self, ack: _Optional[_Union[Ack, _Mapping]] = ..., signal: _Optional[_Union[SignalRequest, _Mapping]] = ..., train_request: _Optional[_Union[TrainRequest, _Mapping]] = ...) -> None: ...
