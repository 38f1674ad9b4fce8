"""Rules as typed, frozen data, built from a TOML rules file.

`load_rules(path)` and `parse_rules(text, source)` validate the whole file once and
return a `RuleSet`; an unknown key, a wrong type or a bad pattern raises
`ConfigError` naming the file, the line and what is wrong. Units in the file are
the ones people think in (MB, MB/h, seconds, percent); the dataclasses hold base
units (bytes, bytes/h). docs/rules.md documents every key and default.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from clusterwatch.errors import ConfigError

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib  # type: ignore[no-redef]

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
        min_t_stat: Least slope / standard error of the slope (noise guard).
        min_mk_z: Least Mann–Kendall score of the window's bucket minima (a rank test of
            rising order that needs no noise scale: a second, independent noise guard).
        rise_fraction: Each third of the window must sit above the previous third by
            this fraction of the rise the slope predicts (growth is sustained, not one step).
        max_jump_fraction: No two consecutive sub-bucket increments may carry more than this
            fraction of the window's growth (plus twice the noise): a one-time step does.
        urgent_time_to_full_s: When the series would be full sooner than this, every
            window fires at `min_rate_per_h` (a fast leak near the limit fires early).
        resolve_fraction: A firing leak resolves when the slope over its window falls
            below this fraction of that window's rate floor.
    """

    enabled: bool = True
    severity: str = "warning"
    min_rate_per_h: float = 50 * MB
    min_growth: float = 64 * MB
    warmup_s: float = 1800.0
    bucket_s: float = 60.0
    windows: tuple[LeakWindow, ...] = (
        LeakWindow(900.0, 500 * MB),
        LeakWindow(2700.0, 100 * MB),
        LeakWindow(7200.0, 50 * MB),
        LeakWindow(14400.0, 50 * MB),
    )
    sub_buckets: int = 12
    min_t_stat: float = 4.0
    min_mk_z: float = 3.5
    rise_fraction: float = 0.25
    max_jump_fraction: float = 0.6
    urgent_time_to_full_s: float = 6 * 3600.0
    resolve_fraction: float = 0.5


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
    """

    enabled: bool = True
    severity: str = "critical"
    for_s: float = 360.0
    pending_after_s: float = 120.0


@dataclass(frozen=True, slots=True)
class IdleGpuRule:
    """A GPU allocated to a job has no process on it, or stays idle.

    Attributes:
        enabled: Whether the rule runs.
        severity: Severity of its alerts.
        util_below_percent: Utilisation under this is idle.
        for_s: Idle (or without processes) this long fires.
    """

    enabled: bool = True
    severity: str = "warning"
    util_below_percent: float = 5.0
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


def _default_handle_rule() -> LeakRule:
    return LeakRule(
        min_rate_per_h=30.0,
        min_growth=50.0,
        warmup_s=600.0,
        bucket_s=300.0,
        windows=(LeakWindow(3600.0, 60.0), LeakWindow(14400.0, 30.0)),
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
        action: "log", "webhook", "command" or "signal".
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
class RuleSet:
    """Every rule with its parameters, overrides, allow-list and actions."""

    gpu_memory_leak: LeakRule = field(default_factory=LeakRule)
    host_memory_leak: LeakRule = field(default_factory=LeakRule)
    gpu_stall: GpuStallRule = field(default_factory=GpuStallRule)
    training_stall: TrainingStallRule = field(default_factory=TrainingStallRule)
    idle_gpu: IdleGpuRule = field(default_factory=IdleGpuRule)
    agent_down: AgentDownRule = field(default_factory=AgentDownRule)
    handle_leak: LeakRule = field(default_factory=_default_handle_rule)
    code_mismatch: CodeMismatchRule = field(default_factory=CodeMismatchRule)
    overrides: tuple[Override, ...] = ()
    allow: tuple[AllowEntry, ...] = ()
    actions: ActionsConfig = field(default_factory=ActionsConfig)

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


# ---- loading ---------------------------------------------------------------------------------

_LEAK_MEMORY_KEYS = {
    # file key → (field, scale to base units)
    "enabled": ("enabled", None), "severity": ("severity", None),
    "min_rate_mb_per_h": ("min_rate_per_h", MB), "min_growth_mb": ("min_growth", MB),
    "warmup_s": ("warmup_s", 1.0), "bucket_s": ("bucket_s", 1.0), "windows": ("windows", MB),
    "min_t_stat": ("min_t_stat", 1.0), "min_mk_z": ("min_mk_z", 1.0),
    "rise_fraction": ("rise_fraction", 1.0),
    "max_jump_fraction": ("max_jump_fraction", 1.0), "sub_buckets": ("sub_buckets", 1.0),
    "urgent_time_to_full_s": ("urgent_time_to_full_s", 1.0),
    "resolve_fraction": ("resolve_fraction", 1.0),
}
_LEAK_COUNT_KEYS = {
    **{k: v for k, v in _LEAK_MEMORY_KEYS.items() if "mb" not in k and k != "windows"},
    "min_rate_per_h": ("min_rate_per_h", 1.0), "min_growth": ("min_growth", 1.0),
    "windows": ("windows", 1.0),
}


def _simple_keys(cls: type) -> dict[str, tuple[str, float | None]]:
    return {f.name: (f.name, None if f.type in ("bool", "str") else 1.0) for f in dataclasses.fields(cls)}


_RULE_KEYS: dict[str, dict[str, tuple[str, float | None]]] = {
    "gpu_memory_leak": _LEAK_MEMORY_KEYS,
    "host_memory_leak": _LEAK_MEMORY_KEYS,
    "handle_leak": _LEAK_COUNT_KEYS,
    "gpu_stall": _simple_keys(GpuStallRule),
    "training_stall": _simple_keys(TrainingStallRule),
    "idle_gpu": _simple_keys(IdleGpuRule),
    "agent_down": _simple_keys(AgentDownRule),
    "code_mismatch": _simple_keys(CodeMismatchRule),
}
_MATCH_KEYS = ("job_name", "user", "partition", "command")
_ACTION_KINDS = ("log", "webhook", "command", "signal")


class _Ctx:
    """Where we are in the file, to name the line in an error."""

    def __init__(self, source: str, text: str) -> None:
        self.source = source
        self.lines = text.splitlines()

    def line_of(self, key: str, after: str | None = None) -> int | None:
        start = 0
        if after is not None:
            for i, line in enumerate(self.lines):
                if line.strip().strip("[]").strip() == after:
                    start = i
                    break
        pat = re.compile(r"^\s*" + re.escape(key) + r"\s*=")
        for i in range(start, len(self.lines)):
            if pat.match(self.lines[i]):
                return i + 1
        for i in range(0, len(self.lines)):
            if pat.match(self.lines[i]):
                return i + 1
        return None

    def error(self, what: str, key: str | None = None, table: str | None = None) -> ConfigError:
        line = self.line_of(key, table) if key else None
        where = f"{self.source}: line {line}" if line else self.source
        return ConfigError(f"{where}: {what}")


def _convert(ctx: _Ctx, table: str, key: str, value: Any, scale: float | None, current: Any) -> Any:
    if key == "windows":
        if not isinstance(value, list) or not value or not all(
                isinstance(w, list) and len(w) == 2 and all(_is_number(x) for x in w) for w in value):
            raise ctx.error(f"[{table}] windows must be a list of [window_s, min_rate] pairs", key, table)
        wins = tuple(LeakWindow(float(w[0]), float(w[1]) * (scale or 1.0)) for w in value)
        if any(w.window_s <= 0 for w in wins):
            raise ctx.error(f"[{table}] window lengths must be positive", key, table)
        return tuple(sorted(wins, key=lambda w: w.window_s))
    if isinstance(current, bool):
        if not isinstance(value, bool):
            raise ctx.error(f"[{table}] {key} must be true or false, not {value!r}", key, table)
        return value
    if isinstance(current, str):
        if not isinstance(value, str):
            raise ctx.error(f"[{table}] {key} must be a string, not {value!r}", key, table)
        if key == "severity" and value not in SEVERITIES:
            raise ctx.error(f"[{table}] severity must be one of {', '.join(SEVERITIES)}, not {value!r}",
                            key, table)
        return value
    if not _is_number(value):
        raise ctx.error(f"[{table}] {key} must be a number, not {value!r}", key, table)
    if value < 0:
        raise ctx.error(f"[{table}] {key} must not be negative", key, table)
    if key == "sub_buckets":
        return max(6, int(value))
    return float(value) * (scale or 1.0)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _rule_changes(ctx: _Ctx, rule_name: str, table: dict[str, Any], base: Any, where: str
                  ) -> dict[str, Any]:
    keys = _RULE_KEYS[rule_name]
    changes: dict[str, Any] = {}
    for key, value in table.items():
        if key not in keys:
            raise ctx.error(f"[{where}] unknown key {key!r} (known: {', '.join(sorted(keys))})", key, where)
        fname, scale = keys[key]
        changes[fname] = _convert(ctx, where, key, value, scale, getattr(base, fname))
    return changes


def _pattern(ctx: _Ctx, where: str, key: str, value: Any) -> Pattern:
    if not isinstance(value, str):
        raise ctx.error(f"[{where}] {key} must be a string pattern, not {value!r}", key, where)
    if value.startswith("re:"):
        try:
            return Pattern(value, re.compile(value[3:]))
        except re.error as exc:
            raise ctx.error(f"[{where}] {key}: bad regular expression {value[3:]!r}: {exc}", key, where) from exc
    return Pattern(value)


def _match(ctx: _Ctx, where: str, entry: dict[str, Any]) -> Match:
    pats = {k: _pattern(ctx, where, k, entry[k]) for k in _MATCH_KEYS if k in entry}
    if not pats:
        raise ctx.error(f"[{where}] needs at least one of {', '.join(_MATCH_KEYS)}")
    return Match(**pats)


def _check_rule_names(ctx: _Ctx, where: str, key: str, names: Any) -> tuple[str, ...]:
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ctx.error(f"[{where}] {key} must be a list of rule names", key, where)
    for n in names:
        if n not in RULE_NAMES:
            raise ctx.error(f"[{where}] unknown rule {n!r} (rules: {', '.join(RULE_NAMES)})", key, where)
    return tuple(names)


def _actions(ctx: _Ctx, data: Any) -> ActionsConfig:
    if not isinstance(data, dict):
        raise ctx.error("[actions] must be a table")
    known = {"allow_signals", "steps"}
    for key in data:
        if key not in known:
            raise ctx.error(f"[actions] unknown key {key!r} (known: {', '.join(sorted(known))})", key)
    allow = data.get("allow_signals", False)
    if not isinstance(allow, bool):
        raise ctx.error("[actions] allow_signals must be true or false", "allow_signals")
    steps = []
    step_fields = {f.name for f in dataclasses.fields(ActionStep)}
    for i, raw in enumerate(data.get("steps", [{"action": "log"}])):
        where = f"actions.steps #{i + 1}"
        if not isinstance(raw, dict):
            raise ctx.error(f"[{where}] must be a table")
        for key in raw:
            if key not in step_fields:
                raise ctx.error(f"[{where}] unknown key {key!r} (known: {', '.join(sorted(step_fields))})", key)
        kind = raw.get("action")
        if kind not in _ACTION_KINDS:
            raise ctx.error(f"[{where}] action must be one of {', '.join(_ACTION_KINDS)}, not {kind!r}", "action")
        kw: dict[str, Any] = {"action": kind}
        for key in ("after_s", "timeout_s"):
            if key in raw:
                kw[key] = _convert(ctx, where, key, raw[key], 1.0, 0.0)
        if "rules" in raw:
            kw["rules"] = _check_rule_names(ctx, where, "rules", raw["rules"])
        for key in ("min_severity", "url", "signal"):
            if key in raw:
                kw[key] = _convert(ctx, where, key, raw[key], None, "")
        if "min_severity" in kw and kw["min_severity"] not in SEVERITIES:
            raise ctx.error(f"[{where}] min_severity must be one of {', '.join(SEVERITIES)}", "min_severity")
        if "on_resolved" in raw:
            kw["on_resolved"] = _convert(ctx, where, "on_resolved", raw["on_resolved"], None, True)
        if "command" in raw:
            cmd = raw["command"]
            if not isinstance(cmd, list) or not cmd or not all(isinstance(c, str) for c in cmd):
                raise ctx.error(f"[{where}] command must be a non-empty list of strings (argv)", "command")
            kw["command"] = tuple(cmd)
        if kind == "webhook" and not str(kw.get("url", "")).startswith(("http://", "https://")):
            raise ctx.error(f"[{where}] a webhook needs url = \"http://...\" or \"https://...\"", "url")
        if kind == "command" and not kw.get("command"):
            raise ctx.error(f"[{where}] a command action needs command = [\"prog\", \"arg\", ...]", "action")
        if kind == "signal":
            import signal as _signal

            if not isinstance(getattr(_signal, kw.get("signal", "SIGUSR1"), None), int):
                raise ctx.error(f"[{where}] unknown signal {kw.get('signal')!r}", "signal")
        steps.append(ActionStep(**kw))
    return ActionsConfig(steps=tuple(steps), allow_signals=allow)


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
    ctx = _Ctx(source, text)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = re.search(r"\(at line (\d+), column \d+\)", msg)
        where = f"{source}: line {m.group(1)}" if m else source
        what = re.sub(r" \(at line.*", "", msg)
        raise ConfigError(f"{where}: not valid TOML: {what}") from exc
    rules = RuleSet()
    kw: dict[str, Any] = {}
    for key, value in data.items():
        if key in _RULE_KEYS:
            if not isinstance(value, dict):
                raise ctx.error(f"{key} must be a table ([{key}])", key)
            base = getattr(rules, key)
            kw[key] = dataclasses.replace(base, **_rule_changes(ctx, key, value, base, key))
        elif key == "overrides":
            if not isinstance(value, list):
                raise ctx.error("overrides must be an array of tables ([[overrides]])", key)
            ovs = []
            for i, entry in enumerate(value):
                where = f"overrides #{i + 1}"
                changes = []
                for k, v in entry.items():
                    if k in _MATCH_KEYS:
                        continue
                    if k not in _RULE_KEYS:
                        raise ctx.error(f"[{where}] unknown key {k!r}: expected {', '.join(_MATCH_KEYS)} "
                                        f"or a rule table such as [overrides.gpu_memory_leak]", k)
                    if not isinstance(v, dict):
                        raise ctx.error(f"[{where}] {k} must be a table", k)
                    base = kw.get(k, getattr(rules, k))
                    changes.append((k, tuple(_rule_changes(ctx, k, v, base, f"overrides.{k}").items())))
                ovs.append(Override(_match(ctx, where, entry), tuple(changes)))
            kw["overrides"] = tuple(ovs)
        elif key == "allow":
            if not isinstance(value, list):
                raise ctx.error("allow must be an array of tables ([[allow]])", key)
            entries = []
            for i, entry in enumerate(value):
                where = f"allow #{i + 1}"
                for k in entry:
                    if k not in (*_MATCH_KEYS, "rules", "reason"):
                        raise ctx.error(f"[{where}] unknown key {k!r}", k)
                if "rules" not in entry:
                    raise ctx.error(f"[{where}] needs rules = [\"rule_name\", ...]")
                entries.append(AllowEntry(_match(ctx, where, entry),
                                          _check_rule_names(ctx, where, "rules", entry["rules"]),
                                          str(entry.get("reason", ""))))
            kw["allow"] = tuple(entries)
        elif key == "actions":
            kw["actions"] = _actions(ctx, value)
        else:
            known = [*_RULE_KEYS, "overrides", "allow", "actions"]
            raise ctx.error(f"unknown table {key!r} (known: {', '.join(known)})", key)
    return dataclasses.replace(rules, **kw)


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
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the rules file: {exc.strerror or exc}") from exc
    return parse_rules(text, str(p))


def packaged_rules_text(name: str) -> str:
    """Text of a rules file shipped with clusterwatch ("default_rules.toml", "demo_rules.toml")."""
    return resources.files(__package__).joinpath(name).read_text()
