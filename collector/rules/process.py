"""What the process rules share: the record of one process, how a rule speaks about it, and their words.

Each process rule (memory_leak.py, handle_leak.py, fragmentation.py, gpu_stall.py, training_stall.py)
declares the few fields of its own state (`SLOTS`) and keeps them on the one `Proc` record the engine
holds for a process: one object a process, no lookup between a sample and the fields the engine's
fast path compares.
"""
from __future__ import annotations

import math
from typing import Any, Protocol

from clusterwatch.humanize import duration, size

from .config import RuleSet
from .leak import LeakFinding
from .model import FIRING, PENDING, RESOLVED, AlertEvent

#: Said of an alert whose process (or job) ended while it fired: its figures are the last ones, and it
#: did not clear (a leak that ends with its process is what an out-of-memory kill looks like).
ENDED_WHILE_FIRING = "ended while firing"

#: The fields of a process every rule reads (identity, labels, its alerts); each rule adds its own.
BASE_SLOTS = ("node", "pid", "start_time", "job_id", "gpu", "rank", "user", "command", "job_name", "partition",
              "rules", "silenced", "alerts", "texts", "t0", "last_t", "last_util", "host_full",
              "util_quiet", "step_quiet", "step_wait", "step", "step_t")


def hours(seconds: float) -> str:
    """A duration in alert text: the one format of clusterwatch.humanize (the CLI's notes use it too)."""
    return duration(seconds)


def mb(b: float) -> str:
    """A size in alert text, in IEC units as the CLI's tables (the rules compute in MiB)."""
    return size(b)


def leak_figures(f: LeakFinding) -> dict[str, Any]:
    """The figures of a leak finding, as an alert carries them."""
    return {"rate_bytes_per_h": round(f.rate_per_h), "growth_for_s": round(f.growth_for_s, 1),
            "time_to_full_s": None if f.time_to_full_s is None else round(f.time_to_full_s),
            "level_bytes": round(f.level), "window_s": f.window_s}


def stall_turn(p: Proc, rule: str, held: float, for_s: float, pending_after_s: float) -> str | None:
    """A stall rule's new state for a condition held `held` seconds: FIRING past `for_s`, PENDING past
    `pending_after_s`; None while it stays as it is."""
    new = FIRING if held >= for_s else PENDING if held >= pending_after_s else None
    return None if new == p.alerts.get(rule) else new


class Proc:
    """Everything the engine remembers about one process: the base fields here, each rule's in its SLOTS
    (the engine's subclass declares them all)."""

    __slots__ = ()
    #: The rules whose alert state a fast-path guard reads (the engine's subclass names them).
    GUARDED: frozenset[str] = frozenset()

    node: str
    pid: int
    start_time: float
    job_id: str
    gpu: str
    rank: int | None
    user: str
    command: str
    job_name: str
    partition: str
    rules: RuleSet | None
    silenced: frozenset[str]
    alerts: dict[str, str]  # rule → PENDING | FIRING
    texts: dict[str, tuple[str, str, dict[str, Any]]]  # rule → (description, severity, figures) as last said
    t0: float
    last_t: float  # the latest observation's time: what refreshed figures are as of
    last_util: float | None  # the latest utilisation (training_stall's text)
    host_full: str  # what the host total given is: the node's RAM, or the job's allocation
    # Fast-path guards (see Engine._ingest), each kept true to its rule's state by that rule's `guard`:
    # utilisation at or above `util_quiet` changes nothing; with `step_quiet`, a new step only moves the
    # step; a repeated step changes nothing until `step_wait` has passed.
    util_quiet: float
    step_quiet: bool
    step_wait: float
    step: int | None  # the step the process last reported, and since when (a stall's cause reads it too)
    step_t: float

    def __init__(self, node: str, pid: int, start_time: float, t0: float) -> None:
        self.node = node
        self.pid = pid
        self.start_time = start_time
        self.t0 = t0
        self.job_id = ""
        self.gpu = ""
        self.rank = None
        self.user = self.command = self.job_name = self.partition = ""
        self.rules = None
        self.silenced = frozenset()
        self.alerts = {}
        self.texts = {}
        self.last_t = t0
        self.last_util = None
        self.host_full = "node memory"
        self.util_quiet = math.inf
        self.step_quiet = False
        self.step_wait = 0.0
        self.step = None
        self.step_t = 0.0

    def who(self) -> str:
        """The process in alert text: its rank where known, its pid, node and job."""
        where = f"pid {self.pid} on {self.node}"
        if self.rank is not None:
            return f"rank {self.rank} ({where}, job {self.job_id or '?'})"
        return f"{where} (job {self.job_id or '?'})"

    def on(self, rule: str) -> bool:
        """Whether the rule watches this process: enabled in its rule set, and not silenced for it."""
        return getattr(self.rules, rule).enabled and rule not in self.silenced

    def event(self, t: float, rule: str, state: str, severity: str, description: str,
              figures: dict[str, Any]) -> AlertEvent:
        """The rule's event about this process, its alert state kept (and the fast-path guards with it)."""
        rule = str(rule)  # the plain name: a Rule member's repr would differ in what callers log and keep
        if state == RESOLVED:
            self.alerts.pop(rule, None)
            self.texts.pop(rule, None)
        else:
            self.alerts[rule] = state
            self.texts[rule] = (description, severity, figures)
        if rule in self.GUARDED:
            self.guard()
        return AlertEvent(t=t, rule=rule, state=state, severity=severity, node=self.node, job_id=self.job_id,
                          pid=self.pid, start_time=self.start_time, gpu=self.gpu, rank=self.rank,
                          description=description, figures=figures)

    def guard(self) -> None:
        """Recompute the fast-path guards from the rules' state (the engine's subclass: each rule's `guard`)."""


class Causes(Protocol):
    """What a stall rule asks the engine: its likely cause, from the job's other ranks, GPUs and nodes."""

    def with_cause(self, p: Proc, began: float, t: float, desc: str, figures: dict[str, Any]
                   ) -> tuple[str, dict[str, Any]]:
        """A stall's description and figures with its likely cause, where there is one."""
        ...
