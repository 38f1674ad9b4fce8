"""Conversion between the sample model (clusterwatch.model) and the wire messages (clusterwatch.v1).

Unset optional fields on the wire are None in the model and the reverse: a reading
that could not be taken never turns into a zero.
"""
from __future__ import annotations

from clusterwatch.model import GpuInfo, GpuReading, GpuUse, JobEvent, ProcessSample, TrainingReport
from clusterwatch.v1 import agent_pb2

_EVENT_KIND = {"start": agent_pb2.JobEvent.START, "end": agent_pb2.JobEvent.END}
_EVENT_NAME = {v: k for k, v in _EVENT_KIND.items()}


def _opt(msg, name: str):
    return getattr(msg, name) if msg.HasField(name) else None


def process_to_proto(s: ProcessSample, out: agent_pb2.ProcessSample) -> None:
    """Fill `out` (usually `batch.processes.add()`) from a sample."""
    _fill_static(s, out)
    _fill_readings(s, out)


def _fill_readings(s: ProcessSample, m: agent_pb2.ProcessSample) -> None:
    """The figures that change every poll; `m.gpus` already holds one entry per GPU of the sample."""
    m.time = s.time
    v = s.cpu_percent
    if v is not None:
        m.cpu_percent = v
    v = s.rss_bytes
    if v is not None:
        m.rss_bytes = v
    v = s.threads
    if v is not None:
        m.threads = v
    v = s.open_fds
    if v is not None:
        m.open_fds = v
    if s.gpus:
        for g, pg in zip(s.gpus, m.gpus, strict=True):
            v = g.used_memory_bytes
            if v is not None:
                pg.used_memory_bytes = v
            v = g.sm_utilization
            if v is not None:
                pg.sm_utilization = v


def _static_key(s: ProcessSample) -> tuple:
    return (s.node, s.start_time, s.ppid, s.uid, s.user, s.command, s.job_id, s.rank, s.local_rank, s.step_id,
            s.mapped_by, tuple([g.gpu_uuid for g in s.gpus]))


class ProcessFiller:
    """Fills a repeated ProcessSample field from samples, as process_to_proto does, at about half its cost.

    What rarely changes from poll to poll (identity, owner, command, labels, GPU UUIDs) is
    kept per process as a template message, copied in one call; the readings are set on
    the copy. A template is rebuilt whenever any of those fields differs, and forgotten
    when its process is missing from a poll. The wire content is the same, byte for byte.
    """

    def __init__(self) -> None:
        self._templates: dict[int, tuple[tuple, agent_pb2.ProcessSample]] = {}

    def fill(self, samples: list[ProcessSample], out) -> None:
        """Append one message per sample to `out` (e.g. `batch.processes`)."""
        old = self._templates
        templates: dict[int, tuple[tuple, agent_pb2.ProcessSample]] = {}
        add = out.add
        for s in samples:
            key = _static_key(s)
            entry = old.get(s.pid)
            if entry is None or entry[0] != key:
                template = agent_pb2.ProcessSample()
                _fill_static(s, template)
                entry = (key, template)
            templates[s.pid] = entry
            m = add()
            m.CopyFrom(entry[1])
            _fill_readings(s, m)
        self._templates = templates


def _fill_static(s: ProcessSample, out: agent_pb2.ProcessSample) -> None:
    out.node = s.node
    out.pid = s.pid
    out.start_time = s.start_time
    out.ppid = s.ppid
    out.uid = s.uid
    out.user = s.user
    out.command = s.command
    out.job_id = s.job_id
    out.step_id = s.step_id
    out.mapped_by = s.mapped_by
    if s.rank is not None:
        out.rank = s.rank
    if s.local_rank is not None:
        out.local_rank = s.local_rank
    for g in s.gpus:
        out.gpus.add(gpu_uuid=g.gpu_uuid)


def update_readings(s: ProcessSample, m: agent_pb2.ProcessSample) -> None:
    """Refresh only what changes from poll to poll (time, CPU, memory, threads, fds, GPUs) in place.

    For a process whose identity and labels are unchanged this replaces a full conversion:
    the collector's ingest does it for nearly every sample.
    """
    has = m.HasField
    s.time = m.time
    s.cpu_percent = m.cpu_percent if has("cpu_percent") else None
    s.rss_bytes = m.rss_bytes if has("rss_bytes") else None
    s.threads = m.threads if has("threads") else None
    s.open_fds = m.open_fds if has("open_fds") else None
    gpus = m.gpus
    if gpus or s.gpus:
        s.gpus = tuple(
            GpuUse(g.gpu_uuid, g.used_memory_bytes if g.HasField("used_memory_bytes") else None,
                   g.sm_utilization if g.HasField("sm_utilization") else None) for g in gpus
        )


def same_labels(s: ProcessSample, m: agent_pb2.ProcessSample) -> bool:
    """Whether a new sample keeps the job labels the process had (the common case)."""
    return (s.job_id == m.job_id and s.mapped_by == m.mapped_by
            and s.rank == (m.rank if m.HasField("rank") else None))


def process_from_proto(m: agent_pb2.ProcessSample) -> ProcessSample:
    return ProcessSample(
        time=m.time,
        node=m.node,
        pid=m.pid,
        start_time=m.start_time,
        ppid=m.ppid,
        uid=m.uid,
        user=m.user,
        command=m.command,
        job_id=m.job_id,
        rank=_opt(m, "rank"),
        local_rank=_opt(m, "local_rank"),
        step_id=m.step_id,
        mapped_by=m.mapped_by,
        cpu_percent=_opt(m, "cpu_percent"),
        rss_bytes=_opt(m, "rss_bytes"),
        threads=_opt(m, "threads"),
        open_fds=_opt(m, "open_fds"),
        gpus=tuple(
            GpuUse(g.gpu_uuid, _opt(g, "used_memory_bytes"), _opt(g, "sm_utilization")) for g in m.gpus
        ),
    )


def gpu_reading_to_proto(r: GpuReading, time: float, out: agent_pb2.GpuSample) -> None:
    out.time = time
    out.uuid = r.uuid
    for name in ("utilization", "memory_used_bytes", "memory_total_bytes", "power_watts"):
        v = getattr(r, name)
        if v is not None:
            setattr(out, name, v)


def gpu_reading_from_proto(m: agent_pb2.GpuSample) -> GpuReading:
    return GpuReading(
        uuid=m.uuid,
        utilization=_opt(m, "utilization"),
        memory_used_bytes=_opt(m, "memory_used_bytes"),
        memory_total_bytes=_opt(m, "memory_total_bytes"),
        power_watts=_opt(m, "power_watts"),
    )


def gpu_info_to_proto(g: GpuInfo, out: agent_pb2.GpuInfo) -> None:
    out.uuid = g.uuid
    out.index = g.index
    out.name = g.name
    out.memory_total_bytes = g.memory_total_bytes


def gpu_info_from_proto(m: agent_pb2.GpuInfo) -> GpuInfo:
    return GpuInfo(m.uuid, m.index, m.name, m.memory_total_bytes)


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
