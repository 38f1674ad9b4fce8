"""Replay a recorded trace through the rule engine, in time order.

A trace is JSON lines, one observation per line (docs/traces.md). Reading the
file is the only I/O here; everything else is the same engine the collector runs.
Lines that are not JSON objects with `t`, `node` and `pid` are counted and
skipped, not fatal: a trace cut off by a crash still replays. GPU health records
go to a HealthEngine (collector/health/), with the GPU users the collector named,
which the record carries (`users`); an older trace's record without them takes the
users from the trace's process lines, as the collector takes them from its state; its findings
are the engine's source of a stall's causes, as the collector's HealthEngine is.
Their clock-event reasons and temperature go to the engine as well (job_slowdown's
GPU side and its culprit), as the collector feeds each health reading.
"""
from __future__ import annotations

import heapq
import os
import pickle
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from clusterwatch.errors import ParseError

from ..health.xid_catalog import XidCatalog
from ..rules import AlertEvent, Engine, RuleSet
from ..rules.model import GpuClockObservation
from ..state.observations import gpu_from_record, heartbeat_from_record, process_from_record


@dataclass
class ReplayStats:
    """What a replay read.

    Attributes:
        samples: Observations fed to the engine.
        bad_lines: Lines skipped as malformed.
        first_bad: Up to five (line number, reason) of skipped lines.
        out_of_order: Observations older than the one before in the same reader's share
            of the trace (fed anyway, counted).
        records: GPU, node and health records read.
        health: Health records among them (a replay in several processes replays those in one).
    """

    samples: int = 0
    bad_lines: int = 0
    first_bad: list[tuple[int, str]] = field(default_factory=list)
    out_of_order: int = 0
    records: int = 0
    health: int = 0


def _bad(stats: ReplayStats, lineno: int, why: str) -> None:
    stats.bad_lines += 1
    if len(stats.first_bad) < 5:
        stats.first_bad.append((lineno, why))


def replay_lines(lines: IO[bytes] | Iterator[bytes], rules: RuleSet, stats: ReplayStats | None = None,
                 catalog: XidCatalog | None = None) -> Iterator[AlertEvent]:
    """Feed trace lines to a fresh engine and yield alert events as they happen.

    Args:
        lines: Trace lines as bytes (an open binary file works).
        rules: The rule set.
        stats: Filled with counts of samples and bad lines, when given.
        catalog: The XID catalog for the health records (default: the shipped one).

    Yields:
        Alert events, oldest first. `agent_down` is checked at every "node" record; an
        "end" record forgets its process (resolving its alerts).
    """
    st = stats if stats is not None else ReplayStats()
    for _, ev in _run(lines, Engine(rules), st, 0, 1, catalog):
        yield ev


class _Health:
    """The health records' side of a replay: a HealthEngine, and who is on each GPU as the trace says.

    The collector names a health event's victims from its state: the node's live processes of a job
    on the GPU, or the process the driver named, started by the event's time (health/live.py
    `gpu_users`). Here they are the processes the trace has shown on the node and not ended.
    """

    def __init__(self, catalog: XidCatalog | None) -> None:
        from clusterwatch.collector.health.engine import HealthEngine
        from clusterwatch.collector.health.xid_catalog import load_catalog

        # same_xid_s=0: the trace holds the events the collector took, its duplicates dropped already
        # (and its lines are in time order, not the order they came in, which that rule depends on)
        self.engine = HealthEngine(catalog if catalog is not None else load_catalog(), same_xid_s=0.0)
        self.procs: dict[str, dict[tuple[Any, Any], tuple[dict[str, Any], str | None]]] = {}
        # a stall's causes (see `causes`): each job's GPUs and its first process's start, each GPU's index
        self.job_gpus: dict[str, set[tuple[str, str]]] = {}
        self.job_start: dict[str, float] = {}
        self.job_started: set[str] = set()  # the jobs whose start a job record gave: no process line moves it
        self.gpu_index: dict[str, int] = {}
        # (node, GPU) → the job its latest gpu record says it is allocated to: the collector's GPU owner
        self.owner: dict[tuple[str, str], str] = {}
        self.parent: dict[tuple[str, str], str] = {}   # (node, MIG instance) → its whole GPU, from gpu records
        # processes held (D, T, t) as their latest line says: (node, pid, start time) → that line
        self.held: dict[tuple[str, Any, Any], dict[str, Any]] = {}

    def process(self, d: dict[str, Any]) -> None:
        procs = self.procs.get(d["node"])
        if procs is None:
            procs = self.procs[d["node"]] = {}
        key = (d["pid"], d.get("start_time", 0.0))
        command = d.get("command")
        held = procs.get(key)
        if held is None or held[0].get("gpu") != d.get("gpu") or held[0].get("job_id") != d.get("job_id"):
            self._joined(d)
        if command is None and held is not None:
            command = held[1]
        procs[key] = (d, command)
        state, since = d.get("state"), d.get("state_since")
        if isinstance(state, str) and state in _HELD_STATES and isinstance(since, (int, float)):
            self.held[(d["node"], *key)] = d
        elif self.held:
            self.held.pop((d["node"], *key), None)

    def _joined(self, d: dict[str, Any]) -> None:
        """A process first seen (or moved to another job or GPU): its job's GPUs and start."""
        job_id = d.get("job_id")
        if not job_id:
            return
        job_id = str(job_id)
        start = float(d.get("start_time") or 0.0)
        if start and start < self.job_start.get(job_id, float("inf")) and job_id not in self.job_started:
            self.job_start[job_id] = start
        gpu = d.get("gpu")
        if gpu:
            self.job_gpus.setdefault(job_id, set()).add((str(d["node"]), str(gpu)))
            if d.get("gpu_index") is not None:
                self.gpu_index[str(gpu)] = d["gpu_index"]

    def job(self, d: dict[str, Any]) -> None:
        """A job record (`record` writes one first): the job's start and GPUs as the collector held them, in place
        of what its process lines suggest (a trace without one, hand-written or older, is read from them)."""
        job_id = str(d["job_id"])
        start = d.get("start_time")
        if start:
            self.job_start[job_id] = float(start)
            self.job_started.add(job_id)
        for g in d.get("gpus") or ():
            self.job_gpus.setdefault(job_id, set()).add((str(g["node"]), str(g["gpu"])))
            if g.get("index") is not None:
                self.gpu_index[str(g["gpu"])] = g["index"]

    def gpu(self, d: dict[str, Any]) -> None:
        """A GPU record: the job it is allocated to has it among its GPUs."""
        job_id = d.get("job_id")
        if job_id:
            self.job_gpus.setdefault(str(job_id), set()).add((str(d["node"]), str(d["gpu"])))
        self.owner[(str(d["node"]), str(d["gpu"]))] = str(job_id or "")
        if d.get("index") is not None:
            self.gpu_index[str(d["gpu"])] = d["index"]
        parent = d.get("parent")
        if parent:
            self.parent[(str(d["node"]), str(d["gpu"]))] = str(parent)
            if d.get("index") is not None:   # a whole GPU in MIG mode is shown by its instances' index
                self.gpu_index.setdefault(str(parent), d["index"])

    def causes(self, job_id: str, since: float, now: float) -> list:
        """A stall's causes the health records give (rules/causes.py's CauseSource), as the collector's
        HealthCauses gives them (collector/alerting/stall_causes.py): the health findings on the job's GPUs (those
        allocated to it and those its processes used) from `since`, not before the job, worst first, then its
        ranks held (D, T, t) long enough. The job's start is its job record's (the collector's), else its first
        process's."""
        from ..alerting.stall_causes import finding_cause
        from ..rules.causes import CAUSE_LOOKBACK_S

        out = []
        gpus = self.job_gpus.get(job_id) or set()
        gpus = gpus | {(n, self.parent[n, u]) for n, u in gpus if (n, u) in self.parent}   # MIG: the whole GPU
        stall_for = max(0.0, now - since - CAUSE_LOOKBACK_S)
        since = max(since, self.job_start.get(job_id, 0.0))
        for t, f in self.engine.findings(sorted(gpus), since=since):
            if t > now + 1.0:
                continue
            out.append(finding_cause(t, f, now, self.gpu_index.get(f.uuid)))
        return out + self._held_ranks(job_id, stall_for, now)

    def _held_ranks(self, job_id: str, stall_for: float, now: float) -> list:
        """The job's ranks held (D, T, t) long enough to explain the stall, longest held first, as the
        collector's HealthCauses names them from its state."""
        from ..rules.causes import held_long_enough, held_rank

        held = [d for d in self.held.values() if str(d.get("job_id") or "") == job_id
                and held_long_enough(now - float(d["state_since"]), stall_for)]
        held.sort(key=lambda d: (float(d["state_since"]), d["node"], d["pid"], d.get("start_time", 0.0)))
        return [held_rank(d["state"], d.get("rank"), str(d["node"]), d["pid"], now - float(d["state_since"]),
                          str(d.get("wchan") or "")) for d in held]

    def end(self, node: str, pid: int, start_time: float) -> None:
        (self.procs.get(node) or {}).pop((pid, start_time), None)
        self.held.pop((node, pid, start_time), None)

    def users(self, node: str, uuid: str, pid: int | None = None, hit_at: float | None = None) -> list:
        from clusterwatch.collector.health.decisions import GpuUser

        out = []
        # a whole GPU in MIG mode is used by the processes on its instances
        on = {uuid} | {u for (n, u), parent in self.parent.items() if n == node and parent == uuid} if uuid else set()
        for (p, start), (d, command) in (self.procs.get(node) or {}).items():
            job_id = d.get("job_id")
            if not job_id or (hit_at is not None and (start or 0.0) > hit_at + 1.0):
                continue
            gpu = d.get("gpu")
            if p == pid or any(gpu == u for u in on):   # by ==: a hostile line's gpu may be unhashable
                out.append(GpuUser(job_id=str(job_id), rank=d.get("rank"), pid=p, process=command or None,
                                   start_time=float(start or 0.0)))
        out.sort(key=lambda u: (u.job_id, u.rank if u.rank is not None else 1 << 30, u.pid or 0))
        return out

    def event(self, d: dict[str, Any]) -> list[AlertEvent]:
        from clusterwatch.v1 import agent_pb2

        msg = agent_pb2.HealthEvent(time=float(d.get("event_t", d["t"])), uuid=str(d.get("gpu") or ""),
                                    kind=str(d["event"]), data=int(d.get("data", 0)), process=str(d.get("process", "")),
                                    pci=str(d.get("pci", "")), text=str(d.get("text", "")),
                                    source=_SOURCE_NUMBERS.get(d.get("source"), 0))
        if d.get("xid") is not None:
            msg.xid = d["xid"]
        pid = d.get("hit_pid")
        if pid is not None:
            msg.pid = pid
        users = _named(d)
        if users is None:
            users = self.users(str(d["node"]), msg.uuid, pid, msg.time)
        return self.engine.observe_event(str(d["node"]), msg, users)

    def reading(self, d: dict[str, Any]) -> Any:
        """A gpu_health record read back into the GpuHealth message the collector took."""
        from clusterwatch.v1 import agent_pb2

        from .record import HEALTH_COUNTERS

        msg = agent_pb2.GpuHealth(time=float(d["t"]), uuid=str(d["gpu"]))
        for name in HEALTH_COUNTERS:
            v = d.get(name)
            if v is not None:
                setattr(msg, name, v)
        for counter, n in (d.get("nvlink_errors") or {}).items():   # not an object: AttributeError, a bad line
            msg.nvlink_errors[counter] = n
        for policy, seconds in (d.get("violation_seconds") or {}).items():  # a string's seconds: TypeError
            msg.violation_seconds[policy] = seconds
        return msg

    def counters(self, node: str, msg: Any, users: list | None) -> list[AlertEvent]:
        """The reading to the health rules, with the users the record names (None: those the trace shows)."""
        return self.engine.observe_counters(node, msg, self.users(node, msg.uuid) if users is None else users)

    def clocks(self, node: str, msg: Any) -> Any:
        """The reading's clock-event reasons and temperature as the collector gives them to the engine."""
        return GpuClockObservation.of_reading(node, msg, self.owner.get((node, msg.uuid), ""),
                                              self.gpu_index.get(msg.uuid))


def _named(d: dict[str, Any]) -> list | None:
    """The GPU users a health record says the collector named (record.py `users_record`), None where it says
    none (a trace from before records carried them); a malformed one is a bad line (TypeError, KeyError)."""
    named = d.get("users")
    if named is None:
        return None
    from clusterwatch.collector.health.decisions import GpuUser

    out = []
    for u in named:
        rank, pid, process = u.get("rank"), u.get("process_id"), u.get("process")
        if any(v is not None and type(v) is not int for v in (rank, pid)) or not isinstance(process, (str, type(None))):
            raise TypeError("a user's rank, process_id or process")
        out.append(GpuUser(job_id=str(u["job_id"]), rank=rank, pid=pid, process=process,
                           start_time=float(u.get("start_time", 0.0))))
    return out


_SOURCE_NUMBERS = {"nvml": 1, "kmsg": 2}
_HELD_STATES = frozenset({"D", "T", "t"})   # a process line's `state`: any other is no hold


def _reader_of(line: bytes, owners: dict[bytes, int], share: int) -> int:
    """Which of `share` readers takes the line: by its pid's bytes, unparsed (`owners` remembers them); a line
    without one (GPU, node and job records, malformed lines) goes to reader 0."""
    i = line.find(b'"pid":')
    if i < 0:
        return 0
    key = line[i + 6:i + 14]
    o = owners.get(key)
    if o is None:
        o = owners[key] = zlib.crc32(key) % share
    return o


def _run(lines: IO[bytes] | Iterator[bytes], eng: Engine, st: ReplayStats, me: int, share: int,
         catalog: XidCatalog | None = None) -> Iterator[tuple[int, AlertEvent]]:
    """The replay loop: (line number, event) for every event, in line order.

    With `share` > 1 this reader takes only the lines whose series `_owner` gives to
    reader `me`, and skips the rest unparsed (see `replay_file`).
    """
    observe = eng.observe
    loads = orjson.loads
    last_t = float("-inf")
    n = 0
    owners: dict[bytes, int] = {}
    health = _Health(catalog)
    track = health.process
    if eng.causes is None:  # a stall names the health finding that caused it, as the collector's does
        eng.causes = health.causes
    for lineno, line in enumerate(lines, 1):
        if share > 1 and _reader_of(line, owners, share) != me:
            continue
        try:
            d = loads(line)
        except orjson.JSONDecodeError:
            if line.strip():
                _bad(st, lineno, "not JSON")
            continue
        try:
            t = d["t"]
            kind = d.get("kind")
            if kind is None:
                d["pid"] + 0  # noqa: B018 - a non-numeric pid is a bad line, caught below
                events = observe(process_from_record(d))
                track(d)
            elif kind == "gpu":
                st.records += 1
                health.gpu(d)
                events = eng.observe_gpu(gpu_from_record(d))
            elif kind == "job":
                st.records += 1
                health.job(d)
                events = []
            elif kind == "node":
                st.records += 1
                hb = heartbeat_from_record(d)
                events = [*eng.tick(hb.t), *eng.heartbeat(hb)]
            elif kind == "end":  # the process was found gone: its alerts end as they did live
                events = eng.forget_process(str(d["node"]), d["pid"] + 0, float(d.get("start_time", 0.0)), float(t))
                health.end(str(d["node"]), d["pid"], d.get("start_time", 0.0))
            elif kind == "health_event":
                st.records += 1
                st.health += 1
                events = health.event(d)
            elif kind == "gpu_health":
                st.records += 1
                st.health += 1
                node, msg = str(d["node"]), health.reading(d)
                # the health rules first, then job_slowdown, as the collector takes a batch's health records
                events = [*health.counters(node, msg, _named(d)), *eng.observe_gpu_clocks(health.clocks(node, msg))]
            else:
                _bad(st, lineno, f"unknown kind {kind!r}")
                continue
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            _bad(st, lineno, f"missing or wrong field {exc}" if isinstance(exc, KeyError) else
                 "not an observation object" if isinstance(exc, AttributeError) else f"wrong type ({exc})")
            continue
        n += 1
        if t < last_t:
            st.out_of_order += 1
        else:
            last_t = t
        for ev in events:
            yield lineno, ev
    st.samples += n


#: The rules whose alerts name a stall's likely cause, worked out over the job's ranks and GPUs (rules/causes.py).
_CAUSED = frozenset({"training_stall", "gpu_stall", "idle_gpu"})

#: Traces at least this large are replayed by several processes (when the machine has the cores).
PARALLEL_MIN_BYTES = 16 * 1024 * 1024


def default_workers(path: str | Path) -> int:
    """How many processes `replay_file` uses for a trace: 1 for small ones; else one per idle core, up to 4.

    A core counts as idle when the one-minute load average leaves it free: on a busy machine
    the shares would only take turns on the same cores, and sharing costs some work (each
    process reads every line), so there one process is faster.
    """
    if not hasattr(os, "fork"):
        return 1
    try:
        if os.path.getsize(path) < PARALLEL_MIN_BYTES:
            return 1
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        load = os.getloadavg()[0]
    except OSError:
        return 1
    return max(1, min(4, cores, int(cores - load + 0.5)))


def replay_file(path: str | Path, rules: RuleSet, stats: ReplayStats | None = None, workers: int | None = None,
                catalog: XidCatalog | None = None) -> Iterator[AlertEvent]:
    """Replay a trace file; see `replay_lines`.

    With several workers, each process reads the whole file but parses only the lines
    of its share of the series (a series, found from the text after `"pid":`, always
    goes to the same one), runs its own engine over them, and the events are merged in
    line order: the output is the one a single engine gives, event for event. The
    engines' rules are per process, GPU and node, so series do not interact; GPU and
    node records all go to the first worker. Should a series still land in two workers
    (a trace that spells one pid two ways), the trace is replayed again in one process;
    so is one with health records, whose GPU users come from every process line, and one that raises a
    stall (`_CAUSED`), whose likely cause is judged over the whole job.

    Args:
        path: Trace file (JSON lines).
        rules: The rule set.
        stats: Filled with counts, when given.
        workers: Processes to use; None picks (see `default_workers`).

    Yields:
        Alert events, oldest first. With several workers they come once all are done.

    Raises:
        ParseError: The file cannot be opened.
    """
    st = stats if stats is not None else ReplayStats()
    k = default_workers(path) if workers is None else max(1, workers)
    if k > 1 and hasattr(os, "fork"):
        merged = _replay_parallel(path, rules, k, catalog)
        if merged is not None:
            events, parts = merged
            for part in parts:
                st.samples += part.samples
                st.bad_lines += part.bad_lines
                st.out_of_order += part.out_of_order
                st.records += part.records
                st.health += part.health
            st.first_bad = sorted(x for part in parts for x in part.first_bad)[:5]
            yield from events
            return
    f = _open(path)
    with f:
        for _, ev in _run(f, Engine(rules), st, 0, 1, catalog):
            yield ev


def _open(path: str | Path) -> IO[bytes]:
    try:
        return open(path, "rb")  # noqa: SIM115 - the callers close it
    except OSError as exc:
        raise ParseError(f"{path}: cannot read the trace: {exc.strerror or exc}") from exc


def _share(path: str | Path, rules: RuleSet, me: int, share: int, catalog: XidCatalog | None = None
           ) -> tuple[list[tuple[int, AlertEvent]], ReplayStats, set[tuple[Any, ...]]]:
    st = ReplayStats()
    eng = Engine(rules)
    with _open(path) as f:
        events = list(_run(f, eng, st, me, share, catalog))
    return events, st, eng.series()


def _replay_parallel(path: str | Path, rules: RuleSet, k: int, catalog: XidCatalog | None = None
                     ) -> tuple[list[AlertEvent], list[ReplayStats]] | None:
    """Replay with k processes (this one and k - 1 forked); None when the shares overlapped or a worker failed."""
    _open(path).close()  # a missing file is the caller's error, raised here once
    children = []
    for me in range(1, k):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child; its result is checked by the parent
            code = 1
            try:
                os.close(r)
                data = pickle.dumps(_share(path, rules, me, k, catalog), protocol=pickle.HIGHEST_PROTOCOL)
                with os.fdopen(w, "wb") as out:
                    out.write(data)
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        children.append((pid, r))
    results = [_share(path, rules, 0, k, catalog)]
    ok = True
    for pid, r in children:
        with os.fdopen(r, "rb") as inp:
            data = inp.read()
        _, status, _ = os.wait4(pid, 0)
        if status != 0 or not data:
            ok = False
            continue
        results.append(pickle.loads(data))
    if not ok:
        return None
    seen: set[tuple[Any, ...]] = set()
    for i, (events, part, series) in enumerate(results):
        if (i > 0 and part.records) or part.health or not seen.isdisjoint(series) \
                or any(ev.rule in _CAUSED for _, ev in events):
            # GPU or node records outside reader 0, or a series split: not one engine's result; health
            # records: reader 0 saw only its share of the processes, the GPUs' users; a stall: its cause is
            # judged over the whole job (its other ranks, its GPUs' power), which each reader holds a share of
            return None
        seen |= series
    merged = heapq.merge(*(ev for ev, _, _ in results), key=lambda x: x[0])
    return [ev for _, ev in merged], [part for _, part, _ in results]


def event_json(ev: AlertEvent) -> bytes:
    """One event as a compact JSON line (no newline)."""
    return orjson.dumps(ev.to_dict())


def event_human(ev: AlertEvent) -> str:
    """One event as a line a person reads: time, state, rule, severity, description."""
    return f"{_clock(ev.t)}  {ev.state:<8} {ev.rule:<17} {ev.severity:<8} {ev.description}"


def _clock(t: float) -> str:
    if t >= 1e9:  # Unix time: show the date
        import datetime as _dt

        return _dt.datetime.fromtimestamp(t, tz=_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
    s = int(t)
    return f"t={s // 3600:d}:{s // 60 % 60:02d}:{s % 60:02d}"


def to_dict(ev: AlertEvent) -> dict[str, Any]:
    """The event as a JSON-ready dict (same as `AlertEvent.to_dict`)."""
    return ev.to_dict()
