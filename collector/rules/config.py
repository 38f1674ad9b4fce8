"""Rules as typed, frozen data, built from a TOML rules file.

`load_rules(path)` and `parse_rules(text, source)` validate the whole file once and
return a `RuleSet`; an unknown key, a wrong type or a bad pattern raises
`ConfigError` naming the file, the line and what is wrong (clusterwatch/toml_file.py). The
file's schema (which key sets which field, in which unit) is declared below the dataclasses and
checked by clusterwatch/toml_schema.py. Units in the file are the ones people think in (MB,
MB/h, seconds, percent); the dataclasses hold base units (bytes, bytes/h).
docs/rules.md documents every key and default.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import math
import re
import signal
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from clusterwatch import toml_file
from clusterwatch.toml_schema import (
    ArrayOf,
    Bool,
    Converted,
    Invalid,
    Key,
    Number,
    Strings,
    Table,
    Text,
    Value,
    is_number,
    keys_of,
)

from .model import RULE_NAMES

MB = 1024 * 1024
SEVERITIES = ("info", "warning", "critical")


@dataclass(frozen=True, slots=True)
class LeakWindow:
    """One look-back window of a leak rule.

    Attributes:
        window_s: Length of the window in seconds.
        min_rate_per_h: Least growth rate (series units per hour) this window fires on;
            short windows demand fast growth, long ones catch slow leaks.
    """

    window_s: float
    min_rate_per_h: float


@dataclass(frozen=True, slots=True)
class LeakRule:
    """Sustained growth of one series (GPU memory, RSS, or handle counts).

    Attributes:
        enabled: Whether the rule runs.
        severity: Severity of its alerts.
        min_rate_per_h: Least growth rate that counts as a leak (series units per hour).
        min_growth: Least total growth over a window (series units): tiny drifts are no leak.
        warmup_s: Samples this soon after a process first appears are ignored
            (the caching allocator grows in steps while it warms up).
        bucket_s: Samples are reduced to the minimum per bucket of this many seconds,
            which ignores short spikes (checkpoints, evaluation) and makes the rule
            independent of the poll interval.
        windows: Look-back windows, each with its own rate floor.
        sub_buckets: Points a window is reduced to (at least 6; each needs a sample).
        min_t_stat: Least slope / standard error of the slope (noise guard), for the longest
            window; shorter ones need more, for as few false alarms an hour (they come round more often).
        min_mk_z: Least Mann–Kendall score of the window's bucket minima (a rank test of
            rising order that needs no noise scale: a second, independent noise guard).
        rise_fraction: Each third of the window must sit above the previous third by
            this fraction of the rise the slope predicts (growth is sustained, not one step).
        max_jump_fraction: A window whose two consecutive point increments carry more than this
            fraction of its growth is tested for one step (two flat levels that fit its bucket
            minima better than a leak does); 0 tests every window.
        urgent_time_to_full_s: When the series would be full sooner than this, every
            window fires at `min_rate_per_h` (a fast leak near the limit fires early).
        resolve_fraction: A firing leak resolves when the slope over its window falls
            below this fraction of that window's rate floor.
        bend_ratio: A window whose last third rose clearly less than this fraction of what its
            middle third rose (medians; clearly: beyond the noise) is bending over, a warm-up's
            tail, not a leak; 0 turns the test off.
    """

    enabled: bool = True
    severity: str = "warning"
    min_rate_per_h: float = 50 * MB
    min_growth: float = 32 * MB
    warmup_s: float = 1800.0
    bucket_s: float = 60.0
    # Windows from 15 min to 8 h: the noise decides which fires first (a slope's standard error
    # falls as the window's length to the power 1.5), the floors keep short windows to fast growth.
    # Past 45 min a window every 1.5x or so: a leak fires about when the next window up fills.
    windows: tuple[LeakWindow, ...] = (
        LeakWindow(900.0, 500 * MB),
        LeakWindow(1200.0, 100 * MB),
        LeakWindow(1800.0, 70 * MB),
        LeakWindow(2700.0, 50 * MB),
        LeakWindow(4500.0, 50 * MB),
        LeakWindow(7200.0, 50 * MB),
        LeakWindow(10800.0, 50 * MB),
        LeakWindow(14400.0, 50 * MB),
        LeakWindow(21600.0, 50 * MB),
        LeakWindow(28800.0, 50 * MB),
    )
    sub_buckets: int = 12
    min_t_stat: float = 4.0
    min_mk_z: float = 3.5
    rise_fraction: float = 0.25
    max_jump_fraction: float = 0.0
    urgent_time_to_full_s: float = 6 * 3600.0
    resolve_fraction: float = 0.5
    bend_ratio: float = 0.8


@dataclass(frozen=True, slots=True)
class GpuStallRule:
    """A process's GPU sits idle while the process lives on.

    Attributes:
        enabled: Whether the rule runs.
        severity: Severity of its alerts.
        util_below_percent: Utilisation under this is idle.
        for_s: Idle this long fires (longer than a checkpoint save).
        pending_after_s: Idle this long raises a pending alert.
        require_busy_first: Only a process seen busy before can stall (a helper
            process that never computes is not a stall).
        busy_percent: Utilisation at or above this counts as busy.
    """

    enabled: bool = True
    severity: str = "critical"
    util_below_percent: float = 5.0
    for_s: float = 360.0
    pending_after_s: float = 120.0
    require_busy_first: bool = True
    busy_percent: float = 20.0


@dataclass(frozen=True, slots=True)
class TrainingStallRule:
    """The training step a process reports stops advancing (also at ~100 % utilisation).

    Attributes:
        enabled: Whether the rule runs.
        severity: Severity of its alerts.
        for_s: No new step for this long fires.
        pending_after_s: No new step for this long raises a pending alert.
        take_stacks: When it fires, the collector takes the job's Python stacks once (through the agents' py-spy,
            collector/alerting/stall_stacks.py) and adds the grouped summary to the alert. The file's top level only: it
            is the collector's, not a process's, so overrides do not take it.
    """

    enabled: bool = True
    severity: str = "critical"
    for_s: float = 360.0
    pending_after_s: float = 120.0
    take_stacks: bool = True


@dataclass(frozen=True, slots=True)
class IdleGpuRule:
    """A GPU allocated to a job has no process on it, or stays idle.

    Attributes:
        enabled: Whether the rule runs.
        severity: Severity of its alerts.
        util_below_percent: Utilisation under this is idle (a GPU without GPM).
        sm_active_below_percent: SM activity (NVML GPM) under this is idle whatever the utilisation says: a
            kernel that spins on a few SMs (a collective waiting) reads 100 % utilisation. Where the GPU offers
            GPM, this decides and utilisation is not read.
        for_s: Idle (or without processes) this long fires.
    """

    enabled: bool = True
    severity: str = "warning"
    util_below_percent: float = 5.0
    sm_active_below_percent: float = 5.0
    for_s: float = 1800.0


@dataclass(frozen=True, slots=True)
class AgentDownRule:
    """A node's agent has not reported for a while although jobs run there.

    Attributes:
        enabled: Whether the rule runs.
        severity: Severity of its alerts.
        after_s: Silence this long fires (several poll intervals).
    """

    enabled: bool = True
    severity: str = "critical"
    after_s: float = 60.0


@dataclass(frozen=True, slots=True)
class CodeMismatchRule:
    """Ranks of one job run different code (raised by the collector from provenance).

    Attributes:
        enabled: Whether the rule runs.
        severity: Severity of its alerts.
    """

    enabled: bool = True
    severity: str = "warning"


@dataclass(frozen=True, slots=True)
class JobSlowdownRule:
    """A job's throughput fell against its own steady baseline, for a while (rules/job_slowdown.py).

    Attributes:
        enabled: Whether the rule runs.
        severity: Severity of its alerts.
        drop_percent: A rate this far below the baseline is slow.
        for_s: Slow over this long fires (a window longer than an evaluation phase or a checkpoint save).
        low_fraction: And at least this share of the window's buckets each slow: a pause of minutes is not.
        bucket_s: The rate is measured over buckets this long.
        baseline_s: The baseline is the median bucket rate over this long before the window.
        warmup_s: A job's first seconds set no baseline (data-loader and compile warm-up).
        gpu_share: A GPU whose clocks were held down at least this share of the window, the job's other GPUs
            not, stands out and names the cause; held down twice this share, it raises the alert for a job
            without training reports (judged from its GPUs alone).
    """

    enabled: bool = True
    severity: str = "warning"
    drop_percent: float = 20.0
    for_s: float = 600.0
    low_fraction: float = 0.7
    bucket_s: float = 60.0
    baseline_s: float = 1800.0
    warmup_s: float = 600.0
    gpu_share: float = 0.25


def _default_handle_rule() -> LeakRule:
    return LeakRule(
        min_rate_per_h=30.0,
        min_growth=50.0,
        warmup_s=600.0,
        # Half-minute buckets: a count has no noise to wait out, so a leak is told a bucket or two past a
        # pool's spin-up (handle_leak.BURST_S); the longest window is how far back a slow leak's start is kept.
        bucket_s=30.0,
        windows=(LeakWindow(1800.0, 100.0), LeakWindow(3600.0, 50.0), LeakWindow(14400.0, 30.0)),
        urgent_time_to_full_s=0.0,
    )


@dataclass(frozen=True, slots=True)
class Pattern:
    """A glob (default) or, with a `re:` prefix, a regular expression (searched)."""

    text: str
    regex: re.Pattern[str] | None = None

    def matches(self, value: str) -> bool:
        """Whether `value` matches the pattern."""
        if self.regex is not None:
            return self.regex.search(value) is not None
        return fnmatch.fnmatchcase(value, self.text)


@dataclass(frozen=True, slots=True)
class Match:
    """Which processes an override or allow entry applies to; every given field must match.

    Attributes:
        job_name, user, partition, command: Patterns, None where not constrained.
    """

    job_name: Pattern | None = None
    user: Pattern | None = None
    partition: Pattern | None = None
    command: Pattern | None = None

    def matches(self, job_name: str, user: str, partition: str, command: str) -> bool:
        """Whether a process with these labels matches."""
        for pat, value in ((self.job_name, job_name), (self.user, user),
                           (self.partition, partition), (self.command, command)):
            if pat is not None and not pat.matches(value):
                return False
        return True


@dataclass(frozen=True, slots=True)
class Override:
    """Changed thresholds for matching processes.

    Attributes:
        match: Which processes.
        changes: Rule name → field name → new value (base units).
    """

    match: Match
    changes: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]


@dataclass(frozen=True, slots=True)
class AllowEntry:
    """Silences rules for matching processes (known, accepted behaviour).

    Attributes:
        match: Which processes.
        rules: Rule names silenced.
        reason: Why, for the people who read the file.
    """

    match: Match
    rules: tuple[str, ...]
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ActionStep:
    """One step of the escalation chain.

    Attributes:
        action: "log", "webhook", "command", "signal" or "drain" (the alert's node, through scontrol).
        after_s: Run once the alert has been firing this long (0: when it fires).
        rules: Rule names it applies to (empty: all).
        min_severity: Least severity it applies to.
        url: Webhook URL.
        command: Command (argv list) run with the alert JSON on stdin.
        signal: Signal name for the signal action (e.g. "SIGUSR1").
        timeout_s: Time limit of a webhook or command.
        on_resolved: Also run when the alert resolves (log, webhook, command).
    """

    action: str
    after_s: float = 0.0
    rules: tuple[str, ...] = ()
    min_severity: str = "info"
    url: str = ""
    command: tuple[str, ...] = ()
    signal: str = "SIGUSR1"
    timeout_s: float = 10.0
    on_resolved: bool = True


@dataclass(frozen=True, slots=True)
class ActionsConfig:
    """What happens when alerts fire.

    Attributes:
        steps: The escalation chain, in order.
        allow_signals: Signals are sent only when this is true (off by default).
    """

    steps: tuple[ActionStep, ...] = (ActionStep(action="log"),)
    allow_signals: bool = False


@dataclass(frozen=True, slots=True)
class Escalation:
    """One escalation of the rules file (collector/health/offenders.py): `count` of `what` on one GPU (or
    node) within `within_s` raises an alert; or, with `in_every_job`, `what` on the GPU in each of the last
    `in_every_job` jobs that held it (collector/health/gpu_jobs.py).

    Attributes:
        on: "gpu" or "node": whose history is counted.
        what: a health rule's findings (gpu_xid, gpu_lost, ...) or "drain" (the collector's drains of a node).
        count: how many within the window raise it (required without in_every_job).
        within_s: the window, seconds (required without in_every_job).
        in_every_job: N: each of the GPU's last N finished jobs had `what` on it (0: off; on = "gpu" only).
        xid: with gpu_xid, only this XID (0: any).
        severity: the alert's severity.
        advice: what to do, said in the alert ("replace the GPU", "take the node out").
    """

    on: str
    what: str
    count: int = 0
    within_s: float = 0.0
    in_every_job: int = 0
    xid: int = 0
    severity: str = "critical"
    advice: str = ""


@dataclass(frozen=True, slots=True)
class RuleSet:
    """Every rule with its parameters, overrides, allow-list and actions."""

    gpu_memory_leak: LeakRule = field(default_factory=LeakRule)
    host_memory_leak: LeakRule = field(default_factory=LeakRule)
    gpu_stall: GpuStallRule = field(default_factory=GpuStallRule)
    training_stall: TrainingStallRule = field(default_factory=TrainingStallRule)
    idle_gpu: IdleGpuRule = field(default_factory=IdleGpuRule)
    agent_down: AgentDownRule = field(default_factory=AgentDownRule)
    handle_leak: LeakRule = field(default_factory=_default_handle_rule)
    # reserved minus allocated (the allocator's figures) growing while allocation retries rise
    gpu_memory_fragmentation: LeakRule = field(default_factory=LeakRule)
    code_mismatch: CodeMismatchRule = field(default_factory=CodeMismatchRule)
    job_slowdown: JobSlowdownRule = field(default_factory=JobSlowdownRule)
    overrides: tuple[Override, ...] = ()
    allow: tuple[AllowEntry, ...] = ()
    actions: ActionsConfig = field(default_factory=ActionsConfig)
    escalations: tuple[Escalation, ...] = ()

    def for_process(self, job_name: str, user: str, partition: str, command: str
                    ) -> tuple[RuleSet, frozenset[str]]:
        """The rules that apply to one process, and the rule names silenced for it.

        Overrides apply in file order (a later one wins on the same field).

        Args:
            job_name: Slurm job name.
            user: User name.
            partition: Slurm partition.
            command: Command line.

        Returns:
            (rules with overrides applied, names of allow-listed rules).
        """
        rules = self
        for ov in self.overrides:
            if ov.match.matches(job_name, user, partition, command):
                for rule_name, changes in ov.changes:
                    rules = dataclasses.replace(
                        rules, **{rule_name: dataclasses.replace(getattr(rules, rule_name), **dict(changes))})
        silenced = frozenset(
            r for entry in self.allow if entry.match.matches(job_name, user, partition, command)
            for r in entry.rules)
        return rules, silenced


# ---- the rules file's schema -----------------------------------------------------------------
# Which file key sets which field, in which unit, and what it may hold; toml_schema checks a
# parsed file against it and builds the dataclasses above.

_MATCH_KEYS = ("job_name", "user", "partition", "command")
_ACTION_KINDS = ("log", "webhook", "command", "checkpoint", "stop", "signal", "drain")
_DEFAULTS = RuleSet()


def _pattern(value: Any) -> Pattern:
    if not isinstance(value, str):
        raise ValueError(f"must be a string pattern, not {value!r}")
    if value.startswith("re:"):
        try:
            return Pattern(value, re.compile(value[3:]))
        except re.error as exc:
            raise ValueError(f"is a bad regular expression {value[3:]!r}: {exc}") from None
    return Pattern(value)


def _windows(scale: float, rate_unit: str) -> Converted:
    """[[window_s, min rate in file units], ...] → LeakWindows in base units, shortest first."""
    def convert(value: Any) -> tuple[LeakWindow, ...]:
        if not isinstance(value, list) or not value or not all(
                isinstance(w, list) and len(w) == 2 and all(is_number(x) and not math.isnan(x) for x in w)
                for w in value):
            raise ValueError(f"must be a list of [window_s, min {rate_unit}] pairs")
        if any(w[0] <= 0 for w in value):
            raise ValueError("must hold positive window lengths")
        if any(w[1] < 0 for w in value):
            raise ValueError("must not hold negative rates")
        wins = (LeakWindow(float(w[0]), float(w[1]) * scale) for w in value)
        return tuple(sorted(wins, key=lambda w: w.window_s))
    return Converted(convert)


_SEVERITY = {"severity": Text(SEVERITIES)}
_RULE_NAMES = Strings("a list of rule names", RULE_NAMES, "rule")
_LEAK_VALUES: dict[str, Value] = {**_SEVERITY, "sub_buckets": Number(integer=True, at_least=6)}
_RULE_KEYS: dict[str, dict[str, Key]] = {
    # Memory leak rules take MB in the file; the handle rule counts handles.
    "gpu_memory_leak": keys_of(LeakRule, _LEAK_VALUES, renamed={
        "min_rate_per_h": ("min_rate_mb_per_h", Number(scale=MB)),
        "min_growth": ("min_growth_mb", Number(scale=MB)),
        "windows": ("windows", _windows(MB, "MB/h"))}),
    "handle_leak": keys_of(LeakRule, {**_LEAK_VALUES, "windows": _windows(1.0, "per h")}),
    "gpu_stall": keys_of(GpuStallRule, _SEVERITY),
    "training_stall": keys_of(TrainingStallRule, _SEVERITY),
    "idle_gpu": keys_of(IdleGpuRule, _SEVERITY),
    "agent_down": keys_of(AgentDownRule, _SEVERITY),
    "code_mismatch": keys_of(CodeMismatchRule, _SEVERITY),
    "job_slowdown": keys_of(JobSlowdownRule, _SEVERITY),
}
_RULE_KEYS["host_memory_leak"] = _RULE_KEYS["gpu_memory_fragmentation"] = _RULE_KEYS["gpu_memory_leak"]
_MATCH = {k: Key(k, Converted(_pattern)) for k in _MATCH_KEYS}


def _needs_match(values: dict[str, Any]) -> None:
    if not any(k in values for k in _MATCH_KEYS):
        raise Invalid(f"needs at least one of {', '.join(_MATCH_KEYS)}")


def _match_of(values: dict[str, Any]) -> Match:
    return Match(**{k: v for k, v in values.items() if k in _MATCH_KEYS})


def _rule_table(name: str) -> Table:
    """A rule's table at the top level: the shipped rule with the file's changes."""
    return Table(_RULE_KEYS[name], build=lambda changes: dataclasses.replace(getattr(_DEFAULTS, name), **changes))


# what an override may change: a rule's keys, less those the collector acts on once for a job (not per process)
_OVERRIDE_KEYS = {**_RULE_KEYS, "training_stall": {k: v for k, v in _RULE_KEYS["training_stall"].items()
                                                   if k != "take_stacks"}}
_OVERRIDE = Table(
    {**_MATCH, **{name: Key(name, Table(keys)) for name, keys in _OVERRIDE_KEYS.items()}},
    # changes in file order: a later override wins on the same field
    build=lambda v: Override(_match_of(v), tuple((k, tuple(ch.items())) for k, ch in v.items()
                                                 if k not in _MATCH_KEYS)),
    checks=(_needs_match,))
_ALLOW = Table(
    {**_MATCH, "rules": Key("rules", _RULE_NAMES, needs='["rule_name", ...]'), "reason": Key("reason", Text())},
    build=lambda v: AllowEntry(_match_of(v), v["rules"], v.get("reason", "")),
    checks=(_needs_match,))


def _step_checks(step: dict[str, Any]) -> None:
    kind = step["action"]
    if kind == "webhook" and not step.get("url", "").startswith(("http://", "https://")):
        raise Invalid('a webhook needs url = "http://..." or "https://..."', key="url")
    if kind == "command" and not step.get("command"):
        raise Invalid('a command action needs command = ["prog", "arg", ...]', key="action")
    if kind == "signal" and step.get("signal", "SIGUSR1") not in signal.Signals.__members__:
        raise Invalid(f"unknown signal {step['signal']!r} (a name such as SIGUSR1, SIGUSR2, SIGTERM)",
                      key="signal")


_STEP = Table(
    {**keys_of(ActionStep, {"rules": _RULE_NAMES, "min_severity": Text(SEVERITIES),
                            "command": Strings("a non-empty list of strings (argv)", non_empty=True)}),
     "action": Key("action", Text(_ACTION_KINDS),
                   needs='"log", "webhook", "command", "checkpoint", "stop", "signal" or "drain"')},
    build=lambda v: ActionStep(**v), checks=(_step_checks,))
_ACTIONS = Table({"allow_signals": Key("allow_signals", Bool()), "steps": Key("steps", ArrayOf(_STEP))},
                 build=lambda v: dataclasses.replace(_DEFAULTS.actions, **v))
def _escalation_checks(e: dict[str, Any]) -> None:
    if e["on"] == "gpu" and e["what"] == "drain":
        raise Invalid('drains are of a node: on = "node"', key="on")
    if e.get("xid") and e["what"] != "gpu_xid":
        raise Invalid('xid counts with what = "gpu_xid" only', key="xid")
    if "in_every_job" in e:
        _every_job_checks(e)
        return
    for key in ("count", "within_s"):
        if key not in e:
            raise Invalid(f"needs {key} (or in_every_job = N)", key=key)


#: The most jobs in_every_job looks back over: the GPU job history keeps some 30 a GPU at its row bound.
MAX_EVERY_JOB = 20


def _every_job_checks(e: dict[str, Any]) -> None:
    if e["on"] != "gpu":
        raise Invalid('in_every_job counts the jobs that held a GPU: on = "gpu"', key="on")
    if e["what"] in ("drain", "fabric_port", "nvswitch_sxid"):
        raise Invalid("in_every_job counts a GPU's own findings: what = gpu_xid, gpu_lost, gpu_memory_errors, "
                      "gpu_throttle or gpu_link_errors", key="what")
    if not 1 <= e["in_every_job"] <= MAX_EVERY_JOB:
        raise Invalid(f"in_every_job must be a whole number of jobs from 1 to {MAX_EVERY_JOB}", key="in_every_job")
    for key in ("count", "within_s"):
        if key in e:
            raise Invalid(f"in_every_job counts jobs, not findings in a window: drop {key}", key=key)


_ESCALATION = Table(
    keys_of(Escalation, {"on": Text(("gpu", "node")), "severity": Text(SEVERITIES),
                         "what": Text(("gpu_xid", "gpu_lost", "gpu_memory_errors", "gpu_throttle", "gpu_link_errors",
                                       "fabric_port", "nvswitch_sxid", "drain")),
                         "count": Number(integer=True, at_least=1), "within_s": Number(at_least=1),
                         "in_every_job": Number(integer=True)}),
    build=lambda v: Escalation(**v), checks=(_escalation_checks,))
RULES_FILE = Table(
    {**{name: Key(name, _rule_table(name)) for name in _RULE_KEYS},
     "overrides": Key("overrides", ArrayOf(_OVERRIDE)), "allow": Key("allow", ArrayOf(_ALLOW)),
     "actions": Key("actions", _ACTIONS), "escalations": Key("escalations", ArrayOf(_ESCALATION))},
    build=lambda v: dataclasses.replace(_DEFAULTS, **v), noun="table")


# ---- loading ---------------------------------------------------------------------------------

def parse_rules(text: str, source: str = "<rules>") -> RuleSet:
    """Build a RuleSet from the text of a rules file.

    Args:
        text: TOML text.
        source: Name of the file, for error messages.

    Returns:
        The validated RuleSet; missing keys keep their documented defaults.

    Raises:
        ConfigError: The text is not TOML, or a key, type or pattern is wrong; the
            message names the file and, where it can, the line.
    """
    return toml_file.load(text, source, RULES_FILE)


def load_rules(path: str | Path | None = None) -> RuleSet:
    """Load a rules file, or the shipped defaults when `path` is None.

    Args:
        path: Path of a TOML rules file, or None for `default_rules.toml`.

    Returns:
        The validated RuleSet.

    Raises:
        ConfigError: The file cannot be read or is wrong (see `parse_rules`).
    """
    if path is None:
        text = resources.files(__package__).joinpath("default_rules.toml").read_text()
        return parse_rules(text, "default_rules.toml")
    text = toml_file.read_text(path, f"rules file {path}", "fix --rules, or drop it for the shipped rules")
    return parse_rules(text, str(path))


def packaged_rules_text(name: str) -> str:
    """Text of a rules file shipped with clusterwatch ("default_rules.toml", "demo_rules.toml")."""
    return resources.files(__package__).joinpath(name).read_text()
