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

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from clusterwatch.humanize import duration, size

from . import causes as _causes
from .causes import CAUSE_LOOKBACK_S, Cause, CauseSource, RankFigures
from .config import RuleSet
from .leak import LeakFinding, LeakSeries
from .model import FIRING, PENDING, RESOLVED, AlertEvent, GpuObservation, NodeHeartbeat, ProcessObservation, Rule

_NO_EVENTS: tuple[AlertEvent, ...] = ()


def _hours(seconds: float) -> str:
    """A duration in alert text: the one format of clusterwatch.humanize (the CLI's notes use it too)."""
    return duration(seconds)


def _mb(b: float) -> str:
    """A size in alert text, in IEC units as the CLI's tables (the rules compute in MiB)."""
    return size(b)


#: Said of an alert whose process (or job) ended while it fired: its figures are the last ones, and it
#: did not clear (a leak that ends with its process is what an out-of-memory kill looks like).
ENDED_WHILE_FIRING = "ended while firing"


class _Proc:
    """Everything the engine remembers about one process."""

    __slots__ = ("node", "pid", "start_time", "job_id", "gpu", "rank", "user", "command", "job_name",
                 "partition", "rules", "silenced", "gpu_leak", "host_leak", "thr_leak", "fd_leak",
                 "idle_since", "seen_busy", "step", "step_t", "step_moved", "alerts", "handle_firing",
                 "t0", "util_quiet", "step_quiet", "step_wait", "last_t", "idle_util", "last_util", "texts",
                 "host_full", "alloc_leak", "alloc_seen", "frag_leak", "frag_growing", "frag_retries")

    def __init__(self, node: str, pid: int, start_time: float, t0: float) -> None:
        self.node = node
        self.pid = pid
        self.start_time = start_time
        self.t0 = t0
        self.job_id = ""
        self.gpu = ""
        self.rank: int | None = None
        self.user = self.command = self.job_name = self.partition = ""
        self.rules: RuleSet | None = None
        self.silenced: frozenset[str] = frozenset()
        self.gpu_leak: LeakSeries | None = None
        self.host_leak: LeakSeries | None = None
        self.thr_leak: LeakSeries | None = None
        self.fd_leak: LeakSeries | None = None
        self.idle_since: float | None = None
        self.seen_busy = False
        self.step: int | None = None
        self.step_t = 0.0
        self.step_moved = False
        self.alerts: dict[str, str] = {}  # rule → PENDING | FIRING
        self.handle_firing: set[str] = set()
        # Fast-path guards (see Engine._ingest), kept true to the state by the slow paths:
        # utilisation at or above `util_quiet` changes nothing; with `step_quiet`, a new step
        # only moves the step; a repeated step changes nothing until `step_wait` has passed.
        self.util_quiet = math.inf
        self.step_quiet = False
        self.step_wait = 0.0
        self.last_t = t0  # the latest observation's time: what refreshed figures are as of
        self.idle_util: float | None = None  # utilisation while its GPU idles (gpu_stall's text)
        self.last_util: float | None = None  # the latest utilisation (training_stall's text)
        # rule → (description, severity, figures) as last said while pending or firing
        self.texts: dict[str, tuple[str, str, dict[str, Any]]] = {}
        self.host_full = "node memory"  # what the host total given is: the node's RAM, or the job's allocation
        # The allocator's figures (clusterwatch.train): once a process gives allocated bytes, gpu_memory_leak
        # judges them, not NVML's figure (which holds the allocator's cache: it rises in steps, never shrinks).
        self.alloc_leak: LeakSeries | None = None
        self.alloc_seen = False
        self.frag_leak: LeakSeries | None = None  # reserved minus allocated
        self.frag_growing = False  # that series fires: gpu_memory_fragmentation once retries rise too
        self.frag_retries: deque[tuple[float, int]] = deque(maxlen=256)  # (t, retries) where they changed

    def who(self) -> str:
        where = f"pid {self.pid} on {self.node}"
        if self.rank is not None:
            return f"rank {self.rank} ({where}, job {self.job_id or '?'})"
        return f"{where} (job {self.job_id or '?'})"


@dataclass(slots=True)
class _GpuState:
    """What `idle_gpu` remembers about one GPU."""

    job_id: str
    idle_since: float | None = None
    state: str | None = None  # PENDING | FIRING, None while nothing is raised
    last: GpuObservation | None = None  # the latest observation while idle (the alert's refreshed text)
    power: float | None = None  # the latest power draw, and the highest in this allocation (a stall's cause)
    power_peak: float = 0.0


@dataclass(slots=True)
class _NodeState:
    """What `agent_down` remembers about one node."""

    last_t: float
    has_jobs: bool
    silent_after_s: float  # three of the agent's intervals: the least silence that counts
    state: str | None = None  # FIRING, None while nothing is raised
    job_ids: tuple[str, ...] = ()  # the jobs it last reported processes of


class Engine:
    """Runs every rule over observations as they arrive.

    Args:
        rules: The rule set (see `load_rules`).
        causes: What the caller knows of a stall's causes that the engine cannot (health events on the
            job's GPUs, see rules/causes.py); None: only what the engine holds.

    Every method returns the alert events its input caused, oldest first (often none).
    """

    def __init__(self, rules: RuleSet, causes: CauseSource | None = None) -> None:
        self.rules = rules
        self.causes = causes
        self._procs: dict[tuple[str, int, float], _Proc] = {}
        self._by_job: dict[str, set[tuple[str, int, float]]] = {}  # job id → its processes (a stall's odd rank)
        self._gone: dict[str, list[tuple[float, int | None, str, int]]] = {}  # job id → (t, rank, node, pid) ended
        self._cause_memo: dict[str, tuple[float, Cause | None]] = {}  # job id → (t, its stall's likely cause)
        self._label_cache: dict[tuple[str, str, str, str], tuple[RuleSet, frozenset[str]]] = {}
        self._gpus: dict[tuple[str, str], _GpuState] = {}  # (node, gpu) → its state
        self._nodes: dict[str, _NodeState] = {}

    # ---- processes ---------------------------------------------------------------------------

    def observe(self, obs: ProcessObservation) -> list[AlertEvent] | tuple[AlertEvent, ...]:
        """Take one process observation.

        Args:
            obs: The observation; its labels (user, command, job name, partition) are
                read when the process is first seen or its job id changes.

        Returns:
            Alert events caused by it.
        """
        return self.observe_fields(obs.node, obs.pid, obs.start_time, obs.t, obs.job_id, obs.gpu, obs.rank,
                                   obs.user, obs.command, obs.job_name, obs.partition, obs.gpu_mem_bytes,
                                   obs.gpu_mem_total_bytes, obs.gpu_util, obs.rss_bytes, obs.node_mem_total_bytes,
                                   obs.threads, obs.open_fds, obs.step, allocated=obs.gpu_allocated_bytes,
                                   reserved=obs.gpu_reserved_bytes, retries=obs.gpu_alloc_retries)

    def observe_fields(self, node: str, pid: int, start_time: float, t: float, job_id: str, gpu: str,
                       rank: int | None, user: str, command: str, job_name: str, partition: str, gmem: Any,
                       gtotal: Any, util: Any, rss: Any, ntotal: Any, threads: Any, fds: Any, step: Any,
                       host_full: str = "node memory", *, allocated: Any = None, reserved: Any = None,
                       retries: Any = None) -> list[AlertEvent] | tuple[AlertEvent, ...]:
        """observe() with the observation's fields as arguments, in ProcessObservation's order
        (cpu_percent aside, which no rule reads): the collector calls it for every process of
        every batch, and building an object each time would cost as much as the rules' common path.
        `host_full` names what `ntotal` is, for the alert's text: the collector gives the room left in the
        job's memory allocation where Slurm says it ("the job's memory allocation"), else the node's RAM.
        `allocated`, `reserved`, `retries`: the allocator's figures where the process reports them."""
        key = (node, pid, start_time)
        p = self._procs.get(key)
        if p is None or p.job_id != job_id or p.rank != rank:
            p = self._labels(key, p, t, job_id, gpu, rank, user, command, job_name, partition)
        p.host_full = host_full
        out = self._ingest(p, t, gmem, gtotal, util, rss, ntotal, threads, fds, step, allocated is not None)
        if allocated is not None:
            found = self._allocator(p, t, allocated, reserved, retries, gmem, gtotal)
            if found:
                out = [*out, *found]
        return out

    def observe_mapping(self, d: Mapping[str, Any]) -> list[AlertEvent] | tuple[AlertEvent, ...]:
        """Take one process observation given as a mapping with ProcessObservation's field names.

        This is what `replay` uses: it skips building an object per sample. Missing
        keys read as None (labels as "", start_time as 0.0).

        Args:
            d: The observation (a parsed trace line, for example).

        Returns:
            Alert events caused by it.
        """
        g = d.get
        t = d["t"]
        key = (d["node"], d["pid"], g("start_time", 0.0))
        p = self._procs.get(key)
        job_id = g("job_id", "")
        rank = g("rank")
        if p is None or p.job_id != job_id or p.rank != rank:
            gpu = g("gpu", "")
            p = self._labels(key, p, t, job_id, "" if gpu is None else str(gpu), rank,
                             g("user", ""), g("command", ""), g("job_name", ""), g("partition", ""))
        allocated = g("gpu_allocated_bytes")
        out = self._ingest(p, t, g("gpu_mem_bytes"), g("gpu_mem_total_bytes"), g("gpu_util"), g("rss_bytes"),
                           g("node_mem_total_bytes"), g("threads"), g("open_fds"), g("step"), allocated is not None)
        if allocated is not None:
            found = self._allocator(p, t, allocated, g("gpu_reserved_bytes"), g("gpu_alloc_retries"),
                                    g("gpu_mem_bytes"), g("gpu_mem_total_bytes"))
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
            r = p.rules
            p.gpu_leak = LeakSeries(r.gpu_memory_leak, p.t0) if self._on(p, Rule.GPU_MEMORY_LEAK) else None
            p.alloc_leak = LeakSeries(r.gpu_memory_leak, p.t0) if self._on(p, Rule.GPU_MEMORY_LEAK) else None
            on_f = self._on(p, Rule.GPU_MEMORY_FRAGMENTATION)
            p.frag_leak = LeakSeries(r.gpu_memory_fragmentation, p.t0) if on_f else None
            p.frag_growing = False
            p.host_leak = LeakSeries(r.host_memory_leak, p.t0) if self._on(p, Rule.HOST_MEMORY_LEAK) else None
            on_h = self._on(p, Rule.HANDLE_LEAK)
            p.thr_leak = LeakSeries(r.handle_leak, p.t0) if on_h else None
            p.fd_leak = LeakSeries(r.handle_leak, p.t0) if on_h else None
        else:
            p.silenced = found[1]
        self._guards(p)
        return p

    def _guards(self, p: _Proc) -> None:
        """Recompute the fast-path guards of a process from its state and rules."""
        r = p.rules
        assert r is not None
        gs = r.gpu_stall
        if not gs.enabled or Rule.GPU_STALL in p.silenced:
            p.util_quiet = -math.inf
        elif p.idle_since is None and Rule.GPU_STALL not in p.alerts and (p.seen_busy or not gs.require_busy_first):
            p.util_quiet = gs.util_below_percent
        else:
            p.util_quiet = math.inf
        ts = r.training_stall
        p.step_quiet = p.step_moved and Rule.TRAINING_STALL not in p.alerts
        if Rule.TRAINING_STALL in p.alerts:
            p.step_wait = -math.inf
        elif not ts.enabled or Rule.TRAINING_STALL in p.silenced:
            p.step_wait = math.inf
        else:
            p.step_wait = min(ts.pending_after_s, ts.for_s)

    def _on(self, p: _Proc, rule: str) -> bool:
        return getattr(p.rules, rule).enabled and rule not in p.silenced

    def _ingest(self, p: _Proc, t: float, gmem: Any, gtotal: Any, util: Any, rss: Any, ntotal: Any,
                threads: Any, fds: Any, step: Any, allocator: bool = False
                ) -> list[AlertEvent] | tuple[AlertEvent, ...]:
        # The common cases are inlined, each one or two comparisons: a leak sample inside its
        # open bucket only lowers the bucket's minimum; a busy GPU with no stall pending, and a
        # step that moved with no stall alert, change nothing else. The full logic sits in the
        # methods the slow paths call, which are the only places state changes otherwise.
        out: list[AlertEvent] | None = None
        p.last_t = t
        if util is not None:
            p.last_util = util
        if allocator and not p.alloc_seen:
            p.alloc_seen = True  # from now on the allocator's allocated bytes are what a GPU leak is judged on
            if p.alerts.get(Rule.GPU_MEMORY_LEAK) == FIRING:  # raised on NVML's figure, no longer watched
                r = p.rules.gpu_memory_leak  # type: ignore[union-attr]
                out = [self._event(p, t, Rule.GPU_MEMORY_LEAK, RESOLVED, r.severity,
                                   f"GPU memory of {p.who()}: judged on the allocator's figures from now on",
                                   {"source": "allocator"})]
        s = p.gpu_leak
        if gmem is not None and s is not None and not p.alloc_seen:
            if t < s.b_end:
                if gmem < s.cur_min:
                    s.cur_min = gmem
            else:
                f = s.roll(t, gmem, gtotal)
                if f is not None:
                    out = [self._leak_event(p, Rule.GPU_MEMORY_LEAK, f, "GPU memory", "GPU")]
        s = p.host_leak
        if rss is not None and s is not None:
            if t < s.b_end:
                if rss < s.cur_min:
                    s.cur_min = rss
            else:
                f = s.roll(t, rss, ntotal)
                if f is not None:
                    ev = self._leak_event(p, Rule.HOST_MEMORY_LEAK, f, "Host memory (RSS)", p.host_full)
                    out = [ev] if out is None else [*out, ev]
        if threads is not None and p.thr_leak is not None:
            f = p.thr_leak.add(t, threads)
            if f is not None:
                out = self._handle_event(p, "threads", f, out)
        if fds is not None and p.fd_leak is not None:
            f = p.fd_leak.add(t, fds)
            if f is not None:
                out = self._handle_event(p, "open_fds", f, out)
        if util is not None and util < p.util_quiet:
            out = self._gpu_stall(p, t, util, out)
        if step is not None:
            if step != p.step:
                if p.step_quiet:
                    p.step = step
                    p.step_t = t
                else:
                    out = self._training_stall(p, t, step, util, out)
            elif t - p.step_t >= p.step_wait:
                out = self._training_stall(p, t, step, util, out)
        return _NO_EVENTS if out is None else out

    def _allocator(self, p: _Proc, t: float, allocated: Any, reserved: Any, retries: Any, gmem: Any, gtotal: Any
                   ) -> list[AlertEvent] | None:
        """The allocator's figures: allocated bytes for gpu_memory_leak; reserved minus allocated, with the
        allocation retries, for gpu_memory_fragmentation. The cache (reserved rising in steps, then level,
        allocated flat) raises neither."""
        out: list[AlertEvent] | None = None
        s = p.alloc_leak
        if s is not None:
            # full when allocated reaches what the GPU has beside the process's CUDA context (NVML's figure
            # over the reserve) and the other processes on it are not known: the GPU's size less that
            total = gtotal
            if gtotal is not None and gmem is not None and reserved is not None:
                total = gtotal - max(0, gmem - reserved)
            f = s.add(t, allocated, total)
            if f is not None:
                out = [self._leak_event(p, Rule.GPU_MEMORY_LEAK, f, _ALLOCATED, "GPU")]
        s = p.frag_leak
        if s is None or reserved is None:
            return out
        if retries is not None and (not p.frag_retries or p.frag_retries[-1][1] != retries):
            p.frag_retries.append((t, retries))
            changed = True
        else:
            changed = False
        f = s.add(t, max(0, reserved - allocated), None)
        r = p.rules.gpu_memory_fragmentation  # type: ignore[union-attr]
        if f is not None and not f.firing:
            p.frag_growing = False
            if Rule.GPU_MEMORY_FRAGMENTATION in p.alerts:
                ev = self._event(p, f.t, Rule.GPU_MEMORY_FRAGMENTATION, RESOLVED, r.severity,
                                 f"GPU memory of {p.who()}: the allocator's free cache stopped growing",
                                 _leak_figures(f))
                out = [ev] if out is None else [*out, ev]
            return out
        if f is not None:
            p.frag_growing = True
        if p.frag_growing and Rule.GPU_MEMORY_FRAGMENTATION not in p.alerts and (f is not None or changed):
            cur = f or s.current(t)
            said = _fragmentation_said(p, cur) if cur is not None else None
            if said is not None:
                ev = self._event(p, t, Rule.GPU_MEMORY_FRAGMENTATION, FIRING, r.severity, *said)
                out = [ev] if out is None else [*out, ev]
        return out

    def _event(self, p: _Proc, t: float, rule: str, state: str, severity: str, description: str,
               figures: dict[str, Any]) -> AlertEvent:
        rule = str(rule)  # the plain name: a Rule member's repr would differ in what callers log and keep
        if state == RESOLVED:
            p.alerts.pop(rule, None)
            p.texts.pop(rule, None)
        else:
            p.alerts[rule] = state
            p.texts[rule] = (description, severity, figures)
        if rule == Rule.GPU_STALL or rule == Rule.TRAINING_STALL:
            self._guards(p)
        return AlertEvent(t=t, rule=rule, state=state, severity=severity, node=p.node, job_id=p.job_id,
                          pid=p.pid, start_time=p.start_time, gpu=p.gpu, rank=p.rank,
                          description=description, figures=figures)

    def _leak_event(self, p: _Proc, rule: str, f: LeakFinding, what: str, full: str) -> AlertEvent:
        r = getattr(p.rules, rule)
        figures = _leak_figures(f)
        if what is _ALLOCATED:
            figures["source"] = "allocator"
        if not f.firing:
            desc = f"{what} of {p.who()} stopped growing ({_mb(f.rate_per_h)}/h now)"
            return self._event(p, f.t, rule, RESOLVED, r.severity, desc, figures)
        desc, severity = _leak_text(p, what, full, f, r.severity)
        return self._event(p, f.t, rule, FIRING, severity, desc, figures)

    def _handle_event(self, p: _Proc, series: str, f: LeakFinding, out: list[AlertEvent] | None
                      ) -> list[AlertEvent] | None:
        r = p.rules.handle_leak  # type: ignore[union-attr]
        was = bool(p.handle_firing)
        if f.firing:
            p.handle_firing.add(series)
        else:
            p.handle_firing.discard(series)
        now = bool(p.handle_firing)
        if was == now:
            return out
        figures = {"series": series, "rate_per_h": round(f.rate_per_h, 1), "growth_for_s": round(f.growth_for_s, 1),
                   "level": round(f.level), "window_s": f.window_s}
        noun = "threads" if series == "threads" else "open file descriptors"
        if now:
            desc = _handle_text(p, series, f)
            ev = self._event(p, f.t, Rule.HANDLE_LEAK, FIRING, r.severity, desc, figures)
        else:
            ev = self._event(p, f.t, Rule.HANDLE_LEAK, RESOLVED, r.severity,
                             f"{noun.capitalize()} of {p.who()} stopped growing", figures)
        return [ev] if out is None else [*out, ev]

    def _gpu_stall(self, p: _Proc, t: float, util: float, out: list[AlertEvent] | None
                   ) -> list[AlertEvent] | None:
        r = p.rules.gpu_stall  # type: ignore[union-attr]
        if not r.enabled or Rule.GPU_STALL in p.silenced:
            return out
        if util >= r.util_below_percent:
            if util >= r.busy_percent:
                p.seen_busy = True
            p.idle_since = None
            self._guards(p)
            if Rule.GPU_STALL in p.alerts:
                ev = self._event(p, t, Rule.GPU_STALL, RESOLVED, r.severity,
                                 f"GPU of {p.who()} is busy again ({util:.0f} %)", {"util_percent": util})
                return [ev] if out is None else [*out, ev]
            return out
        p.idle_util = util
        if p.idle_since is None:
            p.idle_since = t
            p.util_quiet = math.inf
        if r.require_busy_first and not p.seen_busy:
            return out
        idle = t - p.idle_since
        state = p.alerts.get(Rule.GPU_STALL)
        new = FIRING if idle >= r.for_s else PENDING if idle >= r.pending_after_s else None
        if new is None or new == state:
            return out
        desc, figures = self._with_cause(p, p.idle_since, t, _gpu_stall_text(p, util, idle),
                                         {"idle_for_s": round(idle, 1), "util_percent": util})
        ev = self._event(p, t, Rule.GPU_STALL, new, r.severity, desc, figures)
        return [ev] if out is None else [*out, ev]

    def _training_stall(self, p: _Proc, t: float, step: int, util: Any, out: list[AlertEvent] | None
                        ) -> list[AlertEvent] | None:
        r = p.rules.training_stall  # type: ignore[union-attr]
        if step != p.step:
            if p.step is not None and not p.step_moved:
                p.step_moved = True
                self._guards(p)
            p.step = step
            p.step_t = t
            if Rule.TRAINING_STALL in p.alerts:
                ev = self._event(p, t, Rule.TRAINING_STALL, RESOLVED, r.severity,
                                 f"Training of {p.who()} advances again (step {step})", {"step": step})
                return [ev] if out is None else [*out, ev]
            return out
        if not p.step_moved or not r.enabled or Rule.TRAINING_STALL in p.silenced:
            return out
        frozen = t - p.step_t
        state = p.alerts.get(Rule.TRAINING_STALL)
        new = FIRING if frozen >= r.for_s else PENDING if frozen >= r.pending_after_s else None
        if new is None or new == state:
            return out
        desc, figures = self._training_stall_said(p, step, frozen, util, t)
        ev = self._event(p, t, Rule.TRAINING_STALL, new, r.severity, desc, figures)
        return [ev] if out is None else [*out, ev]

    # ---- a stall's likely cause ---------------------------------------------------------------

    def _training_stall_said(self, p: _Proc, step: int, frozen: float, util: Any, t: float
                             ) -> tuple[str, dict[str, Any]]:
        figures = {"step": step, "stalled_for_s": round(frozen, 1), "util_percent": util}
        return self._with_cause(p, p.step_t, t, _training_stall_text(p, step, frozen, util), figures)

    def _with_cause(self, p: _Proc, began: float, t: float, desc: str, figures: dict[str, Any]
                    ) -> tuple[str, dict[str, Any]]:
        """A stall's description and figures with its likely cause, where there is one."""
        cause = self._job_cause(p.job_id, began - CAUSE_LOOKBACK_S, t) if p.job_id else None
        if cause is None:
            cause = _causes.hung_collective(self._figures_of(p))
        if cause is None:
            return desc, figures
        if cause.kind == "hung_collective":
            desc = desc.replace(" (hung collective?)", "")
        return f"{desc}; likely cause: {cause.text}", {**figures, **cause.figures}

    def _figures_of(self, p: _Proc) -> RankFigures:
        g = self._gpus.get((p.node, p.gpu)) if p.gpu else None
        return RankFigures(p.rank, p.node, p.pid, p.gpu, p.step, p.last_util,
                           g.power if g is not None else None, g.power_peak if g is not None else None)

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
        for node, st in self._nodes.items():
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
        out = []
        for rule, state in list(p.alerts.items()):
            severity = getattr(p.rules, rule).severity
            if state == FIRING:
                # It did not clear: it stopped being watched, with the figures it had (issue 17, item 6).
                desc, _, figures = self._process_figures(p, rule)
                figures = dict(figures, ended_while_firing=True)
                out.append(self._event(p, t, rule, RESOLVED, severity, f"{desc}; {ENDED_WHILE_FIRING}: "
                                       f"the process is gone", figures))
            else:
                out.append(self._event(p, t, rule, RESOLVED, severity,
                                       f"{rule} of {p.who()} ended: the process is gone", {}))
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
        for gkey, st in list(self._gpus.items()):
            if st.job_id == job_id:
                if st.state == FIRING and st.last is not None:
                    st.state = None
                    out.append(self._idle_gpu_event(st, t, RESOLVED, ended=True))
                else:
                    out += self._gpu_resolve(gkey, st, t, f"job {job_id} ended")
                del self._gpus[gkey]
        return out

    # ---- GPUs and nodes ----------------------------------------------------------------------

    def observe_gpu(self, obs: GpuObservation) -> list[AlertEvent]:
        """Take one GPU observation (for `idle_gpu`).

        Args:
            obs: The observation.

        Returns:
            Alert events caused by it.
        """
        r = self.rules.idle_gpu
        gkey = (obs.node, obs.gpu)
        st = self._gpus.get(gkey)
        if st is None:
            st = self._gpus[gkey] = _GpuState(obs.job_id)
        out: list[AlertEvent] = []
        if st.job_id != obs.job_id:
            out += self._gpu_resolve(gkey, st, obs.t, "allocation changed")
            st.job_id, st.idle_since, st.power_peak = obs.job_id, None, 0.0
        st.power = obs.power_watts
        if obs.power_watts is not None and obs.power_watts > st.power_peak:
            st.power_peak = obs.power_watts
        if not r.enabled:
            return out
        if not obs.job_id:
            return out
        no_procs = obs.processes == 0
        idle = no_procs or (obs.utilization is not None and obs.utilization < r.util_below_percent)
        if not idle:
            out += self._gpu_resolve(gkey, st, obs.t, "in use again")
            st.idle_since = None
            return out
        if st.idle_since is None:
            st.idle_since = obs.t
        st.last = obs
        dur = obs.t - st.idle_since
        new = FIRING if dur >= r.for_s else PENDING if dur >= r.for_s / 2 else None
        if new is not None and new != st.state:
            st.state = new
            out.append(self._idle_gpu_event(st, obs.t, new))
        return out

    def _idle_gpu_event(self, st: _GpuState, t: float, state: str, ended: bool = False) -> AlertEvent:
        """idle_gpu's event for the GPU's latest idle observation, its figures as of then."""
        obs = st.last
        assert obs is not None and st.idle_since is not None
        dur = obs.t - st.idle_since
        why = "has no process" if obs.processes == 0 else f"is idle ({obs.utilization:.0f} %)"
        label = obs.gpu if obs.index is None else f"{obs.index} ({obs.gpu})"
        desc = f"GPU {label} on {obs.node}, allocated to job {obs.job_id}, {why} for {_hours(dur)}"
        figures: dict[str, Any] = {"idle_for_s": round(dur, 1), "processes": obs.processes,
                                   "util_percent": obs.utilization}
        if state != RESOLVED:
            cause = self._job_cause(obs.job_id, st.idle_since - CAUSE_LOOKBACK_S, t)
            if cause is not None:
                desc += f"; likely cause: {cause.text}"
                figures.update(cause.figures)
        if ended:
            desc += f"; {ENDED_WHILE_FIRING}: job {obs.job_id} ended"
            figures["ended_while_firing"] = True
        return AlertEvent(t=t, rule=Rule.IDLE_GPU.value, state=state, severity=self.rules.idle_gpu.severity,
                          node=obs.node, job_id=obs.job_id, gpu=obs.gpu, description=desc, figures=figures)

    def _gpu_resolve(self, gkey: tuple[str, str], st: _GpuState, t: float, why: str) -> list[AlertEvent]:
        if st.state is None:
            return []
        st.state = None
        return [AlertEvent(t=t, rule=Rule.IDLE_GPU.value, state=RESOLVED, severity=self.rules.idle_gpu.severity,
                           node=gkey[0], job_id=st.job_id, gpu=gkey[1],
                           description=f"GPU {gkey[1]} on {gkey[0]}: {why}")]

    def heartbeat(self, hb: NodeHeartbeat) -> list[AlertEvent]:
        """A node's agent reported (for `agent_down`).

        Args:
            hb: The heartbeat.

        Returns:
            A resolved event when the node was down.
        """
        st = self._nodes.get(hb.node)
        if st is None:
            self._nodes[hb.node] = _NodeState(hb.t, hb.has_jobs, 3.0 * hb.every_s, job_ids=hb.job_ids)
            return []
        out: list[AlertEvent] = []
        if st.state is not None:
            out.append(AlertEvent(t=hb.t, rule=Rule.AGENT_DOWN.value, state=RESOLVED,
                                  severity=self.rules.agent_down.severity, node=hb.node,
                                  job_id=st.job_ids[0] if st.job_ids else "",
                                  description=f"Agent on {hb.node} reports again after {_hours(hb.t - st.last_t)}",
                                  figures={"silent_for_s": round(hb.t - st.last_t, 1)}))
            st.state = None
        st.last_t, st.has_jobs, st.silent_after_s = hb.t, hb.has_jobs, 3.0 * hb.every_s
        if hb.job_ids or not hb.has_jobs:
            st.job_ids = hb.job_ids
        return out

    def tick(self, now: float) -> list[AlertEvent]:
        """Let time pass with no new data (raises `agent_down` for silent nodes).

        Args:
            now: Current time, in the same clock as the observations.

        Returns:
            Alert events.
        """
        r = self.rules.agent_down
        if not r.enabled:
            return []
        out = []
        for node, st in self._nodes.items():
            silent = now - st.last_t
            if st.has_jobs and st.state is None and silent >= max(r.after_s, st.silent_after_s):
                st.state = FIRING
                out.append(self._agent_down_event(node, st, now))
        return out

    def _agent_down_event(self, node: str, st: _NodeState, now: float) -> AlertEvent:
        silent = now - st.last_t
        jobs = st.job_ids
        running = (f"job {jobs[0]} runs" if len(jobs) == 1 else
                   f"jobs {', '.join(jobs[:3])}{' …' if len(jobs) > 3 else ''} run" if jobs else "jobs run")
        return AlertEvent(t=now, rule=Rule.AGENT_DOWN.value, state=FIRING, severity=self.rules.agent_down.severity,
                          node=node, job_id=jobs[0] if jobs else "",
                          description=f"Agent on {node} silent for {_hours(silent)} while {running} there",
                          figures={"silent_for_s": round(silent, 1), "last_seen_t": st.last_t,
                                   "job_ids": list(jobs)})

    # ---- figures of the moment -----------------------------------------------------------------

    def refresh(self, now: float) -> list[AlertEvent]:
        """Every alert pending or firing, its text and figures as of the latest observations (agent_down:
        as of `now`), in the state it is in: no transitions.

        The engine speaks on transitions only, so an alert's text would say what held when it fired
        ("for 1 min; full in ~1 h 24 min" six minutes later). The collector applies these to the alerts it
        holds, now and then (collector/alerting.py); `evaluate` and replay never call it.
        """
        out: list[AlertEvent] = []
        for p in self._procs.values():
            for rule, state in p.alerts.items():
                desc, severity, figures = self._process_figures(p, rule)
                out.append(AlertEvent(t=p.last_t, rule=rule, state=state, severity=severity, node=p.node,
                                      job_id=p.job_id, pid=p.pid, start_time=p.start_time, gpu=p.gpu, rank=p.rank,
                                      description=desc, figures=figures))
        for st in self._gpus.values():
            if st.state is not None and st.last is not None:
                out.append(self._idle_gpu_event(st, st.last.t, st.state))
        for node, st in self._nodes.items():
            if st.state is not None:
                out.append(self._agent_down_event(node, st, now))
        return out

    def _process_figures(self, p: _Proc, rule: str) -> tuple[str, str, dict[str, Any]]:
        """(description, severity, figures) of a process's active alert as of its latest observation; what
        was last said where the figures cannot be worked out afresh."""
        said = p.texts.get(rule) or (f"{rule} of {p.who()}", getattr(p.rules, rule).severity, {})
        if rule in (Rule.GPU_MEMORY_LEAK, Rule.HOST_MEMORY_LEAK) and p.alerts.get(rule) == FIRING:
            gpu_what = _ALLOCATED if p.alloc_seen else "GPU memory"
            series = (p.alloc_leak if p.alloc_seen else p.gpu_leak) if rule == Rule.GPU_MEMORY_LEAK else p.host_leak
            f = series.current(p.last_t) if series is not None else None
            if f is None:
                return said
            what, full = ((gpu_what, "GPU") if rule == Rule.GPU_MEMORY_LEAK
                          else ("Host memory (RSS)", p.host_full))
            desc, severity = _leak_text(p, what, full, f, getattr(p.rules, rule).severity)
            figures = _leak_figures(f)
            if what is _ALLOCATED:
                figures["source"] = "allocator"
            return desc, severity, figures
        if rule == Rule.GPU_MEMORY_FRAGMENTATION and p.frag_leak is not None:
            f = p.frag_leak.current(p.last_t)
            now_said = _fragmentation_said(p, f, rose_only=False) if f is not None else None
            return (now_said[0], said[1], now_said[1]) if now_said is not None else said
        if rule == Rule.HANDLE_LEAK and p.alerts.get(rule) == FIRING:
            for name, series in (("threads", p.thr_leak), ("open_fds", p.fd_leak)):
                f = series.current(p.last_t) if series is not None and name in p.handle_firing else None
                if f is not None:
                    figures = {"series": name, "rate_per_h": round(f.rate_per_h, 1),
                               "growth_for_s": round(f.growth_for_s, 1), "level": round(f.level),
                               "window_s": f.window_s}
                    return _handle_text(p, name, f), said[1], figures
            return said
        if rule == Rule.TRAINING_STALL and p.step is not None:
            desc, figures = self._training_stall_said(p, p.step, p.last_t - p.step_t, p.last_util, p.last_t)
            return desc, said[1], figures
        if rule == Rule.GPU_STALL and p.idle_since is not None and p.idle_util is not None:
            idle = p.last_t - p.idle_since
            desc, figures = self._with_cause(p, p.idle_since, p.last_t, _gpu_stall_text(p, p.idle_util, idle),
                                             {"idle_for_s": round(idle, 1), "util_percent": p.idle_util})
            return desc, said[1], figures
        return said

    def forget_node(self, node: str, t: float) -> list[AlertEvent]:
        """Stop watching a node (drained or removed), resolving its agent_down alert.

        Args:
            node: Node name.
            t: Time.

        Returns:
            Resolved events.
        """
        st = self._nodes.pop(node, None)
        if st is None or st.state is None:
            return []
        return [AlertEvent(t=t, rule=Rule.AGENT_DOWN.value, state=RESOLVED, severity=self.rules.agent_down.severity,
                           node=node, description=f"{node} is no longer watched")]

    def series(self) -> set[tuple[str, int, float]]:
        """Processes the engine holds state for: (node, pid, start_time)."""
        return set(self._procs)

    def active(self) -> list[tuple[str, str, str, int, float]]:
        """Alerts now pending or firing about processes: (rule, state, node, pid, start_time)."""
        return [(rule, state, p.node, p.pid, p.start_time)
                for p in self._procs.values() for rule, state in p.alerts.items()]


def _leak_figures(f: LeakFinding) -> dict[str, Any]:
    return {"rate_bytes_per_h": round(f.rate_per_h), "growth_for_s": round(f.growth_for_s, 1),
            "time_to_full_s": None if f.time_to_full_s is None else round(f.time_to_full_s),
            "level_bytes": round(f.level), "window_s": f.window_s}


#: What a GPU leak judged on the allocator's figures is said to be (compared by identity in the engine).
_ALLOCATED = "Allocated tensors"


def _fragmentation_said(p: _Proc, f: LeakFinding, rose_only: bool = True) -> tuple[str, dict[str, Any]] | None:
    """gpu_memory_fragmentation's text and figures: the free cache's growth, with the retries over its span;
    None (with `rose_only`) while the retries have not risen over it (a cache that grows is no fault)."""
    hist = p.frag_retries
    if not hist:
        return None
    start = f.t - f.growth_for_s
    before = hist[0][1]
    for t, n in hist:
        if t > start:
            break
        before = n
    now = hist[-1][1]
    if rose_only and now <= before:
        return None
    desc = (f"GPU memory of {p.who()} fragments: reserved minus allocated grows {_mb(f.rate_per_h)}/h for "
            f"{_hours(f.growth_for_s)} (now {_mb(f.level)}) while allocation retries rose from {before} to {now}; "
            f"try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    figures = {**_leak_figures(f), "alloc_retries": now, "alloc_retries_before": before, "source": "allocator"}
    return desc, figures


def _leak_text(p: _Proc, what: str, full: str, f: LeakFinding, severity: str) -> tuple[str, str]:
    """A firing leak's description and severity (critical when full within two hours)."""
    if what is _ALLOCATED:
        desc = (f"GPU memory of {p.who()}: allocated tensors grow {_mb(f.rate_per_h)}/h for "
                f"{_hours(f.growth_for_s)} (the allocator's figure, its cache aside)")
    else:
        desc = f"{what} of {p.who()} grows {_mb(f.rate_per_h)}/h for {_hours(f.growth_for_s)}"
    if f.time_to_full_s is not None:
        desc += f"; {full} full in ~{_hours(f.time_to_full_s)}"
        if f.time_to_full_s < 2 * 3600:
            severity = "critical"
    return desc, severity


def _handle_text(p: _Proc, series: str, f: LeakFinding) -> str:
    noun = "Threads" if series == "threads" else "Open file descriptors"
    return f"{noun} of {p.who()} grow {f.rate_per_h:.0f}/h for {_hours(f.growth_for_s)} (now {f.level:.0f})"


def _gpu_stall_text(p: _Proc, util: float, idle: float) -> str:
    return f"GPU of {p.who()} idle ({util:.0f} %) for {_hours(idle)} while the process runs"


def _training_stall_text(p: _Proc, step: int, frozen: float, util: Any) -> str:
    busy = f", GPU at {util:.0f} % (hung collective?)" if util is not None and util >= 50 else ""
    return f"Training of {p.who()} stuck at step {step} for {_hours(frozen)}{busy}"


def evaluate(rules: RuleSet, observations: Iterable[ProcessObservation | GpuObservation | NodeHeartbeat]
             ) -> list[AlertEvent]:
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
        else:
            out += eng.tick(o.t)
            out += eng.heartbeat(o)
    return out
