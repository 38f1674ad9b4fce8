"""The Prometheus endpoint: metric families built at scrape time from the collector's state.

A custom collector (not long-lived Gauges): each scrape builds families from the
current state, so a job's series disappear from /metrics as soon as it ends, with no
label bookkeeping. Base units, a `clusterwatch_` prefix, no label named `job` (the
Slurm job is `job_id`). Per-job, per-rank and per-GPU series by default; per-process
series (label `pid`) only when asked for, because pids are unbounded over time.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from .state import ClusterState


def rank_label(rank: int | None, pid: int) -> str:
    """The `rank` label: the rank number, or pid<PID> for a process with no known rank."""
    return str(rank) if rank is not None else f"pid{pid}"


def tag_labels(tags: dict[str, str]) -> dict[str, str]:
    """Run tags as label pairs: tag_<name>, the name reduced to what Prometheus allows."""
    out = {}
    for key, value in list(tags.items())[:16]:
        name = "tag_" + "".join(c if c.isalnum() or c == "_" else "_" for c in key)[:48]
        out[name] = str(value)[:128]
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


class ClusterCollector(Collector):
    """Yields every clusterwatch family from a ClusterState.

    Args:
        state: the collector's state.
        clock: current time (Unix seconds).
        per_process: also export per-process series with a `pid` label.
        counters: ingest counters to export (name → value), read at scrape time.
        alerts: returns active alerts as dicts (rule, severity, state, job_id, node, rank).
        after_intervals: a node is down after this many of its poll intervals without a batch.
    """

    def __init__(self, state: ClusterState, clock: Callable[[], float], per_process: bool = False,
                 counters: Callable[[], dict[str, float]] | None = None,
                 alerts: Callable[[], Iterable[dict]] | None = None, after_intervals: float = 3.0) -> None:
        self.state = state
        self.clock = clock
        self.per_process = per_process
        self.counters = counters
        self.alerts = alerts
        self.after_intervals = after_intervals

    def describe(self):
        # No static description: families are built at scrape time (avoids a collect() on register).
        return []

    def collect(self):
        now = self.clock()
        st = self.state
        yield from self._jobs(st)
        yield from self._gpus(st)
        yield from self._nodes(st, now)
        if self.alerts is not None:
            fam = GaugeMetricFamily("clusterwatch_alert", "Alerts pending or firing (1 per alert).",
                                    labels=["rule", "severity", "state", "job_id", "node", "rank"])
            for a in self.alerts():
                fam.add_metric([a["rule"], a["severity"], a["state"], a.get("job_id", ""), a.get("node", ""),
                                a.get("rank", "")], 1)
            yield fam
        if self.counters is not None:
            for name, (value, help_text) in self.counters().items():
                yield CounterMetricFamily(name, help_text, value=value)

    def _jobs(self, st: ClusterState):
        info = InfoMetricFamily("clusterwatch_job", "A running job (value 1; labels describe it, run tags as "
                                "tag_<name>).", labels=["job_id", "user", "name", "partition", "state"])
        code = InfoMetricFamily("clusterwatch_job_code", "The code a running job runs, from git provenance "
                                "(the most common version when ranks differ; versions counts them).",
                                labels=["job_id", "commit", "branch", "dirty", "remote", "versions"])
        procs = GaugeMetricFamily("clusterwatch_job_processes", "Live processes of the job.", labels=["job_id"])
        jgmem = GaugeMetricFamily("clusterwatch_job_gpu_memory_used_bytes",
                                  "GPU memory used by all the job's processes.", labels=["job_id"])
        jrss = GaugeMetricFamily("clusterwatch_job_rss_bytes", "Resident host memory of all the job's processes.",
                                 labels=["job_id"])
        labels = ["job_id", "node", "rank"]
        fams = {
            "gmem": GaugeMetricFamily("clusterwatch_rank_gpu_memory_used_bytes",
                                      "GPU memory used by the rank's process.", labels=labels),
            "rss": GaugeMetricFamily("clusterwatch_rank_rss_bytes", "Resident host memory of the rank's process.",
                                     labels=labels),
            "cpu": GaugeMetricFamily("clusterwatch_rank_cpu_ratio", "CPU use of the rank's process (1 = one core).",
                                     labels=labels),
            "gutil": GaugeMetricFamily("clusterwatch_rank_gpu_utilization_ratio",
                                       "SM utilisation by the rank's process (0-1).", labels=labels),
            "threads": GaugeMetricFamily("clusterwatch_rank_threads", "Threads of the rank's process.",
                                         labels=labels),
            "fds": GaugeMetricFamily("clusterwatch_rank_open_fds", "Open file descriptors of the rank's process.",
                                     labels=labels),
            "step": GaugeMetricFamily("clusterwatch_rank_step", "Training step the rank last reported.",
                                      labels=labels),
            "rate": GaugeMetricFamily("clusterwatch_rank_steps_per_second", "Training steps per second (recent).",
                                      labels=labels),
            "loss": GaugeMetricFamily("clusterwatch_rank_loss", "Training loss the rank last reported.",
                                      labels=labels),
            "lr": GaugeMetricFamily("clusterwatch_rank_learning_rate", "Learning rate the rank last reported.",
                                    labels=labels),
        }
        pfams = {}
        if self.per_process:
            pl = ["job_id", "node", "pid", "command"]
            pfams = {
                "gmem": GaugeMetricFamily("clusterwatch_process_gpu_memory_used_bytes",
                                          "GPU memory used by the process.", labels=pl),
                "rss": GaugeMetricFamily("clusterwatch_process_rss_bytes", "Resident host memory of the process.",
                                         labels=pl),
                "cpu": GaugeMetricFamily("clusterwatch_process_cpu_ratio", "CPU use of the process (1 = one core).",
                                         labels=pl),
            }
        for job in st.jobs.values():
            if job.ended:
                continue
            info.add_metric([job.job_id, job.user, job.name, job.partition, job.state], tag_labels(job.tags))
            if job.provenance:
                code.add_metric([job.job_id, *code_labels(job.provenance.values())], {})
            n = 0
            gsum = rsum = 0
            for series in st.job_processes(job):
                if not series.alive:
                    continue
                n += 1
                s = series.latest
                # Ranks are the unit users reason in; a rank's children (DataLoader workers)
                # share its rank label, so only the rank's own process (or an unranked
                # process) gets a rank series, and children add to the job totals.
                gmem = s.gpu_memory_bytes
                gsum += gmem or 0
                rsum += s.rss_bytes or 0
                if s.mapped_by == "tree" and s.rank is not None and self._parent_has_rank(st, series):
                    continue
                lv = [job.job_id, s.node, rank_label(s.rank, s.pid)]
                for key, value in (
                    ("gmem", gmem), ("rss", s.rss_bytes),
                    ("cpu", s.cpu_percent / 100.0 if s.cpu_percent is not None else None),
                    ("gutil", s.gpu_utilization / 100.0 if s.gpu_utilization is not None else None),
                    ("threads", s.threads), ("fds", s.open_fds), ("step", series.step),
                    ("rate", series.steps_per_s), ("loss", series.loss), ("lr", series.lr),
                ):
                    if value is not None:
                        fams[key].add_metric(lv, value)
                if pfams:
                    pv = [job.job_id, s.node, str(s.pid), s.command]
                    if gmem is not None:
                        pfams["gmem"].add_metric(pv, gmem)
                    if s.rss_bytes is not None:
                        pfams["rss"].add_metric(pv, s.rss_bytes)
                    if s.cpu_percent is not None:
                        pfams["cpu"].add_metric(pv, s.cpu_percent / 100.0)
            procs.add_metric([job.job_id], n)
            jgmem.add_metric([job.job_id], gsum)
            jrss.add_metric([job.job_id], rsum)
        yield info
        yield code
        yield procs
        yield jgmem
        yield jrss
        yield from fams.values()
        yield from pfams.values()

    @staticmethod
    def _parent_has_rank(st: ClusterState, series) -> bool:
        s = series.latest
        parent_key = st._by_pid.get((s.node, s.ppid))
        parent = st.processes.get(parent_key) if parent_key else None
        return parent is not None and parent.alive and parent.latest.rank == s.rank

    def _gpus(self, st: ClusterState):
        labels = ["node", "gpu", "index", "job_id"]
        util = GaugeMetricFamily("clusterwatch_gpu_utilization_ratio", "GPU utilisation (0-1).", labels=labels)
        used = GaugeMetricFamily("clusterwatch_gpu_memory_used_bytes", "GPU memory used.", labels=labels)
        total = GaugeMetricFamily("clusterwatch_gpu_memory_total_bytes", "GPU memory size.",
                                  labels=["node", "gpu", "index"])
        power = GaugeMetricFamily("clusterwatch_gpu_power_watts", "GPU board power draw.",
                                  labels=["node", "gpu", "index"])
        owner = self._gpu_jobs(st)
        for uuid, gs in st.gpus.items():
            r = gs.latest
            idx = str(gs.info.index)
            job_id = owner.get(uuid, "")
            if r is not None and r.utilization is not None:
                util.add_metric([gs.node, uuid, idx, job_id], r.utilization / 100.0)
            if r is not None and r.memory_used_bytes is not None:
                used.add_metric([gs.node, uuid, idx, job_id], r.memory_used_bytes)
            mem_total = (r.memory_total_bytes if r is not None and r.memory_total_bytes else
                         gs.info.memory_total_bytes)
            if mem_total:
                total.add_metric([gs.node, uuid, idx], mem_total)
            if r is not None and r.power_watts is not None:
                power.add_metric([gs.node, uuid, idx], r.power_watts)
        yield util
        yield used
        yield total
        yield power

    @staticmethod
    def _gpu_jobs(st: ClusterState) -> dict[str, str]:
        """GPU UUID → the running job that holds it (allocated to it, or used by its processes)."""
        owner: dict[str, str] = {}
        for job in st.jobs.values():
            if job.ended:
                continue
            for uuids in job.gpus_by_node.values():
                for u in uuids:
                    owner[u] = job.job_id
            for series in st.job_processes(job):
                if series.alive:
                    for g in series.latest.gpus:
                        owner.setdefault(g.gpu_uuid, job.job_id)
        return owner

    def _nodes(self, st: ClusterState, now: float):
        up = GaugeMetricFamily("clusterwatch_node_up", "1 when the node's agent reported within 3 intervals.",
                               labels=["node"])
        mem = GaugeMetricFamily("clusterwatch_node_memory_total_bytes", "Host memory of the node.", labels=["node"])
        seen = GaugeMetricFamily("clusterwatch_node_last_seen_timestamp_seconds",
                                 "When the node's agent last reported (Unix seconds).", labels=["node"])
        dropped = CounterMetricFamily("clusterwatch_agent_samples_dropped",
                                      "Samples the node's agent dropped on buffer overflow.", labels=["node"])
        for ns in st.nodes.values():
            up.add_metric([ns.node], 1.0 if st.node_up(ns, now, self.after_intervals) else 0.0)
            if ns.memory_total_bytes:
                mem.add_metric([ns.node], ns.memory_total_bytes)
            seen.add_metric([ns.node], ns.last_seen)
            dropped.add_metric([ns.node], ns.samples_dropped)
        yield up
        yield mem
        yield seen
        yield dropped
