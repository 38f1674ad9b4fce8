"""What the rule engine reads and what it says.

Readings go in as observations (one per process, GPU or node at one time); alert
events come out. Every reading may be None: a missing metric is not an error.
Time is whatever the caller says it is (trace seconds or Unix time); the engine
never reads a clock.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

# re-exported for the rules: the names live in clusterwatch/, where the report and cli/ compare them too
from clusterwatch.rule_names import RULE_NAMES as RULE_NAMES
from clusterwatch.rule_names import Rule as Rule

PENDING = "pending"
FIRING = "firing"
RESOLVED = "resolved"


class ProcessObservation(NamedTuple):
    """One process at one poll. Identity is (node, pid, start_time).

    The one input of the process rules: the collector builds it from its state
    (collector/state/observations.py), and a trace's process line is its fields written down.
    A NamedTuple, not a dataclass: the collector builds one for every process of every batch
    (`_make` costs a third of a dataclass's `__init__`), and the engine unpacks it in one step.

    Attributes:
        t: Time of the poll in seconds (trace seconds or Unix time).
        node: Node name.
        job_id: Slurm job id, "" when unknown.
        pid: Process id on the node.
        start_time: Process start time; a reused pid gets a new one.
        gpu: GPU of the process (UUID, or index as text), "" when none.
        rank: Rank in the job, None when unknown.
        user, command, job_name, partition: Labels used by overrides and the allow-list.
        gpu_mem_bytes: GPU memory the process uses.
        gpu_mem_total_bytes: Size of that GPU, for the time until it is full.
        gpu_util: SM utilisation in percent.
        cpu_percent: CPU in percent of one core.
        rss_bytes: Resident host memory.
        node_mem_total_bytes: Node memory, for the time until it is full.
        job_mem_total_bytes: Where Slurm gives the job memory, the process's ceiling under that allocation
            (its RSS plus the room the job's share of the node has left): a host leak is measured against
            it instead of the node's memory, and named "the job's memory allocation".
        threads, open_fds: Handle counts.
        step: Training step the process last reported.
        gpu_allocated_bytes, gpu_reserved_bytes: What the framework's allocator holds in live tensors and
            from the driver (its cache too), over the process's GPUs, where the process reports them
            (clusterwatch.train); gpu_memory_leak judges allocated bytes where they are given.
        gpu_alloc_retries: Allocations that freed the allocator's cache and retried (gpu_memory_fragmentation).
        tmpfs_bytes: What the job's user's files hold on the node's tmpfs (/dev/shm, ...), given on one process of
            the job per node (its oldest there) and added to its RSS for host_memory_leak: files no process maps
            (written with write(), or mapped then unmapped) are in no RSS. None elsewhere.
        tokens, samples: The work the process counts beside its steps, as it last reported it (tokens or samples
            trained on since the run began, collector/state/work_counts.py): job_slowdown judges its throughput in
            them where given, steps/s otherwise.
    """

    t: float
    node: str
    job_id: str = ""
    pid: int = 0
    start_time: float = 0.0
    gpu: str = ""
    rank: int | None = None
    user: str = ""
    command: str = ""
    job_name: str = ""
    partition: str = ""
    gpu_mem_bytes: float | None = None
    gpu_mem_total_bytes: float | None = None
    gpu_util: float | None = None
    cpu_percent: float | None = None
    rss_bytes: float | None = None
    node_mem_total_bytes: float | None = None
    job_mem_total_bytes: float | None = None
    threads: int | None = None
    open_fds: int | None = None
    step: int | None = None
    gpu_allocated_bytes: float | None = None
    gpu_reserved_bytes: float | None = None
    gpu_alloc_retries: int | None = None
    tmpfs_bytes: float | None = None
    tokens: float | None = None
    samples: float | None = None


@dataclass(slots=True)  # not frozen: a frozen dataclass costs three times as much to build, every GPU every batch
class GpuObservation:
    """One GPU at one poll, for `idle_gpu`.

    Attributes:
        t: Time of the poll in seconds.
        node: Node name.
        gpu: GPU UUID.
        job_id: Job the GPU is allocated to, "" when unallocated.
        utilization: GPU utilisation in percent, None when unknown.
        processes: Number of processes using the GPU, None when unknown.
        index: GPU index, for display only.
        power_watts: Power draw, None when unknown (a stall's cause: a hung collective reads ~100 %
            utilisation at near-idle power).
        sm_active: SM activity in percent (NVML GPM), None where the GPU does not offer it: utilisation says
            only that a kernel ran, this how much of the GPU it used (a spinning collective reads ~0).
        tensor_active: Tensor-core activity in percent (GPM), None where not read.
    """

    t: float
    node: str
    gpu: str
    job_id: str = ""
    utilization: float | None = None
    processes: int | None = None
    index: int | None = None
    power_watts: float | None = None
    sm_active: float | None = None
    tensor_active: float | None = None


class GpuClockObservation(NamedTuple):
    """A GPU's clock-event reasons, temperature, violation time and link error counters at one health read, for
    `job_slowdown` (which GPU holds its job back). At the health counters' cadence (every 30 s or so), not every
    poll.

    Attributes:
        t: Time of the read in seconds.
        node: Node name.
        gpu: GPU UUID (the whole GPU).
        job_id: Job the GPU is allocated to, "" when none.
        reasons: NVML's clock-event reason bits active, None when the GPU does not say.
        temperature_c: Core temperature, None when unknown.
        index: GPU index, for display only.
        violation_s: NVML's violation time by policy (seconds held down since the driver loaded), None: not read.
        pcie_replays: The PCIe replay counter, None: not read.
        nvlink_errors: The NVLink error counters summed over counters and links, None: none read.
    """

    t: float
    node: str
    gpu: str
    job_id: str = ""
    reasons: int | None = None
    temperature_c: float | None = None
    index: int | None = None
    violation_s: dict[str, float] | None = None
    pcie_replays: int | None = None
    nvlink_errors: int | None = None

    @classmethod
    def of_reading(cls, node: str, reading: Any, job_id: str, index: int | None) -> GpuClockObservation:
        """A GpuHealth reading's (the agents' health record) clock-event reasons and temperature: what the collector
        feeds the engine from each batch (collector/alerting/live.py), and replay from a trace's gpu_health record
        read back into one, so that both feed it alike.

        Args:
            node: The reading's node.
            reading: The GpuHealth message.
            job_id: The running job its GPU is allocated to, "" where none.
            index: The GPU's index, for display.
        """
        return cls(reading.time, node, reading.uuid, job_id,
                   reading.clock_event_reasons if reading.HasField("clock_event_reasons") else None,
                   float(reading.temperature_c) if reading.HasField("temperature_c") else None, index,
                   dict(reading.violation_seconds) or None,
                   reading.pcie_replays if reading.HasField("pcie_replays") else None,
                   sum(reading.nvlink_errors.values()) if reading.nvlink_errors else None)


@dataclass(slots=True)  # not frozen, as GpuObservation
class NodeHeartbeat:
    """A node's agent reported, for `agent_down`.

    Attributes:
        t: Time of the report in seconds.
        node: Node name.
        has_jobs: Whether jobs run on the node (only such nodes raise agent_down).
        every_s: How often the agent sends (its send interval): a node is not silent before
            three of those have passed, whatever the rule's after_s.
        job_ids: The jobs whose processes it reported, for the alert's text and its job (a job's
            `status` shows the agent_down of its nodes).
    """

    t: float
    node: str
    has_jobs: bool = True
    every_s: float = 0.0
    job_ids: tuple[str, ...] = ()


class ActiveAlert(NamedTuple):
    """An alert pending or firing about a process, as the engine holds it (Engine.active)."""

    rule: str
    state: str  # PENDING or FIRING
    node: str
    pid: int
    start_time: float


@dataclass(slots=True)
class AlertEvent:
    """A change of an alert's state, as the engine emits it.

    Attributes:
        t: Time of the change (input time, trace seconds in replay).
        rule: Rule name (one of RULE_NAMES).
        state: "pending", "firing" or "resolved".
        severity: "info", "warning" or "critical".
        node, job_id, pid, start_time, gpu, rank: What the alert is about; pid is
            -1 for alerts about a GPU or a node.
        description: One line a person understands.
        figures: The numbers behind it (rate_bytes_per_h, growth_for_s,
            time_to_full_s, idle_for_s, ...).
    """

    t: float
    rule: str
    state: str
    severity: str
    node: str
    job_id: str = ""
    pid: int = -1
    start_time: float = 0.0
    gpu: str = ""
    rank: int | None = None
    description: str = ""
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """Identity of the alert across its states: rule and subject."""
        return f"{self.rule}|{self.node}|{self.pid}|{self.start_time!r}|{self.gpu}"

    def to_dict(self) -> dict[str, Any]:
        """The event as one flat JSON-ready object (figures merged in at top level)."""
        d: dict[str, Any] = {
            "t": self.t,
            "rule": self.rule,
            "state": self.state,
            "severity": self.severity,
            "job_id": self.job_id,
            "node": self.node,
            "pid": self.pid,
            "start_time": self.start_time,
            "gpu": self.gpu,
            "rank": self.rank,
            "description": self.description,
        }
        for k, v in self.figures.items():
            d.setdefault(k, v)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AlertEvent:
        """Rebuild an event from `to_dict` output (unknown keys become figures)."""
        base = {"t", "rule", "state", "severity", "job_id", "node", "pid", "start_time", "gpu", "rank",
                "description"}
        return cls(
            t=float(d["t"]), rule=str(d["rule"]), state=str(d["state"]),
            severity=str(d.get("severity", "warning")), node=str(d.get("node", "")),
            job_id=str(d.get("job_id", "")), pid=int(d.get("pid", -1)),
            start_time=float(d.get("start_time", 0.0)), gpu=str(d.get("gpu", "")),
            rank=d.get("rank"), description=str(d.get("description", "")),
            figures={k: v for k, v in d.items() if k not in base},
        )
