"""The sample model shared by the agent and the collector.

Plain dataclasses, independent of protobuf, so sources, rules and tests deal in
domain values. A process is (node, pid, start_time), never a pid alone; a GPU is
its UUID, never its index. Every reading that could not be taken is None.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class ProcessKey(NamedTuple):
    """Identity of a process across polls: a reused pid gets a new start time.

    A named tuple rather than a dataclass: the collector hashes millions of these, and a
    tuple hashes and compares in C.
    """

    node: str
    pid: int
    start_time: float


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One GPU of a node: a whole GPU, or a MIG instance (a slice of one), which names its parent's UUID: a
    GPU's health (XIDs, ECC, lost, throttling) is read on the whole GPU, and is its slices' health too."""

    uuid: str
    index: int
    name: str
    memory_total_bytes: int
    parent_uuid: str = ""  # a MIG instance's: the whole GPU's UUID; "" for a whole GPU
    serial: str = ""  # the board's serial where NVML gives one (a MIG instance: its parent's); "" otherwise


class GpuUse(NamedTuple):
    """Use of one GPU by one process (a named tuple: the collector builds one per process per poll)."""

    gpu_uuid: str
    used_memory_bytes: int | None = None
    sm_utilization: float | None = None


class GpuReading(NamedTuple):
    """One GPU at one poll (a named tuple, as GpuUse)."""

    uuid: str
    utilization: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_watts: float | None = None
    # NVML's total-energy counter, millijoules since the driver loaded (the whole GPU's; None on a MIG instance)
    energy_mj: int | None = None


# The activity levels a job's GPU time is binned by (collector/state/job_cost.py, status's Cost section, /metrics):
# upper edges in percent of the first four; the last runs to 100 %.
ACTIVITY_EDGES = (5.0, 25.0, 50.0, 75.0)
ACTIVITY_LEVELS = ("0-5", "5-25", "25-50", "50-75", "75-100")


class GpuActivity(NamedTuple):
    """What a GPU's units did over a window of seconds, as NVML's GPU Performance Monitoring measures it (GPM:
    Hopper and later; a MIG instance has its own). Utilisation says only that a kernel ran; these say how much
    of the GPU it used, so a collective spinning on one SM reads near 0 here. None: the GPU does not offer it.

    Percentages are 0-100, as GpuReading.utilization; throughputs are bytes per second.
    """

    window_s: float
    sm_active: float | None = None          # share of the SMs busy (NVML_GPM_METRIC_SM_UTIL)
    sm_occupancy: float | None = None       # resident warps against the SMs' maximum
    tensor_active: float | None = None      # time the SMs issued tensor-core instructions (any kind)
    dram_active: float | None = None        # DRAM bandwidth used against its peak
    pcie_tx_bytes_per_s: float | None = None
    pcie_rx_bytes_per_s: float | None = None
    nvlink_tx_bytes_per_s: float | None = None  # over all of the GPU's links
    nvlink_rx_bytes_per_s: float | None = None


#: The states of /proc/PID/stat (field 3, its main thread's) that hold a process where it is, and what each
#: means: a rank in one of them makes no progress, and its job waits for it. The others (R running, S
#: sleeping, I idle) are a process at work or waiting for something that comes; Z (exited) is not sampled.
HELD_STATES = {
    "D": "uninterruptible sleep",
    "T": "stopped",
    "t": "stopped by a tracer",
}
#: At most this many characters of a wchan: kernel symbols are well under it.
WCHAN_CHARS = 64
#: The names uid 0 goes by (its name, or its number where it could not be named). Its tmpfs files (/run,
#: /dev/shm) are the machine's, never counted in a job's host memory: collector/state/tmpfs.py.
ROOT_USERS = frozenset({"root", "0"})
_SYMBOL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.")


def clean_wchan(text: str | bytes) -> str:
    """A wchan as it may be shown: a kernel symbol's characters only (any other one as "?"), at most
    WCHAN_CHARS of them; "" for none ("0" is what the kernel says of a process that does not wait)."""
    if isinstance(text, bytes):
        text = text[:WCHAN_CHARS * 4].decode("ascii", "replace")
    text = text.strip()[:WCHAN_CHARS]
    if text in ("", "0"):
        return ""
    return "".join(c if c in _SYMBOL_CHARS else "?" for c in text)


@dataclass(slots=True)
class ProcessSample:
    """One process at one poll, with its job labels where known."""

    time: float
    node: str
    pid: int
    start_time: float
    ppid: int = 0
    uid: int = 0
    user: str = ""
    command: str = ""
    job_id: str = ""
    rank: int | None = None
    local_rank: int | None = None
    step_id: str = ""
    mapped_by: str = ""
    cpu_percent: float | None = None
    rss_bytes: int | None = None
    threads: int | None = None
    open_fds: int | None = None
    gpus: tuple[GpuUse, ...] = ()
    # The kernel's state letter of a process held where it is (see HELD_STATES), "" while it runs or sleeps
    # (or is not known); for one in D, the kernel function it waits in (/proc/PID/wchan), cleaned (clean_wchan).
    state: str = ""
    wchan: str = ""

    @property
    def key(self) -> ProcessKey:
        return ProcessKey(self.node, self.pid, self.start_time)

    @property
    def gpu_memory_bytes(self) -> int | None:
        """GPU memory over all the process's GPUs, None when no GPU reported a figure."""
        vals = [g.used_memory_bytes for g in self.gpus if g.used_memory_bytes is not None]
        return sum(vals) if vals else None

    @property
    def gpu_utilization(self) -> float | None:
        """Highest SM utilisation over the process's GPUs, None when none reported one."""
        vals = [g.sm_utilization for g in self.gpus if g.sm_utilization is not None]
        return max(vals) if vals else None


@dataclass(frozen=True, slots=True)
class AllocatorFigures:
    """GPU memory as a training process's allocator sees it, for one device (clusterwatch.train).

    `index` None: the process's current device (figures a framework passed itself); `uuid` is the
    framework's UUID of the device ("" when not given), without NVML's "GPU-" prefix in some torch
    releases.
    """

    index: int | None = None
    uuid: str = ""
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    alloc_retries: int | None = None
    inactive_split_bytes: int | None = None


@dataclass(slots=True)
class TrainingReport:
    """A progress report from a training process (clusterwatch.train.report)."""

    time: float
    pid: int
    start_time: float = 0.0
    step: int | None = None
    loss: float | None = None
    lr: float | None = None
    epoch: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    gpu_memory: list[AllocatorFigures] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class JobEvent:
    """A job started (prolog) or ended (epilog) on a node."""

    kind: str  # "start" | "end"
    job_id: str
    time: float
    uid: int = 0
    user: str = ""
    gpu_uuids: tuple[str, ...] = ()
    gpu_indexes: str = ""
    exit_code: int | None = None
