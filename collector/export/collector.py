"""ClusterCollector, every clusterwatch family from the collector's state, and Exposition, the scrape path."""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from prometheus_client.registry import Collector

from ..state.cluster import ClusterState
from .series import ExtraFamilies, FamilyRows, client_families, series
from .snapshot import AlertRow, CounterRow, Snapshot, take_snapshot
from .text import render


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
        owns_node: whether a node's own series are this collector's (a shard's); None: every node's are.
    """

    def __init__(self, state: ClusterState, clock: Callable[[], float], per_process: bool = False,
                 counters: Callable[[], dict[str, tuple[float, str]]] | None = None,
                 alerts: Callable[[], Iterable[dict]] | None = None, after_intervals: float = 3.0,
                 extra: ExtraFamilies | None = None, owns_node: Callable[[str], bool] | None = None) -> None:
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

    def snapshot(self) -> Snapshot:
        """Copy what the families need out of the state; the caller holds the lock ingest writes under."""
        snap = take_snapshot(self.state, self.clock(), self.per_process, self.after_intervals, self.owns_node)
        alerts = None
        if self.alerts is not None:
            alerts = [AlertRow(a["rule"], a["severity"], a["state"], a.get("job_id", ""), a.get("node", ""),
                               a.get("rank", "")) for a in self.alerts()]
        counters = None
        if self.counters is not None:
            counters = [CounterRow(name, help_text, value) for name, (value, help_text) in self.counters().items()]
        extra = self.extra.snapshot() if self.extra is not None else None
        return snap._replace(alerts=alerts, counters=counters, extra=extra)

    def series(self, snap: Snapshot) -> FamilyRows:
        """Each family of a snapshot with its rows: (label names, label values, value), in exposition order."""
        return series(snap, self.extra)

    def collect(self):
        """prometheus_client families (for a CollectorRegistry; the HTTP endpoint uses render())."""
        return self.families(self.snapshot())

    def families(self, snap: Snapshot):
        """A snapshot's families as prometheus_client objects."""
        return client_families(self.series(snap))

    def render(self, snap: Snapshot, openmetrics: bool = False, names: set[str] | None = None) -> bytes:
        """The exposition text of a snapshot (text.py render), reusing the last render's label strings.

        names: only these families (by sample name, as prometheus_client's `name[]` parameter); families
        with no series are then left out.
        """
        with self._cache_lock:
            old = self._cache
        text, new = render(snap, old, openmetrics, names, self.extra)
        with self._cache_lock:
            self._cache = new
        return text


class Exposition:
    """The scrape path: a snapshot under `lock` (the lock ingest writes the state under), text outside it."""

    def __init__(self, collector: ClusterCollector, lock) -> None:
        self.collector = collector
        self.lock = lock

    def scrape(self, openmetrics: bool = False, names: set[str] | None = None) -> bytes:
        """The exposition text of the state as it is now."""
        with self.lock:
            snap = self.collector.snapshot()
        return self.collector.render(snap, openmetrics, names)
