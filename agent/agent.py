"""The agent's poll loop: GPUs, then the watched process trees, labelled, batched, sent.

One poll: read every GPU (which also names the processes on them), walk the watched
trees, sample each process, label it with its job and rank, and hand the batch to
the sender. The loop never raises for a failed read; failures are counted and sent
with the batch.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable

from clusterwatch.v1 import agent_pb2

from clusterwatch import __version__
from clusterwatch.model import JobEvent, ProcessSample
from clusterwatch.wire import (
    gpu_activity_to_proto,
    gpu_info_to_proto,
    gpu_reading_to_proto,
    job_event_to_proto,
    processes_from_table,
    processes_to_table,
    training_to_proto,
)

from .backends.gpu import GpuSource
from .backends.pid_visibility import NOT_IN_PROC, OTHER_NAMESPACE
from .config import AgentConfig
from .labels import JobLabeler
from .spool import JobSpool, with_gpu_uuids
from .tmpfs import tmpfs_scan_to_proto

log = logging.getLogger("clusterwatch.agent")

_PIDS_HIDDEN = {
    OTHER_NAMESPACE: agent_pb2.GPU_PIDS_OTHER_NAMESPACE,
    NOT_IN_PROC: agent_pb2.GPU_PIDS_NOT_IN_PROC,
}


def node_memory_total() -> int:
    """Host RAM in bytes: MemTotal of /proc/meminfo, psutil's figure where there is none (macOS); 0 if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except (ImportError, OSError, RuntimeError):
        return 0


class Agent:
    """Samples one node.

    Args:
        config: the agent's configuration.
        gpus: the GPU source (NVML, simulated, or none).
        procs: the process source (backends.procs.ProcSource, or backends.psutil_procs.PsutilProcSource).
        labeler: labels processes with job and rank.
        roots: the `--pid` roots (roots.WatchedRoots), followed while their process lives; None: none.
        clock: time source (Unix seconds); tests pass their own.
    """

    def __init__(
        self,
        config: AgentConfig,
        gpus: GpuSource,
        procs,
        labeler: JobLabeler,
        spool: JobSpool | None = None,
        clock: Callable[[], float] = time.time,
        train_drain: Callable[[], list] | None = None,
        provenance=None,
        health=None,
        train_endpoint=None,
        roots=None,
        job_output=None,
        health_file=None,
        tmpfs=None,
    ) -> None:
        self.config = config
        self.roots = roots
        self.gpus = gpus
        self.procs = procs
        self.labeler = labeler
        self.spool = spool
        self.clock = clock
        self.train_endpoint = train_endpoint  # train_endpoint.TrainEndpoint, closed by the runtime
        self.train_drain = train_drain if train_drain is not None or train_endpoint is None else train_endpoint.drain
        self.provenance = provenance
        self.health = health  # agent/health/monitor.py's HealthMonitor, or None
        self.job_output = job_output  # agent/job_output.py's JobOutputReader (--read-job-output), or None
        self.health_file = health_file  # agent/health_file.py's HealthFileWriter, for the prolog's gate, or None
        self.tmpfs = tmpfs  # agent/tmpfs.py's TmpfsScanner (what users' files hold in /dev/shm...), or None
        self.boot_id = uuid.uuid4().hex
        self.gpu_errors = 0
        self.inventory = gpus.inventory()
        self.memory_total = node_memory_total()
        self._hello_said = None  # what the last Hello said of NVML's pids
        # One look for new processes a poll, for both sources that look for them (the simulated GPUs, /proc).
        # (The psutil process source has none to share.)
        use_new_pids = getattr(gpus, "use_new_pids", None)
        new_pids = getattr(procs, "new_pids", None)
        self._shared_new_pids = (new_pids if use_new_pids is not None and new_pids is not None
                                 and use_new_pids(new_pids) else None)

    def hello(self) -> agent_pb2.Hello:
        """The Hello that opens every stream."""
        h = agent_pb2.Hello(
            node=self.config.node,
            boot_id=self.boot_id,
            agent_version=__version__,
            interval_s=self.config.interval_s,
            gpu_source=self.gpus.name,
            sent_at=self.clock(),
            node_memory_total_bytes=self.memory_total,
            send_interval_s=max(self.config.send_interval_s, self.config.interval_s),
            gpu_pids_hidden=self.gpu_pids_hidden(),
        )
        self._hello_said = h.gpu_pids_hidden
        for g in self.inventory:
            gpu_info_to_proto(g, h.gpus.add())
        return h

    def gpu_pids_hidden(self) -> int:
        """Why the GPU source's pids are not processes here (agent_pb2.GpuPidsHidden), from its last poll."""
        why = getattr(self.gpus, "pid_visibility", "")  # only the NVML source names host pids
        return _PIDS_HIDDEN.get(why, agent_pb2.GPU_PIDS_SEEN)

    def hello_outdated(self) -> bool:
        """Whether the last Hello no longer says what the GPU source now knows of its pids."""
        return self._hello_said is not None and self._hello_said != self.gpu_pids_hidden()

    @property
    def read_errors(self) -> int:
        """Failed reads since the agent started: of processes (/proc) and of GPUs."""
        return self.procs.read_errors + self.gpu_errors + (self.health.errors if self.health is not None else 0)

    def watched_roots(self, gpu_pids: set[int]) -> set[int]:
        """The processes whose trees are sampled this poll."""
        roots = self.roots.live() if self.roots is not None else set()
        if self.config.watch_all_gpu_processes:
            roots |= gpu_pids
        if self.spool is not None:
            roots |= self.spool.job_pids()
        return roots

    def poll(self) -> tuple[agent_pb2.Batch, list[ProcessSample]]:
        """Take one poll and return it as a batch (not yet numbered) and as samples."""
        batch, samples = self.poll_parts()
        processes_to_table(samples, batch.processes)
        return batch, samples

    def poll_parts(self) -> tuple[agent_pb2.Batch, list[ProcessSample]]:
        """Take one poll: a batch without its process table (see PollJoiner), and the samples."""
        now = self.clock()
        if self._shared_new_pids is not None:
            self._shared_new_pids.new_round()
        if self.train_endpoint is not None:
            self.train_endpoint.check()  # a removed training socket is bound again
        gpu_poll = self.gpus.poll(now)
        self.gpu_errors += gpu_poll.errors
        # The NVML source lists its GPUs again now and then (a reset, a MIG reconfiguration, a GPU
        # back on the bus): job events resolve against, and the next Hello carries, the current list.
        self.inventory = self.gpus.inventory()
        pids = self.procs.descendants(self.watched_roots(set(gpu_poll.processes)))
        samples = self.procs.sample(pids, now, gpu_poll.processes)
        first_seen = self.labeler.label(samples)
        batch = agent_pb2.Batch(sent_at=now)
        activity = gpu_poll.activity  # GPM readings since the last poll (a slower cadence): most polls have none
        for r in gpu_poll.readings:
            sample = batch.gpus.add()
            gpu_reading_to_proto(r, now, sample)
            if r.uuid in activity:
                gpu_activity_to_proto(activity[r.uuid], sample.activity)
        if self.spool is not None:
            for event in self.spool.take_events():
                # The prolog knows GPU indexes only; a GPU is named by its UUID from here on.
                job_event_to_proto(with_gpu_uuids(event, self.inventory), batch.job_events.add())
        reports = self.train_drain() if self.train_drain is not None else []
        for report in reports:
            training_to_proto(report, batch.training.add())
        if self.job_output is not None:  # progress read from the jobs' output, on the reader's own thread
            self.job_output.see(samples, reports)
            for report in self.job_output.drain():
                training_to_proto(report, batch.training.add())
        if self.provenance is not None:
            self.provenance.offer(first_seen)  # only the processes whose labels may have changed
            for record in self.provenance.drain():
                batch.provenance.add(pid=record.pid, start_time=record.start_time, json=record.to_json())
        if self.health is not None:
            self.health.drain_into(batch)  # XIDs, ECC events, health counters read on their own threads
            if self.health_file is not None:
                self.health_file.see(batch)
        if self.tmpfs is not None:
            scan = self.tmpfs.take()  # a walk ended on its own thread since the last poll: most polls have none
            if scan is not None:
                tmpfs_scan_to_proto(scan, batch.tmpfs_scans.add())
        return batch, samples


class PollJoiner:
    """Joins consecutive polls into one batch, sent once it spans the send interval.

    The collector's cost is mostly per message, so at 1 Hz five polls a batch cost it about
    what one does; what is shown lags by at most the send interval. The agent's first poll,
    and any poll that carries a job event (a prolog or epilog), go out at once.

    Args:
        interval_s: the poll interval.
        send_interval_s: how often a batch goes out (0: every poll).
        build_table: build the batch's process table; False hands the samples on as a list instead
            (shard_streams.ShardedSender splits them among collectors, then builds a table each).
    """

    def __init__(self, interval_s: float, send_interval_s: float, build_table: bool = True) -> None:
        self.interval_s = interval_s
        self.send_interval_s = send_interval_s
        self.build_table = build_table
        self._batch: agent_pb2.Batch | None = None
        self._samples: list[ProcessSample] = []
        self._first_at = 0.0
        self._sent_any = False

    def add(self, batch: agent_pb2.Batch, samples: list[ProcessSample], now: float
            ) -> tuple[agent_pb2.Batch, int] | None:
        """Add a poll (from Agent.poll_parts); return (batch, samples in it) when one is due."""
        if self._batch is None:
            self._batch, self._first_at = batch, now
        else:
            self._batch.MergeFrom(batch)  # GPU readings, events, reports and records append; sent_at is the last
        self._samples.extend(samples)
        # due when the next poll would fall outside the window (with a little slack for timer jitter)
        if (not self._sent_any or batch.job_events or batch.health_events
                or now - self._first_at + self.interval_s >= self.send_interval_s - 0.05 * self.interval_s):
            return self.take()
        return None

    def take(self) -> tuple[agent_pb2.Batch, int] | None:
        """The batch of the polls held, now (None when none is held); (batch, the samples) without
        `build_table`."""
        batch, samples = self._batch, self._samples
        if batch is None:
            return None
        self._batch, self._samples, self._sent_any = None, [], True
        if not self.build_table:
            return batch, samples
        processes_to_table(samples, batch.processes)
        return batch, len(samples)


def run_loop(agent: Agent, sender, stop: threading.Event, joiner: PollJoiner | None = None, wake=None) -> None:
    """Poll every interval until `stop` is set; the joiner's batches go to the sender.

    Polls are aligned to the interval (not to the end of the previous poll) so a slow
    poll does not drift the series. Polls still held when `stop` is set stay in the
    joiner (the caller sends them with a last poll). `wake` (runtime.Wakeup), when given, is set to
    ask for a poll now (and by whatever sets `stop`): the loop sleeps on it instead.
    """
    interval = agent.config.interval_s
    if joiner is None:
        joiner = PollJoiner(interval, agent.config.send_interval_s)
    next_at = time.monotonic()
    while not stop.is_set():
        try:
            batch, samples = agent.poll_parts()
            due = joiner.add(batch, samples, time.monotonic())
            if due is not None:
                submit(agent, sender, *due)
            if agent.hello_outdated():  # e.g. NVML's pids found not to be processes here: the collector is told
                sender.send_hello()
        except Exception:  # a bug in one poll must not stop the agent; say it once per kind
            log.exception("poll failed; the agent goes on with the next poll")
        next_at += interval
        delay = next_at - time.monotonic()
        if delay < 0:
            next_at = time.monotonic()
            delay = 0
        if wake is None:
            stop.wait(delay)
        elif wake.wait(delay):
            wake.clear()


def submit(agent: Agent, sender, batch: agent_pb2.Batch, samples) -> None:
    """Hand a batch to the sender, which stamps its counters on it, with the agent's failed reads
    (`samples`: their count, or the list itself for a ShardedSender, which builds the tables), and what
    the job-output reader does where it runs."""
    reader = agent.job_output
    if reader is not None:
        counters = batch.counters
        counters.job_output_files, counters.job_output_refused = reader.following, reader.refused
        counters.job_output_errors = reader.errors
    sender.submit(batch, samples, read_errors=agent.read_errors)


AGENT_POLL_SCHEMA = "clusterwatch.agent-poll/1"


def batch_as_json(batch: agent_pb2.Batch, hello: agent_pb2.Hello) -> str:
    """One batch as a JSON document (for `agent --once --json`): the wire's messages as the --json documents
    write messages (clusterwatch.json_view: numbers as numbers, null for unset), `schema` naming it."""
    from clusterwatch.json_view import message_to_json

    doc = {"schema": AGENT_POLL_SCHEMA, "hello": message_to_json(hello), "batch": message_to_json(batch)}
    # the wire's columns, as one object a process, for people to read
    doc["batch"]["processes"] = [_sample_dict(s) for s in processes_from_table(batch.processes, hello.node)]
    return json.dumps(doc, indent=2, sort_keys=True)


def _sample_dict(s: ProcessSample) -> dict:
    """A sample as JSON, without what is unknown (None) or empty."""
    doc = {name: getattr(s, name) for name in s.__slots__ if name != "gpus"}
    doc["gpus"] = [{k: v for k, v in (("gpu_uuid", g.gpu_uuid), ("used_memory_bytes", g.used_memory_bytes),
                                      ("sm_utilization", g.sm_utilization)) if v is not None} for g in s.gpus]
    return {k: v for k, v in doc.items() if v is not None and v != "" and v != []}


def write_pid_file(spool_dir: str) -> str | None:
    """Record this agent's pid where the prolog looks for it; None if the folder is not writable."""
    from .ensure import PID_FILE, SpoolNotPrivate, private_folder, write_pid

    path = os.path.join(spool_dir, PID_FILE)
    try:
        private_folder(spool_dir)
        write_pid(path, os.getpid())
        return path
    except (OSError, SpoolNotPrivate):
        return None


__all__ = ["Agent", "JobEvent", "PollJoiner", "batch_as_json", "run_loop", "submit", "write_pid_file"]
