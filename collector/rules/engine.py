"""The rule engine: observations in, alert events out, in time order, no look-ahead.

Pure: no clock, no I/O, no `eval`. It keeps incremental
state per process, GPU and node (that is what makes it fast), and takes time only
from its inputs. The collector feeds it live; `clusterwatch replay` feeds it a trace.

Lifecycle: a condition first seen raises "pending" (stall rules, idle GPU), then
"firing" once it has held long enough; leak rules fire directly, since their
windows already demand sustained growth. A firing or pending alert "resolves" when
its condition clears, or when its process, job or node is forgotten.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from . import causes as _causes
from . import fragmentation, gpu_stall, handle_leak, memory_leak, training_stall
from .agent_down import AgentsDown
from .causes import CAUSE_LOOKBACK_S, Cause, CauseSource, RankFigures
from .config import RuleSet
from .idle_gpu import IdleGpus
from .job_slowdown import UNSET, Slowdowns
from .model import (
    FIRING,
    RESOLVED,
    ActiveAlert,
    AlertEvent,
    GpuClockObservation,
    GpuObservation,
    NodeHeartbeat,
    ProcessObservation,
    Rule,
)
from .process import BASE_SLOTS, ENDED_WHILE_FIRING, Proc
from .slowdown_causes import HostSource, slowdown_cause
from .units import PROCESS_RULES

__all__ = ["ENDED_WHILE_FIRING", "Engine", "evaluate"]

_NO_EVENTS: tuple[AlertEvent, ...] = ()
#: What a host leak fills, for its text: the node's RAM, or where Slurm gives the job memory, its allocation.
NODE_MEMORY = "node memory"
JOB_ALLOCATION = "the job's memory allocation"
_GUARDS = tuple(u.guard for u in PROCESS_RULES if hasattr(u, "guard"))
_DESCRIBE = {name.value: u.describe for u in PROCESS_RULES for name in u.NAMES}


class _Proc(Proc):
    """A process with every process rule's state (see units.py)."""

    # `pace`: job_slowdown's (job_slowdown.py): its job's JobPace where it is the rank read, else a marker
    __slots__ = BASE_SLOTS + tuple(s for u in PROCESS_RULES for s in u.SLOTS) + ("pace",)
    GUARDED = frozenset(name.value for u in PROCESS_RULES if hasattr(u, "guard") for name in u.NAMES)

    def __init__(self, node: str, pid: int, start_time: float, t0: float) -> None:
        super().__init__(node, pid, start_time, t0)
        for u in PROCESS_RULES:
            u.init(self)
        self.pace = UNSET

    def guard(self) -> None:
        for g in _GUARDS:
            g(self)


class Engine:
    """Runs every rule over observations as they arrive.

    Args:
        rules: The rule set (see `load_rules`).
        causes: What the caller knows of a stall's causes that the engine cannot (health events on the
            job's GPUs, see rules/causes.py); None: only what the engine holds.

    Every method returns the alert events its input caused, oldest first (often none).
    """

    def __init__(self, rules: RuleSet, causes: CauseSource | None = None, host: HostSource | None = None) -> None:
        self.rules = rules
        self.causes = causes
        self._procs: dict[tuple[str, int, float], _Proc] = {}
        self._by_job: dict[str, set[tuple[str, int, float]]] = {}  # job id → its processes (a stall's odd rank)
        self._gone: dict[str, list[tuple[float, int | None, str, int]]] = {}  # job id → (t, rank, node, pid) ended
        self._cause_memo: dict[str, tuple[float, Cause | None]] = {}  # job id → (t, its stall's likely cause)
        self._label_cache: dict[tuple[str, str, str, str], tuple[RuleSet, frozenset[str]]] = {}
        self._idle_gpus = IdleGpus()
        self._agents = AgentsDown()
        self.host = host  # a slow job's ranks' host side (held in D, CPU saturated), which the engine cannot see
        self._slow = Slowdowns()

    # ---- processes ---------------------------------------------------------------------------

    def observe(self, obs: ProcessObservation) -> list[AlertEvent] | tuple[AlertEvent, ...]:
        """Take one process observation.

        Args:
            obs: The observation; its labels (user, command, job name, partition) are
                read when the process is first seen or its job id or rank changes. Its host
                memory is measured against `job_mem_total_bytes` where given (the job's
                memory allocation), else `node_mem_total_bytes`.

        Returns:
            Alert events caused by it.
        """
        (t, node, job_id, pid, start_time, gpu, rank, user, command, job_name, partition, gmem, gtotal, util, _cpu,
         rss, ceiling, job_ceiling, threads, fds, step, allocated, reserved, retries, tmpfs, tokens, samples) = obs
        key = (node, pid, start_time)
        p = self._procs.get(key)
        if p is None or p.job_id != job_id or p.rank != rank:
            p = self._labels(key, p, t, job_id, gpu, rank, user, command, job_name, partition)
        if job_ceiling is not None:
            ceiling, p.host_full = job_ceiling, JOB_ALLOCATION
        elif rss is not None:
            p.host_full = NODE_MEMORY
        # else: without an RSS it says nothing of its ceiling (`record` writes one only beside an RSS), and the
        # name stays its last: a leak measured against the allocation is not renamed by a read that failed
        if tmpfs:  # the job's tmpfs files, on its oldest process on the node: host memory too
            p.host_tmpfs = True
            if rss is not None:
                rss += tmpfs
        out = self._ingest(p, t, gmem, gtotal, util, rss, ceiling, threads, fds, step, allocated is not None,
                           tokens, samples)
        if allocated is not None:
            found = self._allocator(p, t, allocated, reserved, retries, gmem, gtotal)
            if found:
                out = [*out, *found]
        return out

    def _labels(self, key: tuple[str, int, float], p: _Proc | None, t: float, job_id: str, gpu: str,
                rank: int | None, user: str, command: str, job_name: str, partition: str) -> _Proc:
        if p is None:
            p = _Proc(key[0], key[1], key[2], t)
            self._procs[key] = p
        elif p.job_id:
            self._by_job.get(p.job_id, set()).discard(key)
        if getattr(p.pace, "job_id", None) != (job_id or ""):
            p.pace = UNSET  # it says afresh whether it is the rank its job's pace reads
        p.job_id, p.gpu, p.rank = job_id or "", gpu or "", rank
        if p.job_id:
            self._by_job.setdefault(p.job_id, set()).add(key)
        p.user, p.command, p.job_name, p.partition = user or "", command or "", job_name or "", partition or ""
        labels = (p.job_name, p.user, p.partition, p.command)
        found = self._label_cache.get(labels)
        if found is None:
            found = self.rules.for_process(*labels)
            self._label_cache[labels] = found
        if p.rules is not found[0]:
            # Thresholds changed (first sight, or the job mapping arrived): start the series afresh.
            p.rules, p.silenced = found
            for u in PROCESS_RULES:
                u.restart(p)
        else:
            p.silenced = found[1]
        p.guard()
        return p

    def _ingest(self, p: _Proc, t: float, gmem: Any, gtotal: Any, util: Any, rss: Any, ntotal: Any,
                threads: Any, fds: Any, step: Any, allocator: bool = False, tokens: Any = None, samples: Any = None
                ) -> list[AlertEvent] | tuple[AlertEvent, ...]:
        # The common cases are inlined, each one or two comparisons: a leak sample inside its
        # open bucket only lowers the bucket's minimum; a busy GPU with no stall pending, and a
        # step that moved with no stall alert, change nothing else (the guards are each rule's, see
        # units.py). The full logic sits in the rules' modules, which the slow paths call.
        out: list[AlertEvent] | None = None
        p.last_t = t
        if util is not None:
            p.last_util = util
        if allocator and not p.alloc_seen:
            out = memory_leak.allocator_seen(p, t)
        s = p.gpu_leak
        if gmem is not None and s is not None and not p.alloc_seen:
            if t < s.b_end:
                if gmem < s.cur_min:
                    s.cur_min = gmem
            else:
                f = s.roll(t, gmem, gtotal)
                if f is not None:
                    out = [memory_leak.said(p, Rule.GPU_MEMORY_LEAK, f, memory_leak.GPU_MEMORY, "GPU")]
        s = p.host_leak
        if rss is not None and s is not None:
            if t < s.b_end:
                if rss < s.cur_min:
                    s.cur_min = rss
            else:
                f = s.roll(t, rss, ntotal)
                if f is not None:
                    ev = memory_leak.said(p, Rule.HOST_MEMORY_LEAK, f, memory_leak.host_what(p), p.host_full)
                    out = [ev] if out is None else [*out, ev]
        if threads is not None and p.thr_leak is not None:
            f = p.thr_leak.add(t, threads)
            if f is not None:
                out = handle_leak.observe(p, "threads", f, out)
        if fds is not None and p.fd_leak is not None:
            f = p.fd_leak.add(t, fds)
            if f is not None:
                out = handle_leak.observe(p, "open_fds", f, out)
        if util is not None and util < p.util_quiet:
            out = gpu_stall.observe(self, p, t, util, out)
        if step is not None:
            if step != p.step:
                if p.step_quiet:
                    p.step = step
                    p.step_t = t
                else:
                    out = training_stall.observe(self, p, t, step, util, out)
            elif t - p.step_t >= p.step_wait:
                out = training_stall.observe(self, p, t, step, util, out)
            # job_slowdown: a comparison and, without counts of work, two identity tests, unless a bucket of the rank
            # it reads ends or its count of work moves
            if t >= p.pace.b_end or ((tokens is not None or samples is not None)
                                     and (samples if tokens is None else tokens) != p.pace.work):
                found = self._slow.step(p, t, step, tokens, samples, self._slow_cause)
                if found:
                    out = found if out is None else [*out, *found]
        return _NO_EVENTS if out is None else out

    def _allocator(self, p: _Proc, t: float, allocated: Any, reserved: Any, retries: Any, gmem: Any, gtotal: Any
                   ) -> list[AlertEvent] | None:
        """The allocator's figures: allocated bytes for gpu_memory_leak; reserved minus allocated, with the
        allocation retries, for gpu_memory_fragmentation. The cache (reserved rising in steps, then level,
        allocated flat) raises neither."""
        ev = memory_leak.observe_allocated(p, t, allocated, reserved, gmem, gtotal)
        return fragmentation.observe(p, t, allocated, reserved, retries, None if ev is None else [ev])

    # ---- a stall's likely cause ---------------------------------------------------------------

    def with_cause(self, p: Proc, began: float, t: float, desc: str, figures: dict[str, Any]
                   ) -> tuple[str, dict[str, Any]]:
        """A stall's description and figures with its likely cause, where there is one (the stall rules ask)."""
        cause = self._job_cause(p.job_id, began - CAUSE_LOOKBACK_S, t) if p.job_id else None
        if cause is None:
            cause = _causes.hung_collective(self._figures_of(p))
        if cause is None:
            return desc, figures
        if cause.kind == "hung_collective":
            desc = desc.replace(" (hung collective?)", "")
        return f"{desc}; likely cause: {cause.text}", {**figures, **cause.figures}

    def _figures_of(self, p: Proc) -> RankFigures:
        g = self._idle_gpus.gpus.get((p.node, p.gpu)) if p.gpu else None
        if g is None:
            return RankFigures(p.rank, p.node, p.pid, p.gpu, p.step, p.last_util)
        return RankFigures(p.rank, p.node, p.pid, p.gpu, p.step, p.last_util, g.power, g.power_peak, g.sm_active,
                           g.tensor_active)

    def _job_cause(self, job_id: str, since: float, t: float) -> Cause | None:
        """The job's most likely stall cause as of `t`: a health event on its GPUs since `since` (from the
        caller's source), a rank gone, a node's agent down, the odd rank out. Worked out once in a few
        seconds a job: every rank of a hung job stalls at once, and each alert's refresh asks."""
        if not job_id:
            return None
        memo = self._cause_memo.get(job_id)
        if memo is not None and abs(t - memo[0]) < 5.0:
            return memo[1]
        cause = self._find_cause(job_id, since, t)
        self._cause_memo[job_id] = (t, cause)
        return cause

    def _find_cause(self, job_id: str, since: float, t: float) -> Cause | None:
        if self.causes is not None:
            found = self.causes(job_id, since, t)
            if found:
                return found[0]
        gone = [g for g in self._gone.get(job_id, ()) if g[0] >= since]
        if gone:
            gt, rank, node, pid = gone[-1]
            return _causes.gone_rank(gt, rank, node, pid, t)
        for node, st in self._agents.nodes.items():
            if st.state == FIRING and job_id in st.job_ids:
                return _causes.agent_down(node, t - st.last_t)
        ranks = [self._figures_of(self._procs[k]) for k in self._by_job.get(job_id, ()) if k in self._procs]
        return _causes.odd_rank_out(ranks)

    def forget_process(self, node: str, pid: int, start_time: float, t: float) -> list[AlertEvent]:
        """The process is gone: drop its state and resolve its alerts.

        Args:
            node: Node name.
            pid: Process id.
            start_time: Process start time.
            t: Time it was found gone.

        Returns:
            A resolved event per alert it had.
        """
        p = self._procs.pop((node, pid, start_time), None)
        if p is None:
            return []
        if p.job_id:
            self._by_job.get(p.job_id, set()).discard((node, pid, start_time))
            if self._by_job.get(p.job_id):  # others of its job run on: it may be what they wait for
                self._gone.setdefault(p.job_id, []).append((t, p.rank, node, pid))
                del self._gone[p.job_id][:-8]
            self._slow.lead_gone(p.job_id, (node, pid, start_time),
                                 [self._procs[k] for k in self._by_job.get(p.job_id, ()) if k in self._procs])
        out = []
        for rule, state in list(p.alerts.items()):
            severity = getattr(p.rules, rule).severity
            if state == FIRING:
                # It did not clear: it stopped being watched, with the figures it had (issue 17, item 6).
                desc, _, figures = self._process_figures(p, rule)
                figures = dict(figures, ended_while_firing=True)
                out.append(p.event(t, rule, RESOLVED, severity, f"{desc}; {ENDED_WHILE_FIRING}: "
                                      f"the process is gone", figures))
            else:
                out.append(p.event(t, rule, RESOLVED, severity, f"{rule} of {p.who()} ended: the process is gone", {}))
        return out

    def forget_job(self, job_id: str, t: float) -> list[AlertEvent]:
        """The job ended: forget its processes and GPU allocations, resolving their alerts.

        Args:
            job_id: Slurm job id.
            t: Time the job ended.

        Returns:
            Resolved events.
        """
        out: list[AlertEvent] = []
        for key in [k for k, p in self._procs.items() if p.job_id == job_id]:
            out += self.forget_process(*key, t)
        self._by_job.pop(job_id, None)
        self._gone.pop(job_id, None)
        self._cause_memo.pop(job_id, None)
        out += self._idle_gpus.forget_job(self.rules.idle_gpu, job_id, t, self._job_cause)
        out += self._slow.forget_job(job_id, t, self._slow_cause)
        return out

    # ---- GPUs and nodes ----------------------------------------------------------------------

    def observe_gpu(self, obs: GpuObservation) -> list[AlertEvent]:
        """Take one GPU observation (for `idle_gpu`).

        Args:
            obs: The observation.

        Returns:
            Alert events caused by it.
        """
        return self._idle_gpus.observe(self.rules.idle_gpu, obs, self._job_cause)

    def observe_gpu_clocks(self, obs: GpuClockObservation) -> list[AlertEvent]:
        """Take a GPU's clock-event reasons and temperature (for `job_slowdown`: which GPU holds its job back).

        Args:
            obs: The reading.

        Returns:
            Alert events caused by it (a job without training reports, one of its GPUs held down).
        """
        return self._slow.clocks(obs, self._slow_rules(obs.job_id) if obs.job_id else None, self._gpu_ranks)

    def _slow_rules(self, job_id: str) -> tuple[Any, bool]:
        """job_slowdown's rule for a job and whether it is on there: as its processes' labels give it (the
        first the engine holds), else the file's."""
        for key in self._by_job.get(job_id, ()):
            p = self._procs.get(key)
            if p is not None and p.rules is not None:
                r = p.rules.job_slowdown
                return r, r.enabled and "job_slowdown" not in p.silenced
        r = self.rules.job_slowdown
        return r, r.enabled

    def _gpu_ranks(self, job_id: str) -> dict[tuple[str, str], int | None]:
        """(node, GPU) → the rank of the job's process on it."""
        out: dict[tuple[str, str], int | None] = {}
        for key in self._by_job.get(job_id, ()):
            p = self._procs.get(key)
            if p is not None and p.gpu and out.get((p.node, p.gpu)) is None:
                out[(p.node, p.gpu)] = p.rank
        return out

    def _slow_cause(self, job_id: str, since: float, t: float) -> Cause:
        """A slow job's likely cause: its GPUs over the slow span (a window at least, two at most), its ranks'
        GPU activity as last seen, and the host source's findings on its ranks."""
        r = self._slow_rules(job_id)[0]
        start = max(min(since, t - r.for_s), t - 2 * r.for_s)
        gpus = self._slow.gpu_figures(job_id, start, t, self._gpu_ranks)
        ranks = [self._figures_of(p) for k in self._by_job.get(job_id, ()) if (p := self._procs.get(k)) and p.gpu]
        host = list(self.host(job_id, t)) if self.host is not None else []
        return slowdown_cause(gpus, ranks, host, r.gpu_share)

    def heartbeat(self, hb: NodeHeartbeat) -> list[AlertEvent]:
        """A node's agent reported (for `agent_down`).

        Args:
            hb: The heartbeat.

        Returns:
            A resolved event when the node was down.
        """
        return self._agents.heartbeat(self.rules.agent_down, hb)

    def tick(self, now: float) -> list[AlertEvent]:
        """Let time pass with no new data (raises `agent_down` for silent nodes).

        Args:
            now: Current time, in the same clock as the observations.

        Returns:
            Alert events.
        """
        return self._agents.tick(self.rules.agent_down, now)

    # ---- figures of the moment -----------------------------------------------------------------

    def refresh(self, now: float) -> list[AlertEvent]:
        """Every alert pending or firing, its text and figures as of the latest observations (agent_down:
        as of `now`), in the state it is in: no transitions.

        The engine speaks on transitions only, so an alert's text would say what held when it fired
        ("for 1 min; full in ~1 h 24 min" six minutes later). The collector applies these to the alerts it
        holds, now and then (collector/alerting/live.py); `evaluate` and replay never call it.
        """
        out: list[AlertEvent] = []
        for p in self._procs.values():
            for rule, state in p.alerts.items():
                desc, severity, figures = self._process_figures(p, rule)
                out.append(AlertEvent(t=p.last_t, rule=rule, state=state, severity=severity, node=p.node,
                                      job_id=p.job_id, pid=p.pid, start_time=p.start_time, gpu=p.gpu, rank=p.rank,
                                      description=desc, figures=figures))
        out += self._idle_gpus.refresh(self.rules.idle_gpu, self._job_cause)
        out += self._agents.refresh(self.rules.agent_down, now)
        out += self._slow.refresh(self._slow_cause, self._gpu_ranks)
        return out

    def _process_figures(self, p: _Proc, rule: str) -> tuple[str, str, dict[str, Any]]:
        """(description, severity, figures) of a process's active alert as of its latest observation; what
        was last said where the figures cannot be worked out afresh."""
        said = p.texts.get(rule) or (f"{rule} of {p.who()}", getattr(p.rules, rule).severity, {})
        describe = _DESCRIBE.get(rule)
        return said if describe is None else describe(self, p, rule, said)

    def forget_node(self, node: str, t: float) -> list[AlertEvent]:
        """Stop watching a node (drained or removed), resolving its agent_down alert.

        Args:
            node: Node name.
            t: Time.

        Returns:
            Resolved events.
        """
        return self._agents.forget_node(self.rules.agent_down, node, t)

    def series(self) -> set[tuple[str, int, float]]:
        """Processes the engine holds state for: (node, pid, start_time)."""
        return set(self._procs)

    def active(self) -> list[ActiveAlert]:
        """Alerts now pending or firing about processes."""
        return [ActiveAlert(rule, state, p.node, p.pid, p.start_time)
                for p in self._procs.values() for rule, state in p.alerts.items()]


def evaluate(rules: RuleSet, observations: Iterable[ProcessObservation | GpuObservation | GpuClockObservation
                                                    | NodeHeartbeat]) -> list[AlertEvent]:
    """Run a fresh engine over observations in time order and return every event.

    Args:
        rules: The rule set.
        observations: Observations, oldest first.

    Returns:
        All alert events, oldest first.
    """
    eng = Engine(rules)
    out: list[AlertEvent] = []
    for o in observations:
        if isinstance(o, ProcessObservation):
            out += eng.observe(o)
        elif isinstance(o, GpuObservation):
            out += eng.observe_gpu(o)
        elif isinstance(o, GpuClockObservation):
            out += eng.observe_gpu_clocks(o)
        else:
            out += eng.tick(o.t)
            out += eng.heartbeat(o)
    return out
