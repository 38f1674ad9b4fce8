"""The collector's in-memory picture of the cluster: nodes, processes, GPUs, jobs, with bounded history.

Everything here is plain data updated by ingest and read by the exporter and the
query service; no I/O. A process is keyed by (node, pid, start time); a GPU by its
UUID; a job by its id. History per series is a bounded ring of columns (collector/state/point_ring.py: 56 bytes
a process point, not a tuple of objects), so memory stays flat however long a job runs.
"""
from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import accumulate, repeat
from operator import add, mul
from typing import NamedTuple

from clusterwatch.model import (
    GpuActivity,
    GpuInfo,
    GpuReading,
    GpuUse,
    JobEvent,
    ProcessKey,
    ProcessSample,
    TrainingReport,
)
from clusterwatch.wire import ProcessColumns, gpu_activity_from_proto, gpu_reading_from_proto

from .activity import current_activity
from .job_cost import CostMeter, GpuCost
from .job_table import JobTable
from .point_ring import ColumnRing, GpuRing, PowerRing, ProcessRing
from .work_counts import work_counts

# Job states in Slurm's words; ended ones leave /metrics.
ENDED_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
     "DEADLINE", "ENDED"}
)


# Bounds of a job's run tags (clusterwatch.train.tags): tags name a run (experiment, dataset, seed), a
# handful per job; these leave plenty of room for that and none for a process that sends new keys in a loop.
MAX_TAG_KEYS = 32
MAX_TAG_KEY_BYTES = 64  # UTF-8
MAX_TAG_VALUE_BYTES = 256
# Each tag value is a label value of clusterwatch_job_info, and each new one a new Prometheus series: a key
# may change this often in a job (a phase, a resumed-from); past that it shows TAG_CHANGING for the rest of
# the job, so a value that changes at every report (a timestamp, ranks that disagree) makes a few series.
MAX_TAG_CHANGES = 4
TAG_CHANGING = "(changes too often)"


def _over(text: str, limit: int) -> bool:
    """Whether text takes more than `limit` bytes in UTF-8 (encoded only when its length leaves a doubt;
    "replace": a lone surrogate is counted, never raised)."""
    n = len(text)
    return n > limit or (n * 4 > limit and len(text.encode("utf-8", "replace")) > limit)


# A rank's step counts as stalled once it has not moved for three of its usual gaps between new steps (and
# never sooner than three polls of its node, whose samples tell that time passes); until two new steps have
# shown that gap, a minute: a rank that reports every 100 steps must not read stalled between reports.
STALE_STEP_GAPS = 3.0
DEFAULT_STEP_STALE_S = 60.0


_NAN = float("nan")
_INT64_MAX = (1 << 63) - 1  # the largest GPU memory a history ring holds (point_ring.py)

# The longest gap between two samples that accumulators count whole (a poll's CPU percent is its average
# since the poll before); past it, an agent was away and only this much counts.
MAX_GAP_S = 60.0


@dataclass(slots=True)
class GpuUseTotals:
    """One GPU's figures while a job's processes used it, from the first such reading to the last."""

    busy_seconds: float = 0.0      # utilisation over time: seconds at 100 %
    covered_seconds: float = 0.0   # the time those readings cover
    memory_peak: int = 0
    last_time: float = 0.0
    last: object = None  # the last reading (a wire GpuSample) while the job's processes were on it


class Point(NamedTuple):
    """One process sample as kept in history (only what trends need): a row of its ring, built when read."""

    t: float
    cpu_percent: float | None
    rss_bytes: int | None
    gpu_memory_bytes: int | None
    gpu_utilization: float | None
    threads: int | None
    open_fds: int | None


def process_history(maxlen: int) -> ProcessRing:
    """A process's history: its points, read back as Point."""
    return ProcessRing(maxlen, Point._make)


def gpu_history(maxlen: int) -> GpuRing:
    """A GPU's readings as (t, utilisation, memory used)."""
    return GpuRing(maxlen)


def power_history(maxlen: int) -> PowerRing:
    """A GPU's power draw as (t, watts)."""
    return PowerRing(maxlen)


@dataclass(slots=True)
class ProcessSeries:
    """A process: its latest sample, its history and peaks, its training progress."""

    key: ProcessKey
    latest: ProcessSample
    history: ColumnRing  # of Point (process_history)
    rss_peak: int = 0
    gpu_memory_peak: int = 0
    samples: int = 0
    alive: bool = True
    step: int | None = None
    step_time: float = 0.0
    steps_per_s: float | None = None
    loss: float | None = None
    lr: float | None = None
    epoch: float | None = None
    step_history: deque = field(default_factory=lambda: deque(maxlen=32))
    # the work it counts beside its steps (tokens, samples trained on), as last reported (work_counts.py):
    # job_slowdown judges it where given. Not `samples`, which counts the samples (polls) this series holds.
    tokens_counted: float | None = None
    samples_counted: float | None = None
    # How long without a new step reads as stalled (from how often its step moves), and since when it has
    # been: a rank that stops reporting would otherwise keep the rate of its last reports for good.
    step_stale_s: float = DEFAULT_STEP_STALE_S
    stalled_since: float | None = None
    # The framework's allocator, as the process last reported it (clusterwatch.train): one AllocatorFigures per
    # device it uses, and when (the process's clock, as its samples'); () until a report carries them.
    allocator: tuple = ()
    allocator_time: float = 0.0
    # (t, allocated, reserved, retries) as allocator_totals gave them at each report, at most one a history
    # step (a deque bounded as history, () until a report carries them): what `record` writes on each history
    # point, as the live rules saw it then
    allocator_history: deque | tuple = ()
    # (t, step, loss, lr, tokens, samples) at most one a history step, bounded as history (() until a report carries
    # a step): the job page charts progress over the same span as memory (step_history holds only the last few
    # reports), and `record` writes each line's work counts from it
    progress_history: deque | tuple = ()
    # Whole-life accumulators, every sample from the first (the history holds only the last hour or so):
    # CPU time from each poll's CPU percent over the time since the poll before (gaps over MAX_GAP_S count
    # MAX_GAP_S: an agent away must not credit the process with an hour at its last rate).
    first_time: float = 0.0
    cpu_seconds: float = 0.0
    labels: tuple = ()  # the labels as last sent (a wire.ProcessLabels), to tell a change cheaply
    rules_t: float = float("-inf")  # when the rules last looked at it (collector/alerting/live.py)
    # when a batch last carried it, by the collector's clock: liveness never trusts a node's clock
    seen: float = 0.0
    # its latest sample's held state (D, T, t; "" while it runs or sleeps) and since when, as of the first
    # batch that showed it there (a stall's cause: collector/alerting/stall_causes.py)
    state: str = ""
    state_since: float = 0.0


@dataclass(slots=True)
class GpuSeries:
    """A GPU: its inventory entry, latest reading and utilisation history."""

    node: str
    info: GpuInfo
    latest: GpuReading | None = None
    memory_peak: int = 0
    history: ColumnRing = field(default_factory=lambda: gpu_history(720))  # (t, util, mem)
    last_time: float = 0.0
    # (t, watts) beside history, not in its points: history's (t, util, mem) is unpacked as three elsewhere
    power_history: ColumnRing = field(default_factory=lambda: power_history(720))
    # the latest GPM reading, which comes every few polls, and the time of the sample that carried it: read
    # through collector/state/activity.py, which says whether it still stands
    activity: GpuActivity | None = None
    activity_time: float = 0.0


@dataclass(slots=True)
class NodeState:
    """A node as its agent last described it."""

    node: str
    boot_id: str = ""
    agent_version: str = ""
    interval_s: float = 5.0
    send_interval_s: float = 5.0  # a batch is due at least this often (never less than interval_s)
    gpu_source: str = ""
    memory_total_bytes: int = 0
    last_seen: float = 0.0
    connected: bool = False
    gpus: list[str] = field(default_factory=list)
    samples_sent: int = 0
    samples_dropped: int = 0
    read_errors: int = 0
    # Its job-output reader's (files followed, refused, errors), None where the agent does not read jobs' output
    job_output: tuple[int, int, int] | None = None
    # Its latest stream proved who sent it (token, mutual TLS or root's munge credential): only then is
    # the user its samples name a job's owner, and only then does an action reach its processes.
    authenticated: bool = False
    # What each user's files hold on its tmpfs mounts (/dev/shm, ...), at its agent's latest walk (tmpfs_at,
    # 0: none yet; truncated: the walk hit its bound, the bytes are a floor): collector/state/tmpfs.py
    tmpfs_by_user: dict[str, int] = field(default_factory=dict)
    tmpfs_at: float = 0.0
    tmpfs_truncated: bool = False


@dataclass(slots=True)
class JobState:
    """A job: what Slurm (or the hooks, or the agents) say of it, and its processes."""

    job_id: str
    name: str = ""
    user: str = ""
    account: str = ""
    partition: str = ""
    state: str = "RUNNING"
    submit_time: float = 0.0
    start_time: float = 0.0
    end_time: float = 0.0
    time_limit_s: float = 0.0
    nodes: list[str] = field(default_factory=list)
    cpus: int = 0
    memory_bytes: int = 0
    gpus: int = 0
    gpus_by_node: dict[str, list[str]] = field(default_factory=dict)
    source: str = "agent"
    ranks_expected: int = 0
    note: str = ""
    exit_code: int | None = None
    processes: set[ProcessKey] = field(default_factory=set)
    tags: dict[str, str] = field(default_factory=dict)
    # Authenticated agents named different users for its processes: it has no owner (admins only).
    owner_disputed: bool = False
    tag_changes: dict[str, int] = field(default_factory=dict)  # tag key → how often its value changed
    nodes_ended: set[str] = field(default_factory=set)
    # (node, pid, start time) → the process's provenance record (a dict, see agent/provenance/record.py)
    provenance: dict[ProcessKey, dict] = field(default_factory=dict)
    # node → {pid: global rank or None}: processes `scontrol listpids` named on a node whose agent is
    # not reporting (collector/jobmap/registry.py); shown as "mapped by listpids", without figures
    listed_pids: dict[str, dict[int, int | None]] = field(default_factory=dict)
    qos: str = ""      # Slurm's QOS, where it says
    cluster: str = ""  # Slurm's cluster name, where it says
    # GPU UUID → its figures while this job's processes used it (ClusterState.add_gpus)
    gpu_totals: dict[str, GpuUseTotals] = field(default_factory=dict)
    # GPU UUID → what holding it cost the job: energy, throttle time, time at each activity level (job_cost.py)
    gpu_cost: dict[str, GpuCost] = field(default_factory=dict)

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES


class ClusterState:
    """Nodes, processes, GPUs and jobs as the agents report them.

    Args:
        history_points: points kept per process and GPU series.
        history_step_s: at most one history point per process this often (720 × 5 s = 1 hour).
    """

    def __init__(self, history_points: int = 720, history_step_s: float = 5.0, owners_from_slurm: bool = False) -> None:
        self.history_points = history_points
        self.history_step_s = history_step_s
        self.nodes: dict[str, NodeState] = {}
        self.processes: dict[ProcessKey, ProcessSeries] = {}
        self.gpus: dict[str, GpuSeries] = {}
        self.jobs = JobTable()  # its writes index each node's GPU allocations (jobs.allocated_on)
        self._node_live: dict[str, set[ProcessKey]] = {}
        # samples stored before a restart, per process: a series that comes back counts on from there
        self.restored_samples: dict[ProcessKey, int] = {}
        # (CPU seconds, first sample's time) stored before a restart, per process (ProcessSeries' totals)
        self.restored_totals: dict[ProcessKey, tuple[float, float]] = {}
        # node → pid → the process's latest series (the one with that pid's newest start time)
        self.pids: dict[str, dict[int, ProcessSeries]] = {}
        # Set when the registry asks Slurm: a Slurm job's owner is then Slurm's word alone, never a sample's
        # (any client that reaches the port can send samples naming a job); until Slurm has answered for a
        # job it has no owner, and only admins see it.
        self.owners_from_slurm = owners_from_slurm
        # node → GPU UUID → the job whose live processes used it at the node's latest poll: add_gpus credits
        # that job with the GPU's readings (not a job whose processes have left it)
        self._gpu_users: dict[str, dict[str, str]] = {}
        # node → GPU UUID → the jobs whose live processes used it at the node's latest poll, where more than one
        self._gpu_shared: dict[str, dict[str, set[str]]] = {}
        self.costs = CostMeter()  # each GPU's last energy and violation counters (job_cost.py)
        self.training_unmatched = 0  # training reports whose (node, pid, start time) names no known process
        self.tags_dropped = 0  # tags over the bounds (MAX_TAG_KEYS, MAX_TAG_KEY_BYTES, MAX_TAG_VALUE_BYTES)
        self.tag_changes_dropped = 0  # tag values not shown: their key had changed MAX_TAG_CHANGES times

    # -- agents -----------------------------------------------------------------------------

    def hello(self, node: str, boot_id: str, version: str, interval_s: float, gpu_source: str,
              memory_total: int, gpus: list[GpuInfo], now: float, send_interval_s: float = 0.0) -> NodeState:
        """An agent (re)connected: record its node and GPU inventory."""
        ns = self.nodes.get(node) or NodeState(node)
        ns.boot_id, ns.agent_version, ns.interval_s = boot_id, version, interval_s or 5.0
        ns.send_interval_s = max(ns.interval_s, send_interval_s)
        ns.gpu_source, ns.memory_total_bytes = gpu_source, memory_total
        ns.connected, ns.last_seen = True, max(ns.last_seen, now)
        ns.gpus = [g.uuid for g in gpus]
        self.nodes[node] = ns
        for g in gpus:
            gs = self.gpus.get(g.uuid)
            if gs is None:
                self.gpus[g.uuid] = GpuSeries(node, g, history=gpu_history(self.history_points),
                                              power_history=power_history(self.history_points))
            else:
                gs.node, gs.info = node, g
        return ns

    def disconnected(self, node: str) -> None:
        ns = self.nodes.get(node)
        if ns is not None:
            ns.connected = False

    # -- samples ----------------------------------------------------------------------------

    def add_processes(self, node: str, cols: ProcessColumns, batch_time: float,
                      unlabel: frozenset[str] = frozenset()) -> list[ProcessSeries]:
        """Record the polls of a node in a batch (a decoded ProcessTable); processes missing from the
        last of them are marked not alive.

        Every row counts: each process's sample count, its peaks and its history (a point
        every history_step_s) see every poll; its latest reading is that of its last row.
        Samples of jobs in `unlabel` (closed already) lose their job labels. Returns the
        series that got a new sample (for the rules), each once.
        """
        ns = self.nodes.get(node)
        if ns is not None:
            ns.last_seen = max(ns.last_seen, batch_time)
        pids_of = self.pids.get(node)
        if pids_of is None:
            pids_of = self.pids[node] = {}
        live: set[ProcessKey] = set()  # in the batch's last poll
        early: dict[ProcessKey, ProcessSeries] = {}  # in an earlier poll of it
        touched: list[ProcessSeries] = []
        last_poll = max(cols.time, default=0.0)  # the rows of one poll share its time
        gstart = list(accumulate(cols.gpu_count, initial=0))  # row i's GPU-use entries start at gstart[i]
        width = cols.poll_width()
        if width:
            rows = self._add_polls(node, pids_of, cols, width, gstart, unlabel, live, touched)
        else:
            rows = range(cols.rows)
        for i in rows:  # rows the per-poll path left (and every row of a batch not shaped for it)
            series = self._add_row(node, pids_of, cols, i, gstart[i], unlabel)
            if series is None:
                continue
            if cols.time[i] == last_poll:
                live.add(series.key)
                touched.append(series)
            else:
                early[series.key] = series
        users: dict[str, str] = {}
        multi: dict[str, set[str]] = {}  # GPUs of more than one job's processes (rare: a shared GPU)
        for series in touched:
            series.seen = batch_time
            if series.step is not None:  # time passes for its step rate too (a stalled rank sends no reports)
                step_stalled(series, series.latest.time)
            s = series.latest
            if s.state != series.state:
                series.state, series.state_since = s.state, s.time
            if s.gpus and s.job_id and series.key in live:
                for g in s.gpus:
                    u = g.gpu_uuid
                    prev = users.get(u)
                    if prev is not None and prev != s.job_id:
                        multi.setdefault(u, {prev}).add(s.job_id)
                    users[u] = s.job_id
        self._gpu_users[node] = users
        self._gpu_shared[node] = multi
        for series in early.values():
            series.seen = batch_time
        gone = early.keys() | self._node_live.get(node, set())
        if gone:
            processes = self.processes
            for key in gone - live:
                series = processes.get(key)
                if series is not None:
                    series.alive = False
        self._node_live[node] = live
        # the rules see each process once a batch: as of its last row (it is updated in place)
        touched.extend(series for key, series in early.items() if key not in live)
        return touched

    def _add_polls(self, node: str, pids_of: dict[int, ProcessSeries], cols: ProcessColumns, width: int,
                   gstart: list[int], unlabel: frozenset[str], live: set[ProcessKey],
                   touched: list[ProcessSeries]) -> list[int]:
        """The common shape, fast: every poll of the batch lists the same processes, in the same order.

        Process j's rows are j, j + width, j + 2·width…. The last poll's readings and each
        process's peaks over the polls are taken a column at a time; then each process is
        updated in one step rather than one per row. Returns the rows left for the row path
        (a new or changed process, or one whose batch is older than what is held).
        """
        polls = _Polls(cols, width, gstart)
        pids, starts, labels, label_sets = cols.pid, cols.start_time, cols.labels, cols.label_sets
        first_time, t_last, n_polls, rows = polls.times[0], polls.t_last, len(polls.times), cols.rows
        step = self.history_step_s
        left: list[int] = []
        for j in range(width):
            series = pids_of.get(pids[j])
            if series is None or series.key.start_time != starts[j] or first_time < series.latest.time:
                left.extend(range(j, rows, width))
                continue
            series.cpu_seconds += polls.cpu_seconds(j, series.latest.time)
            lab = label_sets[labels[j]]
            relabelled = lab != series.labels
            if relabelled:  # converted whole from its last row
                r = polls.last + j
                s = series.latest = self._convert(node, cols.sample(r, node, gstart[r]), unlabel)
                series.labels = lab
                self._join_job(series.key, s)
            polls.take(series, j, relabelled)
            series.samples += n_polls
            series.alive = True
            hist = series.history
            if hist.last_t + step <= t_last:  # usually a point a batch, at its last poll (last_t -inf: none yet)
                polls.extend_history(series, j, step)
            live.add(series.key)
            touched.append(series)
        return sorted(left)

    def _add_row(self, node: str, pids_of: dict[int, ProcessSeries], cols: ProcessColumns, i: int, g: int,
                 unlabel: frozenset[str]) -> ProcessSeries | None:
        """One row: a new process, a relabelled one, or a fresh reading; None for a row older than what is held."""
        pid, start, t = cols.pid[i], cols.start_time[i], cols.time[i]
        series = pids_of.get(pid)
        if series is not None and series.key.start_time != start:  # a reused pid, or an older batch
            series = self.processes.get(ProcessKey(node, pid, start))
        lab = cols.label_sets[cols.labels[i]]
        if series is None:
            series = self._new_series(node, cols.sample(i, node, g), lab, unlabel)
            if pid not in pids_of or pids_of[pid].key.start_time < start:
                pids_of[pid] = series
        elif t < series.latest.time:
            # Older than what is held: a node whose clock stepped back (or an old batch resent after a newer
            # one). The process is there, so it stays alive; its readings wait until its times pass the held
            # one, so that history stays in time order.
            series.alive = True
            return series
        else:
            prev = series.latest.time
            series.latest = self._convert(node, cols.sample(i, node, g), unlabel)
            if lab != series.labels:
                series.labels = lab
                self._join_job(series.key, series.latest)
            cpu = series.latest.cpu_percent
            if cpu is not None and t > prev:  # its percent is its average since the poll before
                series.cpu_seconds += cpu / 100.0 * min(t - prev, MAX_GAP_S)
        s = series.latest
        series.alive = True
        series.samples += 1
        hist = series.history
        if t >= hist.last_t + self.history_step_s:  # the per-poll path's comparison, exactly (-inf: none yet)
            hist.append((t, s.cpu_percent, s.rss_bytes, s.gpu_memory_bytes, s.gpu_utilization, s.threads,
                         s.open_fds))
        v = s.rss_bytes
        if v is not None and v > series.rss_peak:
            series.rss_peak = v
        v = s.gpu_memory_bytes
        if v is not None and v > series.gpu_memory_peak:
            series.gpu_memory_peak = v
        return series

    def _new_series(self, node: str, sample: ProcessSample, labels: tuple, unlabel: frozenset[str]
                    ) -> ProcessSeries:
        s = self._convert(node, sample, unlabel)
        key = ProcessKey(node, s.pid, s.start_time)
        series = ProcessSeries(key, s, process_history(self.history_points), labels=labels, first_time=s.time)
        series.samples = self.restored_samples.pop(key, 0)
        totals = self.restored_totals.pop(key, None)
        if totals is not None:  # stored before a restart: its CPU time counts on, from its first sample
            series.cpu_seconds, series.first_time = totals[0], totals[1] or series.first_time
        self.processes[key] = series
        self._join_job(key, s)
        return series

    @staticmethod
    def _convert(node: str, s: ProcessSample, unlabel: frozenset[str]) -> ProcessSample:
        s.node = node  # the stream's node is authoritative: one agent cannot write for another
        if s.job_id in unlabel:
            s.job_id, s.rank, s.local_rank, s.mapped_by = "", None, None, ""
        return s

    def _join_job(self, key: ProcessKey, s: ProcessSample) -> None:
        """Put a process into its job (creating the job when an agent is the first to name it)."""
        if not s.job_id:
            return
        job = self.jobs.get(s.job_id)
        if job is None:  # no owner yet: naming a job first gains nothing (_own)
            job = self.jobs[s.job_id] = JobState(s.job_id, start_time=s.start_time)
            job.source = "local" if s.job_id.startswith("local-") else "agent"
        if key not in job.processes:
            job.processes.add(key)
            if key.node not in job.nodes:
                job.nodes.append(key.node)
        self._own(job, key.node, s.user)

    def _own(self, job: JobState, node: str, user: str) -> None:
        """A job Slurm cannot know is owned by the user the kernel gives its processes, as an authenticated
        agent reads it; two such agents (or processes) naming different users leave it without an owner.

        A sample of an unauthenticated stream is a claim, not a reading: it owns nothing. With --slurm a
        Slurm job id's owner is Slurm's word alone (collector/jobmap/registry.py), nobody's until Slurm answers.
        """
        node_state = self.nodes.get(node)
        if (not user or node_state is None or not node_state.authenticated or job.source == "slurm"
                or (self.owners_from_slurm and job.job_id.isdigit()) or job.owner_disputed):
            return
        if not job.user:
            job.user = user
        elif job.user != user:
            job.user, job.owner_disputed = "", True

    def add_gpus(self, node: str, msgs) -> None:
        """Record a batch's GPU readings (wire GpuSamples, a poll's worth or several, in time order).

        Each reading goes into its GPU's history and peak; only the last one of each GPU is
        converted whole, as its latest reading.
        """
        gpus = self.gpus
        users = self._gpu_users.get(node) or {}
        holders, shared = self.node_gpu_holders(node) if msgs else ({}, set())
        costs = self.costs
        last: dict[str, object] = {}
        # GPU UUID → what its readings in the batch share (a batch carries each GPU a poll): worked out at the first
        of_batch: dict[str, tuple[GpuSeries, JobState | None, JobState | None, bool]] = {}
        for m in msgs:
            uuid, t = m.uuid, m.time
            found = of_batch.get(uuid)
            if found is None:
                found = of_batch[uuid] = self._gpu_of_batch(node, m, users, holders, shared)
            gs, user, holder, is_shared = found
            if t < gs.last_time:
                continue
            mem = m.memory_used_bytes if m.HasField("memory_used_bytes") else None
            util = m.utilization if m.HasField("utilization") else None
            gs.last_time = t
            gs.history.append((t, util, mem))
            if m.HasField("activity"):
                gs.activity, gs.activity_time = gpu_activity_from_proto(m.activity), t
            if m.HasField("power_watts"):
                gs.power_history.append((t, m.power_watts))
            if mem is not None and mem > gs.memory_peak:
                gs.memory_peak = mem
            if user is not None:
                self._credit(user, uuid, m, t, util, mem)
            activity = current_activity(gs)
            costs.reading(holder, uuid, t, m.energy_mj if m.HasField("energy_mj") else None,
                          activity.sm_active if activity is not None else None, util, is_shared)
            last[uuid] = m
        for uuid, m in last.items():
            gpus[uuid].latest = gpu_reading_from_proto(m)

    def _gpu_of_batch(self, node: str, m, users: dict[str, str], holders: dict[str, str], shared: set[str]
                      ) -> tuple[GpuSeries, JobState | None, JobState | None, bool]:
        """What a GPU's readings in a node's batch share (`m`, its first): (its series, made here for a GPU not
        in the node's inventory; the running job whose processes use it, whose totals its readings go to; the
        job that holds it, whose costs they go to; whether another job's process uses it too)."""
        uuid = m.uuid
        gs = self.gpus.get(uuid)
        if gs is None:
            r = gpu_reading_from_proto(m)
            info = GpuInfo(uuid, len(self.nodes.get(node, NodeState(node)).gpus), "", r.memory_total_bytes or 0)
            gs = self.gpus[uuid] = GpuSeries(node, info, history=gpu_history(self.history_points),
                                             power_history=power_history(self.history_points))
        jobs = self.jobs
        job_id = users.get(uuid)
        user = jobs.get(job_id) if job_id is not None else None
        holder = holders.get(uuid)
        return (gs, user if user is not None and not user.ended else None,
                jobs.get(holder) if holder is not None else None, uuid in shared)

    def add_gpu_health(self, node: str, msgs) -> None:
        """A batch's GPU health readings (wire GpuHealths, each of a whole GPU): their violation counters into
        the costs of the jobs holding the GPU, or under MIG holding one of its instances (job_cost.py)."""
        holders, _ = self.node_gpu_holders(node)
        jobs = self.jobs
        ns = self.nodes.get(node)
        for m in msgs:
            if not m.violation_seconds:
                continue
            held = [(jobs[holders[m.uuid]], m.uuid)] if m.uuid in holders else []
            for u in ns.gpus if ns is not None else ():
                gs = self.gpus.get(u)
                if u in holders and gs is not None and gs.info.parent_uuid == m.uuid:
                    held.append((jobs[holders[u]], u))
            self.costs.violations(held, m.uuid, dict(m.violation_seconds))

    @staticmethod
    def _credit(job: JobState, uuid: str, m, t: float, util: float | None, mem: int | None) -> None:
        """A reading of a GPU that the job's processes use: into the job's totals for it (utilisation over
        time, the time covered, its memory peak, its last reading while in use)."""
        tot = job.gpu_totals.get(uuid)
        if tot is None:
            tot = job.gpu_totals[uuid] = GpuUseTotals()
        elif t <= tot.last_time:
            return
        if tot.last_time and util is not None:
            dt = min(t - tot.last_time, MAX_GAP_S)
            tot.busy_seconds += util / 100.0 * dt
            tot.covered_seconds += dt
        if mem is not None and mem > tot.memory_peak:
            tot.memory_peak = mem
        tot.last_time = t
        tot.last = m  # converted only when a view asks

    def add_training(self, node: str, report: TrainingReport) -> ProcessSeries | None:
        """Attach a training report to its process, found by (node, pid, start time); the step rate comes from
        step deltas.

        A report whose process is unknown is dropped and counted (training_unmatched): after pid
        reuse the pid alone would give one user's steps, loss and tags to another user's process.
        """
        series = self.processes.get(ProcessKey(node, report.pid, report.start_time))
        if series is None:
            self.training_unmatched += 1
            return None
        if report.step is not None:
            series.step_history.append((report.time, report.step))
            series.steps_per_s = step_rate(series.step_history)
            if series.step != report.step:
                series.step_time = report.time
                ns = self.nodes.get(node)
                series.step_stale_s = stale_after(series.step_history, ns.interval_s if ns is not None else 5.0)
            series.step = report.step
            step_stalled(series, max(report.time, series.latest.time))
        if report.gpu_memory:
            series.allocator = tuple(report.gpu_memory)
            series.allocator_time = report.time
            ah = series.allocator_history
            if not ah or report.time >= ah[-1][0] + self.history_step_s:
                if not ah:
                    ah = series.allocator_history = deque(maxlen=self.history_points)
                ah.append((report.time, *allocator_totals(series, report.time)))
        if report.metrics:
            series.tokens_counted, series.samples_counted = work_counts(report.metrics, series.tokens_counted,
                                                                        series.samples_counted)
        if report.loss is not None:
            series.loss = report.loss
        if report.lr is not None:
            series.lr = report.lr
        if report.step is not None:
            ph = series.progress_history
            if not ph or report.time >= ph[-1][0] + self.history_step_s:
                if not ph:
                    ph = series.progress_history = deque(maxlen=self.history_points)
                # the work counts as held then (a report's or one before it): `record` writes them on each line
                ph.append((report.time, report.step, report.loss, report.lr, series.tokens_counted,
                           series.samples_counted))
        if report.epoch is not None:
            series.epoch = report.epoch
        if report.tags and series.latest.job_id:
            job = self.jobs.get(series.latest.job_id)
            if job is not None:
                self._merge_tags(job, report.tags)
        return series

    def _merge_tags(self, job: JobState, tags: dict[str, str]) -> None:
        """A report's tags into its job's, within bounds: one process sending new keys in a loop must not grow
        the collector without end, nor the job's `status` reply past the CLI's limit. A known key takes its new
        value MAX_TAG_CHANGES times, then holds TAG_CHANGING (a key holding it stays so, after a restart too);
        what is over is dropped, counted."""
        held = job.tags
        for key, value in tags.items():
            if (_over(key, MAX_TAG_KEY_BYTES) or _over(value, MAX_TAG_VALUE_BYTES)
                    or (key not in held and len(held) >= MAX_TAG_KEYS)):
                self.tags_dropped += 1
                continue
            old = held.get(key)
            if old is None or old == value:
                held[key] = value
                continue
            if old != TAG_CHANGING:
                changes = job.tag_changes[key] = job.tag_changes.get(key, 0) + 1
                if changes <= MAX_TAG_CHANGES:
                    held[key] = value
                    continue
                held[key] = TAG_CHANGING
            self.tag_changes_dropped += 1

    def job_event(self, node: str, event: JobEvent) -> JobState:
        """A prolog (start) or epilog (end) on a node."""
        job = self.jobs.get(event.job_id)
        if job is None:
            source = "local" if event.job_id.startswith("local-") else "prolog"
            job = self.jobs[event.job_id] = JobState(event.job_id, source=source)
        # The event's user is never the job's owner: any client that reaches the port can send an event.
        # The owner is Slurm's word (collector/jobmap/registry.py) or, for a job Slurm does not know, the user the
        # node's agent sees running its processes (_join_job).
        if event.kind == "start":
            if node not in job.nodes:
                job.nodes.append(node)
            if not job.start_time:
                job.start_time = event.time
            if event.gpu_uuids:
                self.set_job_gpus(job, node, event.gpu_uuids)
                job.gpus = sum(len(v) for v in job.gpus_by_node.values())
        else:
            job.nodes_ended.add(node)
            if event.exit_code is not None:
                job.exit_code = event.exit_code
            # Without Slurm's word the job has ended once every node it ran on said so.
            if set(job.nodes) <= job.nodes_ended:
                job.state = "COMPLETED" if not job.exit_code else "FAILED"
                job.end_time = event.time
        return job

    def set_job_gpus(self, job: JobState, node: str, uuids: Iterable[str]) -> None:
        """The GPUs allocated to a job (held in `jobs`) on a node, by UUID: the one way its gpus_by_node
        changes, so that the index node_gpu_holders reads cannot drift from it (job_table.py)."""
        self.jobs.allocate(job, node, uuids)

    def add_job(self, job: JobState) -> None:
        """Hold a job made whole elsewhere (the store's, after a restart); JobTable indexes its allocations."""
        self.jobs[job.job_id] = job

    def add_provenance(self, node: str, pid: int, start_time: float, record: dict) -> JobState | None:
        """Attach a provenance record to its process's job; None when the process is unknown."""
        series = self.processes.get(ProcessKey(node, pid, start_time))
        if series is None or not series.latest.job_id:
            return None
        job = self.jobs.get(series.latest.job_id)
        if job is not None:
            job.provenance[series.key] = record
        return job

    # -- reading ----------------------------------------------------------------------------

    def job_processes(self, job: JobState) -> list[ProcessSeries]:
        return [self.processes[k] for k in job.processes if k in self.processes]

    # Which job holds a GPU: asked here by every reader (the exporter, alerting, the trace, stall causes, health,
    # the views, the job page). Worked out when read: a process's GPUs change with every batch, while the readers
    # ask once a scrape, a tick or a query (bench figures in the commit that made these). Only the allocations are
    # indexed by node (jobs.allocated_on), for node_gpu_holders, which runs at every batch.

    def gpu_allocations(self) -> dict[str, str]:
        """GPU UUID → the running job it is allocated to (Slurm's allocation, or the prolog's)."""
        return {u: j.job_id for j in self.jobs.values() if not j.ended for uuids in j.gpus_by_node.values()
                for u in uuids}

    def gpu_holders(self) -> dict[str, str]:
        """GPU UUID → the running job that holds it: the one it is allocated to, else the first running job
        (in the order jobs became known) whose live process uses it, as of that process's latest sample."""
        # One pass over the processes, each taken to the job its latest sample names (the job that holds it in
        # its processes: _join_job), not one over each job's keys: a scrape asks this of every GPU, and hashing
        # every process's key again cost 40 ms a scrape on bench_metrics' 64,000 processes (10 ms this way).
        running = [job.job_id for job in self.jobs.values() if not job.ended]
        order = {job_id: i for i, job_id in enumerate(running)}
        first: dict[str, int] = {}  # GPU UUID → the place in `order` of the first running job whose process uses it
        for series in self.processes.values():
            s = series.latest
            if s.gpus and series.alive:
                i = order.get(s.job_id)
                if i is not None:
                    for g in s.gpus:
                        u = g.gpu_uuid
                        if first.get(u, i) >= i:
                            first[u] = i
        holders = {u: running[i] for u, i in first.items()}
        holders.update(self.gpu_allocations())
        return holders

    def node_gpu_holders(self, node: str) -> tuple[dict[str, str], set[str]]:
        """gpu_holders for one node's GPUs, cheap enough for every batch (the job costs take it at each GPU
        reading): (GPU UUID → the running job that holds it, the GPUs that another running job's process
        uses too). The same rule: the job it is allocated to, else the first running job (in the order jobs
        became known) whose live process uses it, as of the node's latest poll."""
        jobs = self.jobs
        holders, shared = self._node_gpu_users(node)
        clashes: dict[str, set[str]] = {}  # GPUs allocated to more than one running job (one's record is stale)
        for job_id in self.jobs.allocated_on.get(node, ()):
            job = jobs.get(job_id)
            if job is None or job.ended:
                continue
            for u in job.gpus_by_node.get(node, ()):
                user = holders.get(u)
                if user is not None and user != job_id:
                    shared.add(u)  # allocated to this job, used by another's process (or allocated to it too)
                    if u in jobs[user].gpus_by_node.get(node, ()):
                        clashes.setdefault(u, {user}).add(job_id)
                holders[u] = job_id
        for u, ids in clashes.items():  # the last known of them, as gpu_allocations takes it
            holders[u] = [j for j in jobs if j in ids][-1]
        return holders, shared

    def _node_gpu_users(self, node: str) -> tuple[dict[str, str], set[str]]:
        """node_gpu_holders before allocations: (GPU UUID → the first running job whose live process uses it at
        the node's latest poll, the GPUs more than one running job's processes use)."""
        jobs = self.jobs
        holders: dict[str, str] = {}
        shared: set[str] = set()
        multi = self._gpu_shared.get(node) or {}
        for u, job_id in (self._gpu_users.get(node) or {}).items():
            candidates = multi.get(u)
            if candidates:  # the first known of them: the order gpu_holders takes
                running = [j for j in jobs if j in candidates and not jobs[j].ended]
                if len(running) > 1:
                    shared.add(u)
                if running:
                    holders[u] = running[0]
            elif (job := jobs.get(job_id)) is not None and not job.ended:
                holders[u] = job_id
        return holders, shared

    def job_gpus(self, job: JobState, alive_only: bool = False) -> list[JobGpu]:
        """The job's GPUs, each once: those allocated to it, in its allocation's order, then those its processes
        use as of their latest samples (only its live processes' with `alive_only`), by rank, node and pid.

        A MIG instance is itself, not its whole GPU: the health readers add those (collector/health/mig.py).
        """
        out: list[JobGpu] = []
        seen: set[str] = set()
        for node, uuids in job.gpus_by_node.items():
            for u in uuids:
                if u not in seen:
                    seen.add(u)
                    out.append(JobGpu(node, u, True))
        procs = sorted((p for p in self.job_processes(job) if p.alive or not alive_only), key=_by_rank)
        for series in procs:
            for g in series.latest.gpus:
                if g.gpu_uuid not in seen:
                    seen.add(g.gpu_uuid)
                    out.append(JobGpu(series.key.node, g.gpu_uuid, False))
        return out

    def node_up(self, node: NodeState, now: float, after_intervals: float) -> bool:
        return node.last_seen > 0 and now - node.last_seen <= after_intervals * node.send_interval_s + 1.0

    def forget_job(self, job_id: str) -> None:
        """Drop an ended job's processes from memory (its summary is in the store)."""
        job = self.jobs.pop(job_id, None)  # and out of the allocation index
        if job is None:
            return
        for key in job.processes:
            self.processes.pop(key, None)
            self._forget_pid(key)

    def prune(self, now: float, keep_dead_s: float = 600.0) -> None:
        """Forget processes that are gone and belong to no job, after a while."""
        for key, series in list(self.processes.items()):
            if not series.alive and not series.latest.job_id and now - series.seen > keep_dead_s:
                del self.processes[key]
                self._forget_pid(key)

    def _forget_pid(self, key: ProcessKey) -> None:
        pids = self.pids.get(key.node)
        if pids is not None and (series := pids.get(key.pid)) is not None and series.key == key:
            del pids[key.pid]


class JobGpu(NamedTuple):
    """A GPU of a job (ClusterState.job_gpus)."""

    node: str
    uuid: str
    allocated: bool  # allocated to the job; else one its processes use


def _by_rank(series: ProcessSeries) -> tuple[int, str, int]:
    """The order people read a job's processes in: by rank (those without one last), node, pid."""
    rank = series.latest.rank
    return (rank if rank is not None else 1 << 30, series.key.node, series.key.pid)


class _Polls:
    """A batch whose polls list the same processes in the same order, cut for updating each process at once.

    Process j's rows are j, j + width, …; its GPU-use entries are at the same places in every poll. The
    last poll's readings, the peaks over the polls and the CPU time of the polls after the first are taken
    a column at a time (list slices and maps: one conversion a column, not one a value).
    """

    __slots__ = ("cols", "width", "gstart", "gcounts", "uuids", "times", "t_last", "last", "cpu", "rss", "thr",
                 "fd", "rss_peaks", "uses", "gmem", "gsm", "gidx", "gmem_peaks", "cpu_first", "cpu_rest")

    def __init__(self, cols: ProcessColumns, width: int, gstart: list[int]) -> None:
        self.cols, self.width, self.gstart = cols, width, gstart
        self.gcounts, self.uuids = cols.gpu_count, cols.gpu_uuids
        self.times = cols.time[::width]  # each poll's time, in order
        self.t_last = self.times[-1]
        self.last = last = cols.rows - width  # the last poll's first row
        self.cpu, self.rss = cols.cpu_percent[last:], cols.rss_bytes[last:]
        self.thr, self.fd = cols.threads[last:], cols.open_fds[last:]
        self.rss_peaks = _peaks(cols.rss_bytes, width)  # -1 (unknown) never beats a peak
        self.uses = uses = gstart[width]  # GPU-use entries a poll
        if uses:
            self.gmem, self.gsm, self.gidx = (cols.gpu_memory_bytes[-uses:], cols.gpu_sm_utilization[-uses:],
                                              cols.gpu[-uses:])
            self.gmem_peaks = _peaks(cols.gpu_memory_bytes, uses)
        # Percent-seconds of each process over the polls after the first: the gaps between polls are every
        # process's (a poll's rows share its time), so a poll is one pass over its column. NaN where a poll's
        # percent is unknown (cpu_seconds then goes poll by poll).
        self.cpu_first = cols.cpu_percent[:width]
        rest = [0.0] * width
        for k in range(1, len(self.times)):
            gap = min(self.times[k] - self.times[k - 1], MAX_GAP_S)
            rest = list(map(add, rest, map(mul, cols.cpu_percent[k * width:(k + 1) * width], repeat(gap))))
        self.cpu_rest = rest

    def cpu_seconds(self, j: int, prev: float) -> float:
        """Process j's CPU seconds over the batch: each poll's percent over the time since the poll before (the
        first, since `prev`, its held sample's time), an unknown percent counting none."""
        times = self.times
        busy = self.cpu_rest[j]
        if busy != busy:  # a percent unknown after the first poll: poll by poll, leaving it out
            busy = 0.0
            for k in range(1, len(times)):
                v = self.cols.cpu_percent[j + k * self.width]
                if v == v:
                    busy += v * min(times[k] - times[k - 1], MAX_GAP_S)
        v = self.cpu_first[j]
        if v == v and times[0] > prev:
            busy += v * min(times[0] - prev, MAX_GAP_S)
        return busy / 100.0

    def take(self, series: ProcessSeries, j: int, relabelled: bool) -> None:
        """Process j of the batch into its series: the last poll's readings into its latest sample (in place,
        unless `relabelled`: then the sample is new already), its host and GPU memory peaks over the polls."""
        gcount = self.gcounts[j]
        if not relabelled:
            s = series.latest
            s.time = self.t_last
            v = self.cpu[j]
            s.cpu_percent = v if v == v else None  # NaN: unknown
            v = self.rss[j]
            s.rss_bytes = v if v >= 0 else None  # -1: unknown
            v = self.thr[j]
            s.threads = v if v >= 0 else None
            v = self.fd[j]
            s.open_fds = v if v >= 0 else None
            if s.state or self.cols.states:
                s.state, s.wchan = self.cols.state_of(self.last + j)
            if gcount == 1:
                g = self.gstart[j]
                m, u = self.gmem[g], self.gsm[g]
                s.gpus = (GpuUse(self.uuids[self.gidx[g]], m if m >= 0 else None, u if u == u else None),)
            elif gcount:
                s.gpus = self.cols.gpu_uses(self.gstart[self.last + j], gcount)
            elif s.gpus:
                s.gpus = ()
        v = self.rss_peaks[j]
        if v > series.rss_peak:
            series.rss_peak = v
        if gcount == 1:
            v = self.gmem_peaks[self.gstart[j]]
            if v > series.gpu_memory_peak:
                series.gpu_memory_peak = v
        elif gcount:  # GPU memory summed over the process's GPUs, poll by poll
            for row in range(j, self.cols.rows, self.width):
                g = _raw_point(self.cols, row, self.gstart[row])[3]  # -1 (unknown) never beats a peak
                if g > series.gpu_memory_peak:
                    series.gpu_memory_peak = g

    def extend_history(self, series: ProcessSeries, j: int, step: float) -> None:
        """History points of process j: the first poll a step after the last point, the first a step after
        that, … (usually one a batch; found by bisection, the polls being in time order), each written
        straight from its row."""
        times, hist = self.times, series.history
        polls = len(times)
        k = bisect_left(times, hist.last_t + step)  # 0 for an empty history (last_t -inf)
        while k < polls:
            row = j + k * self.width
            hist.append_raw(*_raw_point(self.cols, row, self.gstart[row]))
            k = bisect_left(times, times[k] + step, k + 1)


def _peaks(col: list, width: int) -> list:
    """Per place in a poll, the largest value over the polls (`col` holds polls of `width` values, in order)."""
    if len(col) == width:
        return col
    return list(map(max, *(col[k:k + width] for k in range(0, len(col), width))))


def _raw_point(cols: ProcessColumns, i: int, g: int) -> tuple:
    """Row i of a table as a history point in the ring's own encoding (NaN, -1: unknown, as the columns carry
    them; g: where its GPU-use entries start): what the row's whole sample would give, GPU memory summed over
    the process's GPUs that report it (unknown past what a ring holds), the highest SM utilisation.

    Ingest's hot path: a point is written from the columns, without building a sample or a Point.
    """
    n = cols.gpu_count[i]
    if n == 1:  # the usual case
        gmem, gutil = cols.gpu_memory_bytes[g], cols.gpu_sm_utilization[g]
    else:
        gmem, gutil = -1, _NAN
        for k in range(g, g + n):
            m, u = cols.gpu_memory_bytes[k], cols.gpu_sm_utilization[k]
            if m >= 0:
                gmem = m if gmem < 0 else gmem + m
            if u == u and not u <= gutil:  # NaN: unknown (and gutil NaN until a utilisation is known)
                gutil = u
        if gmem > _INT64_MAX:
            gmem = -1
    return cols.time[i], cols.cpu_percent[i], cols.rss_bytes[i], gmem, gutil, cols.threads[i], cols.open_fds[i]


#: Allocator figures older than this (a process that stopped sending them) are not its figures now.
ALLOCATOR_FRESH_S = 120.0


def allocator_totals(series: ProcessSeries, now: float) -> tuple[int | None, int | None, int | None]:
    """(allocated, reserved, allocation retries) over the process's devices as its allocator last said, each
    None where no device said it or the figures are older than ALLOCATOR_FRESH_S at `now`."""
    if not series.allocator or now - series.allocator_time > ALLOCATOR_FRESH_S:
        return None, None, None

    def total(name: str) -> int | None:
        vals = [getattr(a, name) for a in series.allocator if getattr(a, name) is not None]
        return sum(vals) if vals else None

    return total("allocated_bytes"), total("reserved_bytes"), total("alloc_retries")


def stale_after(points: deque, poll_interval_s: float) -> float:
    """How long a rank's step may stay put before it reads as stalled: STALE_STEP_GAPS of its mean gap
    between new steps over the recent reports, at least as many of its node's polls; DEFAULT_STEP_STALE_S
    until the reports show two new steps."""
    moves = []
    prev = None
    for t, step in points:
        if prev is not None and step != prev:
            moves.append(t)
        prev = step
    floor = STALE_STEP_GAPS * poll_interval_s
    if len(moves) < 2:
        return max(DEFAULT_STEP_STALE_S, floor)
    return max(STALE_STEP_GAPS * (moves[-1] - moves[0]) / (len(moves) - 1), floor)


def step_stalled(series: ProcessSeries, t: float) -> None:
    """As of `t` (the node's clock, as the reports' times): a rank whose step has not moved for its
    step_stale_s is stalled since its step last moved, and its step rate is 0 (not that of its last
    reports, which `status`, the job summary and /metrics would show for good)."""
    if series.step_time and t - series.step_time > series.step_stale_s:
        series.stalled_since = series.step_time
        if series.steps_per_s:
            series.steps_per_s = 0.0
    elif series.stalled_since is not None:
        series.stalled_since = None


def step_rate(points: deque) -> float | None:
    """Steps per second over the recent reports (from deltas, not a cumulative average).

    Uses the span of the last reports, so a stall shows as a falling rate within a few
    reports, while one slow step does not swing it.
    """
    if len(points) < 2:
        return None
    recent = list(points)[-8:]
    (t0, s0), (t1, s1) = recent[0], recent[-1]
    if t1 <= t0:
        return None
    return max(0.0, (s1 - s0) / (t1 - t0))
