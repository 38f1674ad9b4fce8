"""Conversion between the sample model (clusterwatch.model) and the wire messages (clusterwatch.v1).

Unset optional fields on the wire are None in the model and the reverse: a reading
that could not be taken never turns into a zero.
"""
from __future__ import annotations

from typing import NamedTuple

from clusterwatch.model import (
    HELD_STATES,
    AllocatorFigures,
    GpuActivity,
    GpuInfo,
    GpuReading,
    GpuUse,
    JobEvent,
    ProcessSample,
    TrainingReport,
    clean_wchan,
)
from clusterwatch.v1 import agent_pb2

_EVENT_KIND = {"start": agent_pb2.JobEvent.START, "end": agent_pb2.JobEvent.END}
_EVENT_NAME = {v: k for k, v in _EVENT_KIND.items()}


def _opt(msg, name: str):
    return getattr(msg, name) if msg.HasField(name) else None


# -- process samples: the columnar ProcessTable ------------------------------------------------

_NAN = float("nan")

class ProcessLabels(NamedTuple):
    """One `label_sets` entry of a ProcessTable: the fields of a ProcessSample it holds, in ProcessSample's
    order. A named tuple: the collector compares a process's labels whole, in C, every batch."""

    ppid: int
    uid: int
    user: str
    command: str
    job_id: str
    rank: int | None
    local_rank: int | None
    step_id: str
    mapped_by: str


LABEL_FIELDS = ProcessLabels._fields


# Each distinct label set, encoded as one `label_sets` entry of a ProcessTable, by its labels (ProcessLabels' order): a
# node's label sets rarely change from poll to poll, and merging their bytes costs a fraction of
# building the messages again. Bounded: cleared when full.
_LABEL_ENTRIES: dict[tuple, bytes] = {}
_LABEL_ENTRIES_MAX = 4096


def _label_entry(key: tuple) -> bytes:
    """The ProcessTable bytes of one label_sets entry holding `key` (ProcessLabels' order), cached."""
    ppid, uid, user, command, job_id, rank, local_rank, step_id, mapped_by = key
    t = agent_pb2.ProcessTable()
    m = t.label_sets.add(ppid=ppid, uid=uid, user=user, command=command, job_id=job_id, step_id=step_id,
                         mapped_by=mapped_by)
    if rank is not None:
        m.rank = rank
    if local_rank is not None:
        m.local_rank = local_rank
    entry = t.SerializeToString()
    if len(_LABEL_ENTRIES) >= _LABEL_ENTRIES_MAX:
        _LABEL_ENTRIES.clear()
    _LABEL_ENTRIES[key] = entry
    return entry


def processes_to_table(samples: list[ProcessSample], out: agent_pb2.ProcessTable) -> None:
    """Write samples as rows of `out` (usually `batch.processes`, empty).

    Label sets and GPU UUIDs are listed in order of first appearance. One comprehension per column
    (the agent calls this every poll): the per-value cost is mostly protobuf's, not Python's.
    """
    nan = _NAN
    label_index: dict[tuple, int] = {}
    index = label_index.setdefault
    out.labels.extend([index((s.ppid, s.uid, s.user, s.command, s.job_id, s.rank, s.local_rank, s.step_id,
                              s.mapped_by), len(label_index)) for s in samples])
    out.time.extend([s.time for s in samples])
    out.pid.extend([s.pid for s in samples])
    out.start_time.extend([s.start_time for s in samples])
    out.cpu_percent.extend([nan if (v := s.cpu_percent) is None else v for s in samples])
    out.rss_bytes.extend([-1 if (v := s.rss_bytes) is None else v for s in samples])
    out.threads.extend([-1 if (v := s.threads) is None else v for s in samples])
    out.open_fds.extend([-1 if (v := s.open_fds) is None else v for s in samples])
    gpus = [s.gpus for s in samples]
    out.gpu_count.extend(map(len, gpus))
    if any(gpus):
        uses = [g for gs in gpus for g in gs]  # GpuUse: (gpu_uuid, used_memory_bytes, sm_utilization)
        uuid_index: dict[str, int] = {}
        index = uuid_index.setdefault
        out.gpu.extend([index(g[0], len(uuid_index)) for g in uses])
        out.gpu_memory_bytes.extend([-1 if (v := g[1]) is None else v for g in uses])
        out.gpu_sm_utilization.extend([nan if (v := g[2]) is None else v for g in uses])
        out.gpu_uuids.extend(uuid_index)
    held = [i for i, s in enumerate(samples) if s.state]  # usually none: one pass, no message
    for i in held:
        s = samples[i]
        out.states.add(row=i, state=s.state, wchan=s.wchan)
    entries = _LABEL_ENTRIES
    out.MergeFromString(b"".join([entries.get(k) or _label_entry(k) for k in label_index]))


class ProcessColumns:
    """A ProcessTable decoded into Python lists, checked for consistency.

    Every column becomes a list: the collector reads each of them whole (its checks take each
    column's bounds, the per-poll path every poll's CPU), and a list reads many times faster
    than the message's own sequence (each item read from one of those builds a Python object).

    Raises ValueError (a one-line reason) for a table whose columns disagree: the
    collector rejects such a batch rather than guessing.
    """

    __slots__ = ("rows", "time", "pid", "start_time", "labels", "cpu_percent", "rss_bytes", "threads",
                 "open_fds", "gpu_count", "gpu", "gpu_memory_bytes", "gpu_sm_utilization", "label_sets",
                 "gpu_uuids", "states", "_width")

    def __init__(self, t: agent_pb2.ProcessTable) -> None:
        # a whole slice of a repeated field is a list, built in one call (a third cheaper than list())
        self.pid = t.pid[:]
        n = self.rows = len(self.pid)
        self.time, self.start_time, self.labels = t.time[:], t.start_time[:], t.labels[:]
        self.cpu_percent, self.rss_bytes = t.cpu_percent[:], t.rss_bytes[:]
        self.threads, self.open_fds, self.gpu_count = t.threads[:], t.open_fds[:], t.gpu_count[:]
        for name in ("time", "start_time", "labels", "cpu_percent", "rss_bytes", "threads", "open_fds", "gpu_count"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"process table: column {name} has {len(getattr(self, name))} rows, pid has {n}")
        self.gpu, self.gpu_memory_bytes = t.gpu[:], t.gpu_memory_bytes[:]
        self.gpu_sm_utilization = t.gpu_sm_utilization[:]
        uses = sum(self.gpu_count)
        for name in ("gpu", "gpu_memory_bytes", "gpu_sm_utilization"):
            if len(getattr(self, name)) != uses:
                raise ValueError(f"process table: column {name} has {len(getattr(self, name))} entries, "
                                 f"gpu_count adds up to {uses}")
        self.label_sets = [ProcessLabels(m.ppid, m.uid, m.user, m.command, m.job_id,
                                         m.rank if m.HasField("rank") else None,
                                         m.local_rank if m.HasField("local_rank") else None, m.step_id, m.mapped_by)
                           for m in t.label_sets]
        self.gpu_uuids = list(t.gpu_uuids)
        if n and max(self.labels) >= len(self.label_sets):
            raise ValueError(f"process table: a row points at label set {max(self.labels)} "
                             f"of {len(self.label_sets)}")
        if uses and max(self.gpu) >= len(self.gpu_uuids):
            raise ValueError(f"process table: a GPU use points at GPU {max(self.gpu)} of {len(self.gpu_uuids)}")
        self.states = held_states(t, n) if len(t.states) else _NO_STATES
        self._width = -1  # poll_width(), once worked out

    def state_of(self, i: int) -> tuple[str, str]:
        """Row i's (state, wchan): ("", "") for a process that runs or sleeps."""
        return self.states.get(i, _RUNNING)

    def poll_width(self) -> int:
        """Rows a poll when the table's polls list the same processes in the same order, with the same
        labels and GPUs (a batch of the agent's, unless a process came or went); 0 otherwise.

        Polls are told apart by their time: the rows of one poll share it, and polls follow in time order.
        Worked out once (the checks and the state's update both ask; the columns do not change).
        """
        if self._width < 0:
            self._width = self._poll_width()
        return self._width

    def _poll_width(self) -> int:
        n, times = self.rows, self.time
        if not n:
            return 0
        width = times.count(times[0])
        if n % width or times[:width].count(times[0]) != width:
            return 0
        if width == n:
            return width
        # every poll like the one before it: each column equals itself shifted by a poll (one C comparison)
        if any(col[width:] != col[:-width] for col in (self.pid, self.start_time, self.labels, self.gpu_count)):
            return 0
        uses = sum(self.gpu_count[:width])
        if uses and self.gpu[uses:] != self.gpu[:-uses]:
            return 0
        for a in range(width, n, width):
            if times[a] <= times[a - 1] or times[a:a + width].count(times[a]) != width:
                return 0
        return width

    def gpu_uses(self, first: int, count: int) -> tuple[GpuUse, ...]:
        """The GPU-use entries first .. first+count as GpuUse values (unknown readings None)."""
        uuids, mem, sm = self.gpu_uuids, self.gpu_memory_bytes, self.gpu_sm_utilization
        out = []
        for j in range(first, first + count):
            m, u = mem[j], sm[j]
            out.append(GpuUse(uuids[self.gpu[j]], m if m >= 0 else None, u if u == u else None))
        return tuple(out)

    def sample(self, i: int, node: str, gpu_first: int) -> ProcessSample:
        """Row i as a ProcessSample; gpu_first is where its GPU-use entries start."""
        c, r, th, fd = self.cpu_percent[i], self.rss_bytes[i], self.threads[i], self.open_fds[i]
        lab = self.label_sets[self.labels[i]]
        out = ProcessSample(
            time=self.time[i], node=node, pid=self.pid[i], start_time=self.start_time[i], ppid=lab.ppid,
            uid=lab.uid, user=lab.user, command=lab.command, job_id=lab.job_id, rank=lab.rank,
            local_rank=lab.local_rank, step_id=lab.step_id, mapped_by=lab.mapped_by,
            cpu_percent=c if c == c else None, rss_bytes=r if r >= 0 else None, threads=th if th >= 0 else None,
            open_fds=fd if fd >= 0 else None, gpus=self.gpu_uses(gpu_first, self.gpu_count[i]))
        if self.states:
            out.state, out.wchan = self.state_of(i)
        return out


_NO_STATES: dict[int, tuple[str, str]] = {}
_RUNNING = ("", "")


def held_states(t: agent_pb2.ProcessTable, rows: int) -> dict[int, tuple[str, str]]:
    """A table's `states` as row → (state, wchan), checked: a state not among HELD_STATES is dropped (an
    agent newer than this collector may send more), a wchan is cleaned (clean_wchan: an agent's text is shown
    to people); ValueError for a row past the table's."""
    out: dict[int, tuple[str, str]] = {}
    for m in t.states:
        if m.row >= rows:
            raise ValueError(f"process table: a process state points at row {m.row} of {rows}")
        if m.state in HELD_STATES:
            out[m.row] = (m.state, clean_wchan(m.wchan) if m.state == "D" else "")
    return out


def processes_from_table(t: agent_pb2.ProcessTable, node: str) -> list[ProcessSample]:
    """Every row of a table as a ProcessSample of `node` (ValueError for an inconsistent table)."""
    cols = ProcessColumns(t)
    out, g = [], 0
    for i in range(cols.rows):
        out.append(cols.sample(i, node, g))
        g += cols.gpu_count[i]
    return out


def gpu_reading_to_proto(r: GpuReading, time: float, out: agent_pb2.GpuSample) -> None:
    out.time = time
    out.uuid = r.uuid
    for name in ("utilization", "memory_used_bytes", "memory_total_bytes", "power_watts", "energy_mj"):
        v = getattr(r, name)
        if v is not None:
            setattr(out, name, v)


_ACTIVITY_FIGURES = GpuActivity._fields[1:]  # after window_s: each optional on the wire


def gpu_activity_to_proto(a: GpuActivity, out: agent_pb2.GpuActivity) -> None:
    out.window_s = a.window_s
    for name in _ACTIVITY_FIGURES:
        v = getattr(a, name)
        if v is not None:
            setattr(out, name, v)


def gpu_activity_from_proto(m: agent_pb2.GpuActivity) -> GpuActivity:
    has = m.HasField
    return GpuActivity(m.window_s, *(getattr(m, name) if has(name) else None for name in _ACTIVITY_FIGURES))


def gpu_reading_from_proto(m: agent_pb2.GpuSample) -> GpuReading:
    # written out, positionally: the collector converts every GPU reading of every poll
    has = m.HasField
    return GpuReading(
        m.uuid,
        m.utilization if has("utilization") else None,
        m.memory_used_bytes if has("memory_used_bytes") else None,
        m.memory_total_bytes if has("memory_total_bytes") else None,
        m.power_watts if has("power_watts") else None,
        m.energy_mj if has("energy_mj") else None,
    )


def gpu_info_to_proto(g: GpuInfo, out: agent_pb2.GpuInfo) -> None:
    out.uuid = g.uuid
    out.index = g.index
    out.name = g.name
    out.memory_total_bytes = g.memory_total_bytes
    out.parent_uuid = g.parent_uuid
    if g.serial:
        out.serial = g.serial


def gpu_info_from_proto(m: agent_pb2.GpuInfo) -> GpuInfo:
    return GpuInfo(m.uuid, m.index, m.name, m.memory_total_bytes, m.parent_uuid, m.serial)


def training_to_proto(r: TrainingReport, out: agent_pb2.TrainingSample) -> None:
    out.time = r.time
    out.pid = r.pid
    out.start_time = r.start_time
    for name in ("step", "loss", "lr", "epoch"):
        v = getattr(r, name)
        if v is not None:
            setattr(out, name, v)
    out.metrics.update(r.metrics)
    out.tags.update(r.tags)
    for g in r.gpu_memory:
        m = out.gpu_memory.add()
        if g.index is not None:
            m.device_index = g.index
        m.gpu_uuid = g.uuid
        for name, value in (("allocated_bytes", g.allocated_bytes), ("reserved_bytes", g.reserved_bytes),
                            ("alloc_retries", g.alloc_retries), ("inactive_split_bytes", g.inactive_split_bytes)):
            if value is not None:
                setattr(m, name, value)


def training_from_proto(m: agent_pb2.TrainingSample) -> TrainingReport:
    return TrainingReport(
        time=m.time,
        pid=m.pid,
        start_time=m.start_time,
        step=_opt(m, "step"),
        loss=_opt(m, "loss"),
        lr=_opt(m, "lr"),
        epoch=_opt(m, "epoch"),
        metrics=dict(m.metrics),
        tags=dict(m.tags),
        gpu_memory=[AllocatorFigures(_opt(g, "device_index"), g.gpu_uuid, _opt(g, "allocated_bytes"),
                                     _opt(g, "reserved_bytes"), _opt(g, "alloc_retries"),
                                     _opt(g, "inactive_split_bytes")) for g in m.gpu_memory],
    )


def job_event_to_proto(e: JobEvent, out: agent_pb2.JobEvent) -> None:
    out.kind = _EVENT_KIND[e.kind]
    out.job_id = e.job_id
    out.time = e.time
    out.uid = e.uid
    out.user = e.user
    out.gpu_uuids.extend(e.gpu_uuids)
    out.gpu_indexes = e.gpu_indexes
    if e.exit_code is not None:
        out.exit_code = e.exit_code


def job_event_from_proto(m: agent_pb2.JobEvent) -> JobEvent:
    return JobEvent(
        kind=_EVENT_NAME.get(m.kind, "start"),
        job_id=m.job_id,
        time=m.time,
        uid=m.uid,
        user=m.user,
        gpu_uuids=tuple(m.gpu_uuids),
        gpu_indexes=m.gpu_indexes,
        exit_code=_opt(m, "exit_code"),
    )
