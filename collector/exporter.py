"""The Prometheus endpoint: metric families built at scrape time from the collector's state.

Each scrape builds the families from the current state (no long-lived Gauges), so a job's
series disappear from /metrics as soon as it ends, with no label bookkeeping. Base units, a
`clusterwatch_` prefix, no label named `job` (the Slurm job is `job_id`); a job's run tags are
labels `tag_<name>` of clusterwatch_job_info, at most 8, the name in lower-case ASCII. Per-job, per-rank
and per-GPU series by default; per-process series (label `pid`) only when asked for, because
pids are unbounded over time.

A scrape runs in two steps. `ClusterCollector.snapshot()` copies what the families need out of
the state into plain tuples; it is the only part that reads the state, so the caller holds the
core's lock for it alone. `ClusterCollector.render()` writes the exposition text from the
snapshot, outside the lock: the Prometheus text format 0.0.4, or OpenMetrics 1.0.0 when the
scraper asks for it (the two differ only in the `# HELP`/`# TYPE` lines and the final `# EOF`).
Each label set's `{...}` string is kept from one scrape to the next (labels rarely change) and
rebuilt only for label sets the last scrape did not have; label sets no longer present are
dropped at every scrape. The text is prometheus_client's `generate_latest` of the families
`collect()` yields, line for line, but for one intended difference: integer values are written as
integers (`3221225472`, not `3.221225472e+09`), the same number to any parser
(tests/collector/test_exporter.py checks both).

`metrics_app`/`serve_metrics` serve it over HTTP with prometheus_client's WSGI app, format choice and
gzip negotiation, on the library's threading server bounded to 64 connections, each given 10 s to send
its request (the library's server waits for a request for ever).
"""
from __future__ import annotations

import gzip
import itertools
import socket
import string
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer, choose_encoder, gzip_accepted, make_wsgi_app
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from .state import ClusterState

# zlib level 1: a scrape of megabytes must not hold a thread for long; level 9 (gzip's default, and
# prometheus_client's) takes about ten times longer for some 13 % less (bench/bench_metrics.py)
GZIP_LEVEL = 1


# Run tags become labels of clusterwatch_job_info: a small set, fixed per job (its first tags,
# in the order they arrived), so a job that sends ever more tag keys makes no new label names. Their
# values are bounded in churn where they enter the state (state.MAX_TAG_CHANGES): a value that changes
# at every report would otherwise make a new series at every scrape.
MAX_TAG_LABELS = 8
MAX_TAG_NAME = 32   # characters of the name after "tag_"
MAX_TAG_VALUE = 128
# str.isalnum() is true for "é", "²", "٣": Prometheus label names are ASCII [a-zA-Z_][a-zA-Z0-9_]*,
# and promtool's lint wants them snake_case (it fails `aA`), hence lower case only
_LABEL_NAME_CHARS = frozenset(string.ascii_lowercase + string.digits + "_")


def tag_label_name(key: str) -> str:
    """tag_<key> in lower case, each character Prometheus does not allow in a label name turned into `_`.

    The prefix keeps the result a valid name (never starting with a digit or `__`) and apart from
    the job's own labels (job_id, user, name, ...).
    """
    return "tag_" + "".join(c if c in _LABEL_NAME_CHARS else "_" for c in key[:MAX_TAG_NAME].lower())


def tag_labels(tags: dict[str, str], taken: Iterable[str] = ()) -> dict[str, str]:
    """A job's run tags as label pairs: at most MAX_TAG_LABELS, the first ones the job reported.

    Args:
        tags: the job's tags, in the order they arrived.
        taken: label names the family already has; a tag that would map onto one is left out,
            as is a tag whose name maps onto an earlier tag's (`lr-sched` and `lr_sched`): a
            label name twice in one series makes the whole exposition unparsable.
    """
    out: dict[str, str] = {}
    reserved = set(taken)
    # a bounded look (this runs under the core's lock): names that collide cost at most this many
    for key, value in itertools.islice(tags.items(), 4 * MAX_TAG_LABELS):
        if len(out) >= MAX_TAG_LABELS:
            break
        name = tag_label_name(key)
        if name in out or name in reserved:
            continue
        out[name] = str(value)[:MAX_TAG_VALUE]
    return out


def code_labels(records) -> list[str]:
    """commit, branch, dirty, remote and the number of versions over a job's provenance records."""
    counts: dict[str, list[dict]] = {}
    for r in records:
        counts.setdefault(r.get("code_id", "unknown"), []).append(r)
    known = {k: v for k, v in counts.items() if k != "unknown"} or counts
    main = max(known.values(), key=len)[0].get("git") or {}
    dirty = main.get("dirty")
    return [str(main.get("commit", "unknown")), str(main.get("branch", "unknown")),
            "unknown" if dirty in (None, "unknown") else str(bool(dirty)).lower(),
            str(main.get("remote_url", "") or ""), str(len(known))]


class Family(NamedTuple):
    """One metric family as exported: name as OpenMetrics has it (a counter without `_total`, an info
    without `_info`), type (gauge, counter, info), help, and its label names in the order of the values."""

    name: str
    type: str
    help: str
    labels: tuple[str, ...]

    @property
    def sample_name(self) -> str:
        return self.name + {"counter": "_total", "info": "_info"}.get(self.type, "")


def _fam(name: str, type_: str, help_text: str, *labels: str) -> Family:
    return Family(name, type_, help_text, labels)


RANK_LABELS = ("job_id", "node", "rank")
GPU_LABELS = ("node", "gpu", "index", "job_id")
JOB_INFO = _fam("clusterwatch_job", "info", "A running job (value 1; labels describe it, run tags as tag_<name>).",
                "job_id", "user", "name", "partition", "state")
JOB_CODE = _fam("clusterwatch_job_code", "info", "The code a running job runs, from git provenance (the most common "
                "version when ranks differ; versions counts them).",
                "job_id", "commit", "branch", "dirty", "remote", "versions")
JOB_FAMILIES = (
    _fam("clusterwatch_job_processes", "gauge", "Live processes of the job.", "job_id"),
    _fam("clusterwatch_job_gpu_memory_used_bytes", "gauge", "GPU memory used by all the job's processes.", "job_id"),
    _fam("clusterwatch_job_rss_bytes", "gauge", "Resident host memory of all the job's processes.", "job_id"),
)
# in the order of the values in a snapshot's rank rows
RANK_FAMILIES = (
    _fam("clusterwatch_rank_gpu_memory_used_bytes", "gauge", "GPU memory used by the rank's process.", *RANK_LABELS),
    _fam("clusterwatch_rank_rss_bytes", "gauge", "Resident host memory of the rank's process.", *RANK_LABELS),
    _fam("clusterwatch_rank_cpu_ratio", "gauge", "CPU use of the rank's process (1 = one core).", *RANK_LABELS),
    _fam("clusterwatch_rank_gpu_utilization_ratio", "gauge", "SM utilisation by the rank's process (0-1).",
         *RANK_LABELS),
    _fam("clusterwatch_rank_threads", "gauge", "Threads of the rank's process.", *RANK_LABELS),
    _fam("clusterwatch_rank_open_fds", "gauge", "Open file descriptors of the rank's process.", *RANK_LABELS),
    _fam("clusterwatch_rank_step", "gauge", "Training step the rank last reported.", *RANK_LABELS),
    _fam("clusterwatch_rank_steps_per_second", "gauge", "Training steps per second (recent).", *RANK_LABELS),
    _fam("clusterwatch_rank_loss", "gauge", "Training loss the rank last reported.", *RANK_LABELS),
    _fam("clusterwatch_rank_learning_rate", "gauge", "Learning rate the rank last reported.", *RANK_LABELS),
)
PROCESS_LABELS = ("job_id", "node", "pid", "command")
PROCESS_FAMILIES = (
    _fam("clusterwatch_process_gpu_memory_used_bytes", "gauge", "GPU memory used by the process.", *PROCESS_LABELS),
    _fam("clusterwatch_process_rss_bytes", "gauge", "Resident host memory of the process.", *PROCESS_LABELS),
    _fam("clusterwatch_process_cpu_ratio", "gauge", "CPU use of the process (1 = one core).", *PROCESS_LABELS),
)
GPU_FAMILIES = (
    _fam("clusterwatch_gpu_utilization_ratio", "gauge", "GPU utilisation (0-1).", *GPU_LABELS),
    _fam("clusterwatch_gpu_memory_used_bytes", "gauge", "GPU memory used.", *GPU_LABELS),
    _fam("clusterwatch_gpu_memory_total_bytes", "gauge", "GPU memory size.", "node", "gpu", "index"),
    _fam("clusterwatch_gpu_power_watts", "gauge", "GPU board power draw.", "node", "gpu", "index"),
)
NODE_FAMILIES = (
    _fam("clusterwatch_node_up", "gauge", "1 when the node's agent reported within 3 intervals.", "node"),
    _fam("clusterwatch_node_memory_total_bytes", "gauge", "Host memory of the node.", "node"),
    _fam("clusterwatch_node_last_seen_timestamp_seconds", "gauge",
         "When the node's agent last reported (Unix seconds).", "node"),
    _fam("clusterwatch_agent_samples_dropped", "counter", "Samples the node's agent dropped on buffer overflow.",
         "node"),
)
ALERT_FAMILY = _fam("clusterwatch_alert", "gauge", "Alerts pending or firing (1 per alert).",
                    "rule", "severity", "state", "job_id", "node", "rank")


# the families render() writes with code of their own; the rest go through its generic path
_WRITTEN_APART = frozenset(f.name for f in (JOB_INFO, JOB_CODE, *JOB_FAMILIES, *RANK_FAMILIES, *PROCESS_FAMILIES,
                                            *GPU_FAMILIES))


class JobRow(NamedTuple):
    """A running job in a snapshot."""

    job_id: str
    user: str
    name: str
    partition: str
    state: str
    tags: tuple[tuple[str, str], ...]  # tag label (name, value) pairs
    code: list[str] | None  # JOB_CODE's label values after job_id, None without provenance
    processes: int  # live
    gpu_memory_bytes: int
    rss_bytes: int


class GpuRow(NamedTuple):
    """A GPU in a snapshot (None: not reported)."""

    node: str
    uuid: str
    index: str
    job_id: str  # the job it is allocated to or used by, "" for none
    utilization_ratio: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    power_watts: float | None


class NodeRow(NamedTuple):
    """A node in a snapshot."""

    node: str
    up: float  # 1.0 or 0.0
    memory_total_bytes: int
    last_seen: float
    samples_dropped: int


class Snapshot(NamedTuple):
    """What one scrape exports, copied out of the state (no state objects).

    ranks: ((job_id, node, rank), then one value or None per RANK_FAMILIES entry); processes: ((job_id,
    node, pid, command), then one value or None per PROCESS_FAMILIES entry): rows of family columns, as
    the writer reads them. alerts: label values in ALERT_FAMILY order, or None when alerts are not
    exported; counters: (name, help, value).
    """

    jobs: list[JobRow]
    ranks: list[tuple]
    processes: list[tuple] | None
    gpus: list[GpuRow]
    nodes: list[NodeRow]
    alerts: list[tuple[str, ...]] | None
    counters: list[tuple[str, str, float]] | None
    extra: Any = None   # the `extra` families' own snapshot (the GPU health ones), None without them


def format_value(v) -> str:
    """A sample value: an int as its digits (`3221225472`, where prometheus_client writes `3.221225472e+09`:
    the same number to a parser, and 8 times cheaper to write), anything else as prometheus_client writes it
    (Go's float formatting: `0.25`, `1.7e+09`, `+Inf`, `NaN`)."""
    cls = v.__class__
    if cls is int:
        return str(v)
    if cls is float and -1e16 < v < 1e6:
        return repr(v)
    return floatToGoString(v)


def same_exposition(ours: bytes, theirs: bytes) -> bool:
    """True when two exposition texts say the same thing line for line: comments and series (name and
    labels) byte for byte, values as numbers (for checking ours against prometheus_client's)."""
    a, b = ours.decode().split("\n"), theirs.decode().split("\n")
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x == y:
            continue
        if x.startswith("#") or y.startswith("#"):
            return False
        xs, _, xv = x.rpartition(" ")
        ys, _, yv = y.rpartition(" ")
        if xs != ys or float(xv) != float(yv):
            return False
    return True


def escape_label_value(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def label_string(names: tuple[str, ...], values) -> str:
    """`{a="x",b="y"} ` with the names sorted (as prometheus_client writes them) and a trailing space."""
    if not names:
        return " "
    pairs = sorted(zip(names, values, strict=True))
    return "{" + ",".join(f'{n}="{escape_label_value(str(v))}"' for n, v in pairs) + "} "


def _headers(fam: Family, openmetrics: bool) -> str:
    if openmetrics:
        help_text = escape_label_value(fam.help)
        return f"# HELP {fam.name} {help_text}\n# TYPE {fam.name} {fam.type}\n"
    name = fam.sample_name
    help_text = fam.help.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {help_text}\n# TYPE {name} {'gauge' if fam.type == 'info' else fam.type}\n"


class ClusterCollector(Collector):
    """Every clusterwatch family from a ClusterState: `snapshot()` + `render()` for the scrape path, and
    `collect()` (prometheus_client families from the same snapshot) for registries and OpenMetrics tools.

    Args:
        state: the collector's state.
        clock: current time (Unix seconds).
        per_process: also export per-process series with a `pid` label.
        counters: ingest counters to export (name → (value, help)), read at scrape time.
        alerts: returns active alerts as dicts (rule, severity, state, job_id, node, rank).
        after_intervals: a node is down after this many of its poll intervals without a batch.
        extra: more families (collector/health/metrics.py HealthFamilies): its snapshot() is taken with the
            state's, under the lock; its series(snap) gives their rows and write(snap, writer) their text,
            after every family of the state's.
    """

    def __init__(self, state: ClusterState, clock: Callable[[], float], per_process: bool = False,
                 counters: Callable[[], dict[str, tuple[float, str]]] | None = None,
                 alerts: Callable[[], Iterable[dict]] | None = None, after_intervals: float = 3.0,
                 extra: Callable[[], list[tuple[Family, list]]] | None = None,
                 owns_node: Callable[[str], bool] | None = None) -> None:
        self.state = state
        # A shard exports a node's own series (its GPUs, node_up, node memory) only when the node is its own
        # (clusterwatch/shards.py for_node): the node's agent streams to its jobs' collectors too, each of
        # which learns the node from the stream's Hello, and sums across shards must count a node once.
        self.owns_node = owns_node
        self.extra = extra
        self.clock = clock
        self.per_process = per_process
        self.counters = counters
        self.alerts = alerts
        self.after_intervals = after_intervals
        # label-set string caches, one per kind of label set: values tuple → "{...} "; each render
        # replaces a cache by the entries it used, so ended jobs' label sets go at the next scrape
        self._cache: dict[str, dict] = {}
        self._cache_lock = threading.Lock()

    def describe(self):
        # No static description: families are built at scrape time (avoids a collect() on register).
        return []

    # -- reading the state (under the core's lock) ------------------------------------------------

    def snapshot(self) -> Snapshot:
        """Copy what the families need out of the state; the caller holds the lock ingest writes under."""
        st = self.state
        now = self.clock()
        procs_by_key = st.processes
        pids = st.pids
        per_process = self.per_process
        jobs, ranks = [], []
        processes = [] if per_process else None
        alloc_owner: dict[str, str] = {}
        use_owner: dict[str, str] = {}
        for job in st.jobs.values():
            if job.ended:
                continue
            job_id = job.job_id
            for uuids in job.gpus_by_node.values():
                for u in uuids:
                    alloc_owner[u] = job_id
            n = gsum = rsum = 0
            for key in job.processes:
                series = procs_by_key.get(key)
                if series is None or not series.alive:
                    continue
                n += 1
                s = series.latest
                gpus = s.gpus
                gmem = s.gpu_memory_bytes if gpus else None
                rss = s.rss_bytes
                for g in gpus:
                    if g.gpu_uuid not in use_owner:
                        use_owner[g.gpu_uuid] = job_id
                if gmem:
                    gsum += gmem
                if rss:
                    rsum += rss
                # Ranks are the unit users reason in; a rank's children (DataLoader workers)
                # share its rank label, so only the rank's own process (or an unranked
                # process) gets a rank series (and a process series), and children add to the
                # job totals.
                rank = s.rank
                if s.mapped_by == "tree" and rank is not None:
                    parent = pids.get(s.node, {}).get(s.ppid)
                    if parent is not None and parent.alive and parent.latest.rank == rank:
                        continue
                cpu = s.cpu_percent
                if per_process:
                    processes.append(((job_id, s.node, str(s.pid), s.command), gmem, rss,
                                      cpu / 100.0 if cpu is not None else None))
                gutil = s.gpu_utilization if gpus else None
                ranks.append((
                    (job_id, s.node, str(rank) if rank is not None else f"pid{s.pid}"),
                    gmem, rss, cpu / 100.0 if cpu is not None else None,
                    gutil / 100.0 if gutil is not None else None, s.threads, s.open_fds,
                    series.step, series.steps_per_s, series.loss, series.lr,
                ))
            code = code_labels(job.provenance.values()) if job.provenance else None
            tags = tuple(tag_labels(job.tags, JOB_INFO.labels).items())
            jobs.append(JobRow(job_id, job.user, job.name, job.partition, job.state, tags, code, n, gsum, rsum))
        use_owner.update(alloc_owner)  # a GPU allocated to a job is that job's; else the first job using it
        gpus = []
        owns = self.owns_node
        for uuid, gs in st.gpus.items():
            if owns is not None and not owns(gs.node):
                continue
            r = gs.latest
            job_id = use_owner.get(uuid, "")
            if r is None:
                gpus.append(GpuRow(gs.node, uuid, str(gs.info.index), job_id, None, None, gs.info.memory_total_bytes,
                                   None))
                continue
            util = r.utilization
            gpus.append(GpuRow(gs.node, uuid, str(gs.info.index), job_id, util / 100.0 if util is not None else None,
                               r.memory_used_bytes, r.memory_total_bytes or gs.info.memory_total_bytes, r.power_watts))
        node_up, after = st.node_up, self.after_intervals
        nodes = [NodeRow(ns.node, 1.0 if node_up(ns, now, after) else 0.0, ns.memory_total_bytes, ns.last_seen,
                         ns.samples_dropped) for ns in st.nodes.values() if owns is None or owns(ns.node)]
        alerts = None
        if self.alerts is not None:
            alerts = [(a["rule"], a["severity"], a["state"], a.get("job_id", ""), a.get("node", ""), a.get("rank", ""))
                      for a in self.alerts()]
        counters = None
        if self.counters is not None:
            counters = [(name, help_text, value) for name, (value, help_text) in self.counters().items()]
        extra = self.extra.snapshot() if self.extra is not None else None
        return Snapshot(jobs, ranks, processes, gpus, nodes, alerts, counters, extra)

    # -- families, in exposition order -----------------------------------------------------------

    def series(self, snap: Snapshot) -> list[tuple[Family, list[tuple[tuple[str, ...], tuple, float]]]]:
        """Each family of a snapshot with its rows: (label names, label values, value). The one place
        that says which series exist; `render()` writes the hot families (ranks, GPUs) itself, faster,
        and tests/collector/test_exporter.py checks that both give the same text."""
        out = []
        info_rows, code_rows = [], []
        job_rows: list[list] = [[], [], []]
        for job_id, user, name, partition, state, tags, code, n, gsum, rsum in snap.jobs:
            names = JOB_INFO.labels + tuple(k for k, _ in tags)
            info_rows.append((names, (job_id, user, name, partition, state, *(v for _, v in tags)), 1.0))
            if code is not None:
                code_rows.append((JOB_CODE.labels, (job_id, *code), 1.0))
            for rows, value in zip(job_rows, (n, gsum, rsum), strict=True):
                rows.append((("job_id",), (job_id,), value))
        out.append((JOB_INFO, info_rows))
        out.append((JOB_CODE, code_rows))
        out.extend(zip(JOB_FAMILIES, job_rows, strict=True))
        rank_rows: list[list] = [[] for _ in RANK_FAMILIES]
        for key, *values in snap.ranks:
            for rows, value in zip(rank_rows, values, strict=True):
                if value is not None:
                    rows.append((RANK_LABELS, key, value))
        out.extend(zip(RANK_FAMILIES, rank_rows, strict=True))
        if snap.processes is not None:
            proc_rows: list[list] = [[] for _ in PROCESS_FAMILIES]
            for key, *values in snap.processes:
                for rows, value in zip(proc_rows, values, strict=True):
                    if value is not None:
                        rows.append((PROCESS_LABELS, key, value))
            out.extend(zip(PROCESS_FAMILIES, proc_rows, strict=True))
        gpu_rows: list[list] = [[] for _ in GPU_FAMILIES]
        for node, uuid, idx, job_id, util, used, total, power in snap.gpus:
            if util is not None:
                gpu_rows[0].append((GPU_LABELS, (node, uuid, idx, job_id), util))
            if used is not None:
                gpu_rows[1].append((GPU_LABELS, (node, uuid, idx, job_id), used))
            if total:
                gpu_rows[2].append((GPU_FAMILIES[2].labels, (node, uuid, idx), total))
            if power is not None:
                gpu_rows[3].append((GPU_FAMILIES[3].labels, (node, uuid, idx), power))
        out.extend(zip(GPU_FAMILIES, gpu_rows, strict=True))
        node_rows: list[list] = [[] for _ in NODE_FAMILIES]
        for node, up, mem, seen, dropped in snap.nodes:
            for i, value in enumerate((up, mem or None, seen, dropped)):
                if value is not None:
                    node_rows[i].append((("node",), (node,), value))
        out.extend(zip(NODE_FAMILIES, node_rows, strict=True))
        if snap.alerts is not None:
            out.append((ALERT_FAMILY, [(ALERT_FAMILY.labels, a, 1) for a in snap.alerts]))
        for name, help_text, value in snap.counters or ():
            out.append((Family(name, "counter", help_text, ()), [((), (), value)]))
        if snap.extra is not None and self.extra is not None:
            out.extend(self.extra.series(snap.extra))
        return out

    def collect(self):
        """prometheus_client families (for a CollectorRegistry; the HTTP endpoint uses render())."""
        return self.families(self.snapshot())

    def families(self, snap: Snapshot):
        """A snapshot's families as prometheus_client objects."""
        for fam, rows in self.series(snap):
            if fam.type == "info":
                f = InfoMetricFamily(fam.name, fam.help, labels=fam.labels)
                for names, values, _ in rows:
                    labels = dict(zip(names, values, strict=True))
                    f.add_metric([labels.pop(n) for n in fam.labels], labels)
            elif fam.type == "counter":
                f = CounterMetricFamily(fam.name, fam.help, labels=fam.labels)
                for _, values, value in rows:
                    f.add_metric(list(values), value)
            else:
                f = GaugeMetricFamily(fam.name, fam.help, labels=fam.labels)
                for _, values, value in rows:
                    f.add_metric(list(values), value)
            yield f

    # -- writing the text (no lock) --------------------------------------------------------------

    def render(self, snap: Snapshot, openmetrics: bool = False, names: set[str] | None = None) -> bytes:
        """The exposition text of a snapshot: Prometheus text 0.0.4, or OpenMetrics 1.0.0.

        names: only these families (by sample name, as prometheus_client's `name[]` parameter); families
        with no series are then left out.
        """
        with self._cache_lock:
            old = self._cache
        out = _TextWriter(old, openmetrics, names)
        groups = self.series(Snapshot(snap.jobs, [], None, [], snap.nodes, snap.alerts, snap.counters))
        by_name = {fam.name: rows for fam, rows in groups}
        for fam in (JOB_INFO, JOB_CODE, *JOB_FAMILIES):
            out.generic(fam, by_name[fam.name], "job")
        _write_ranks(out, snap.ranks)
        if snap.processes is not None:
            _write_processes(out, snap.processes)
        _write_gpus(out, snap.gpus)
        for fam, rows in groups:  # nodes, alerts, counters
            if fam.name not in _WRITTEN_APART:
                out.generic(fam, rows, "other")
        if snap.extra is not None and self.extra is not None:
            self.extra.write(snap.extra, out)
        if openmetrics:
            out.parts.append("# EOF\n")
        with self._cache_lock:
            self._cache = out.new
        return "".join(out.parts).encode("utf-8")


class _TextWriter:
    """The text of one render, and its label strings: the last scrape's read (`old`), this one's kept (`new`).

    Label strings are cached by kind (job, rank, process, gpu, other) and key; a key this scrape does not
    write is not carried over, so an ended job's strings go with its series.
    """

    __slots__ = ("old", "new", "parts", "openmetrics", "names")

    def __init__(self, old: dict[str, dict], openmetrics: bool, names: set[str] | None) -> None:
        self.old, self.new = old, {}
        self.parts: list[str] = []
        self.openmetrics, self.names = openmetrics, names

    def caches(self, kind: str) -> tuple[dict, dict]:
        """(the last scrape's label strings of `kind`, this scrape's to fill)."""
        return self.old.get(kind, {}), self.new.setdefault(kind, {})

    def emit(self, fam: Family, lines: list[str]) -> None:
        if self.names is not None and (fam.sample_name not in self.names or not lines):
            return
        self.parts.append(_headers(fam, self.openmetrics))
        self.parts.extend(lines)

    def generic(self, fam: Family, rows, kind: str) -> None:
        """A family from `series()` rows: (label names, label values, value)."""
        cache, used = self.caches(kind)
        sname, fmt = fam.sample_name, format_value
        lines = []
        for label_names, values, value in rows:
            key = (label_names, values)
            lbl = cache.get(key)
            if lbl is None:
                lbl = label_string(label_names, values)
            used[key] = lbl
            lines.append(f"{sname}{lbl}{fmt(value)}\n")
        self.emit(fam, lines)


def _write_ranks(out: _TextWriter, ranks: list) -> None:
    """The ten rank families: one label string per rank, the loop written out (most of a scrape's time)."""
    cache, used = out.caches("rank")
    get, fmt = cache.get, format_value
    lines_by_family: list[list[str]] = [[] for _ in RANK_FAMILIES]
    a0, a1, a2, a3, a4, a5, a6, a7, a8, a9 = (lines.append for lines in lines_by_family)
    p0, p1, p2, p3, p4, p5, p6, p7, p8, p9 = (fam.sample_name for fam in RANK_FAMILIES)
    for key, v0, v1, v2, v3, v4, v5, v6, v7, v8, v9 in ranks:
        lbl = get(key)
        if lbl is None:
            lbl = label_string(RANK_LABELS, key)
        used[key] = lbl
        if v0 is not None:
            a0(f"{p0}{lbl}{fmt(v0)}\n")
        if v1 is not None:
            a1(f"{p1}{lbl}{fmt(v1)}\n")
        if v2 is not None:
            a2(f"{p2}{lbl}{fmt(v2)}\n")
        if v3 is not None:
            a3(f"{p3}{lbl}{fmt(v3)}\n")
        if v4 is not None:
            a4(f"{p4}{lbl}{fmt(v4)}\n")
        if v5 is not None:
            a5(f"{p5}{lbl}{fmt(v5)}\n")
        if v6 is not None:
            a6(f"{p6}{lbl}{fmt(v6)}\n")
        if v7 is not None:
            a7(f"{p7}{lbl}{fmt(v7)}\n")
        if v8 is not None:
            a8(f"{p8}{lbl}{fmt(v8)}\n")
        if v9 is not None:
            a9(f"{p9}{lbl}{fmt(v9)}\n")
    for fam, lines in zip(RANK_FAMILIES, lines_by_family, strict=True):
        out.emit(fam, lines)


def _write_processes(out: _TextWriter, processes: list) -> None:
    """The per-process families (label `pid`), when asked for."""
    cache, used = out.caches("process")
    fmt = format_value
    lines_by_family: list[list[str]] = [[] for _ in PROCESS_FAMILIES]
    prefixes = [fam.sample_name for fam in PROCESS_FAMILIES]
    for key, *values in processes:
        lbl = cache.get(key)
        if lbl is None:
            lbl = label_string(PROCESS_LABELS, key)
        used[key] = lbl
        for lines, prefix, value in zip(lines_by_family, prefixes, values, strict=True):
            if value is not None:
                lines.append(f"{prefix}{lbl}{fmt(value)}\n")
    for fam, lines in zip(PROCESS_FAMILIES, lines_by_family, strict=True):
        out.emit(fam, lines)


def _write_gpus(out: _TextWriter, gpus: list) -> None:
    """The GPU families: the four-label string (with job_id) and the three-label one, cached together."""
    cache, used = out.caches("gpu")
    fmt = format_value
    util_l, used_l, total_l, power_l = [], [], [], []
    p_util, p_used, p_total, p_power = (fam.sample_name for fam in GPU_FAMILIES)
    short_labels = GPU_FAMILIES[2].labels
    for node, uuid, idx, job_id, util, mem_used, total, power in gpus:
        key = (node, uuid, idx, job_id)
        pair = cache.get(key)
        if pair is None:
            pair = (label_string(GPU_LABELS, key), label_string(short_labels, key[:3]))
        used[key] = pair
        if util is not None:
            util_l.append(f"{p_util}{pair[0]}{fmt(util)}\n")
        if mem_used is not None:
            used_l.append(f"{p_used}{pair[0]}{fmt(mem_used)}\n")
        if total:
            total_l.append(f"{p_total}{pair[1]}{fmt(total)}\n")
        if power is not None:
            power_l.append(f"{p_power}{pair[1]}{fmt(power)}\n")
    for fam, lines in zip(GPU_FAMILIES, (util_l, used_l, total_l, power_l), strict=True):
        out.emit(fam, lines)


class Exposition:
    """The scrape path: a snapshot under `lock` (the lock ingest writes the state under), text outside it."""

    def __init__(self, collector: ClusterCollector, lock) -> None:
        self.collector = collector
        self.lock = lock

    def scrape(self, openmetrics: bool = False, names: set[str] | None = None) -> bytes:
        with self.lock:
            snap = self.collector.snapshot()
        return self.collector.render(snap, openmetrics, names)


def metrics_app(exposition: Exposition) -> Callable:
    """A WSGI app serving the exposition on any path: prometheus_client's app, with our writer for GETs.

    prometheus_client's `make_wsgi_app` answers OPTIONS, other methods (405) and /favicon.ico; a GET
    (or HEAD) takes its format from the library's `choose_encoder` and its compression from
    `gzip_accepted`, and is written by `render()` instead of the library's `generate_latest`.
    """
    library_app = make_wsgi_app(CollectorRegistry(auto_describe=False))

    def app(environ, start_response):
        method = environ["REQUEST_METHOD"]
        if method not in ("GET", "HEAD") or environ.get("PATH_INFO") == "/favicon.ico":
            return library_app(environ, start_response)
        params = parse_qs(environ.get("QUERY_STRING", ""))
        _, content_type = choose_encoder(environ.get("HTTP_ACCEPT"))
        om = content_type.startswith("application/openmetrics-text")
        body = exposition.scrape(om, set(params["name[]"]) if "name[]" in params else None)
        headers = [("Content-Type", content_type)]
        if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING")):
            # not the library's gzip (level 9): see GZIP_LEVEL
            body = gzip.compress(body, compresslevel=GZIP_LEVEL)
            headers.append(("Content-Encoding", "gzip"))
        headers.append(("Content-Length", str(len(body))))
        start_response("200 OK", headers)
        return [b""] if method == "HEAD" else [body]

    return app


# Bounds of the HTTP server. Each connection has a thread, and wsgiref waits for a request
# for ever: without a bound, connections that never send one hold as many threads and descriptors,
# and at the descriptor limit /metrics stops answering.
MAX_CONNECTIONS = 64       # connections served at once; past it the oldest one still sending its request goes
REQUEST_TIMEOUT_S = 10.0   # for the request: each read, and (checked as connections come) the whole request
RESPONSE_TIMEOUT_S = 60.0  # for the response: 9 MB of exposition to a slow scraper


class _Server(ThreadingWSGIServer):
    """prometheus_client's server (wsgiref's, a daemon thread per connection), at most `max_connections`
    connections at once, each given `request_timeout_s` for its request (the library's has no bound).

    A connection counts from its accept to its close. When a new one would pass the limit, the one
    that has waited longest for its request goes (shut down, so its thread ends at once), or, when
    every connection is past its request (writing a response), the new one is closed unserved
    (`refused`). A scraper sends its request as soon as it connects, so idle or dripping connections
    can never keep a scrape out. A connection still sending its request after `request_timeout_s`
    goes too, the next time one comes.
    """

    request_queue_size = 128  # the listen backlog: socketserver's 5 drops the SYNs of a burst (1 s retries)
    max_connections = MAX_CONNECTIONS
    request_timeout_s = REQUEST_TIMEOUT_S

    def server_activate(self) -> None:
        super().server_activate()
        self._conn_lock = threading.Lock()
        self._reading: dict[socket.socket, float] = {}  # connection -> accept time, until its request is read
        self._open: set[socket.socket] = set()
        self.evicted = self.refused = 0

    def process_request(self, request, client_address) -> None:
        now = time.monotonic()
        with self._conn_lock:
            for conn, since in list(self._reading.items()):
                if now - since > self.request_timeout_s:
                    self._evict(conn)
            if len(self._open) >= self.max_connections:
                if not self._reading:
                    self.refused += 1
                    self.close_request(request)
                    return
                self._evict(min(self._reading, key=self._reading.__getitem__))
            self._open.add(request)
            self._reading[request] = now
        super().process_request(request, client_address)

    def _evict(self, conn: socket.socket) -> None:
        # shutdown, not close: the connection's thread still owns the descriptor, and its read
        # returns at once (an empty request line, which wsgiref ends quietly)
        self._reading.pop(conn, None)
        self._open.discard(conn)
        self.evicted += 1
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def request_read(self, conn: socket.socket) -> None:
        """The connection's request is in: it is answered now, and no longer evicted."""
        with self._conn_lock:
            self._reading.pop(conn, None)

    def shutdown_request(self, request) -> None:
        with self._conn_lock:
            self._reading.pop(request, None)
            self._open.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request, client_address) -> None:
        # a client that timed out, hung up or was evicted is no error of ours: no traceback
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


class _QuietHandler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S  # StreamRequestHandler sets it on the socket: each read of the request

    def parse_request(self) -> bool:
        ok = super().parse_request()
        if ok:  # the request line and headers are in (wsgiref reads no body for GET)
            self.server.request_read(self.connection)
            self.connection.settimeout(RESPONSE_TIMEOUT_S)
        return ok

    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        """No access log (a scrape every 15 s)."""


def serve_metrics(exposition: Exposition, host: str, port: int, max_connections: int = MAX_CONNECTIONS,
                  request_timeout_s: float = REQUEST_TIMEOUT_S) -> WSGIServer:
    """Serve /metrics on host:port (IPv4 or IPv6) from a daemon thread; shutdown() and server_close() stop it.

    Args:
        exposition: what to serve.
        host: the address to listen on.
        port: the port (0: any free one; the server's server_port says which).
        max_connections: connections served at once (see _Server).
        request_timeout_s: how long a connection may take to send its request.
    """
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]

    class Server(_Server):
        address_family = family

    Server.max_connections, Server.request_timeout_s = max_connections, request_timeout_s

    class Handler(_QuietHandler):
        timeout = request_timeout_s

    httpd = make_server(sockaddr[0], port, metrics_app(exposition), Server, handler_class=Handler)
    threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True).start()
    return httpd
