"""The simulated-GPU scenario: its TOML file, its profiles, and the curves they draw.

Pure: text in, frozen dataclasses out, and curves as functions of (seconds since the
process started, a seed). `sim.py` does the I/O. The file format:

    [gpus]
    count = 8                        # simulated GPUs on the node (1..64)
    name = "NVIDIA H100 80GB HBM3 (simulated)"
    memory_mib = 81559               # total memory of each GPU
    base_memory_mib = 420            # used on each GPU by no process (driver, contexts)
    idle_power_watts = 70            # power at 0 % utilisation ...
    max_power_watts = 700            # ... and at 100 %, linear between

    [defaults]
    profile = "steady"               # for a process that names no profile

    [profiles.NAME]                  # any number of these
    kind = "steady"                  # steady | warmup | linear_leak | stair_leak | idle | stall | sawtooth
    memory_mib = 20000               # the process's GPU memory (the start, for leaks)
    utilization = 85                 # SM utilisation %, before noise
    noise = 3                        # ± % of uniform, deterministic noise on utilisation
    # kind-specific: warmup_s (warmup: memory ramps from 0 to memory_mib),
    # leak_mib_per_min (linear_leak), step_mib + step_every_s (stair_leak),
    # stall_after_s (stall: busy, then 0 %), amplitude_mib + period_s (sawtooth)

    [[events]]                       # any number: what happens to a GPU, for `clusterwatch health`
    at_s = 30                        # seconds after the agent started
    gpu = 1                          # the GPU's index
    kind = "xid"                     # xid | lost | throttle
    xid = 48                         # xid: the XID number the driver raises
    # throttle: reasons = ["hw_thermal_slowdown", ...] (THROTTLE_REASONS), for_s (default: for good),
    # temperature_c (the GPU's temperature meanwhile); lost: none (the GPU falls off the bus for good)
    # node = "demo-node1"            # any kind: only the source of that node plays it
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from clusterwatch import toml_file
from clusterwatch.errors import ConfigError
from clusterwatch.toml_schema import ArrayOf, Invalid, Key, Number, Strings, Table, Text

__all__ = ["GpuSpec", "Profile", "Scenario", "SimEvent", "parse_scenario", "KINDS", "EVENT_KINDS",
           "THROTTLE_REASONS"]

MiB = 1024 * 1024

# kind → the parameters it takes beyond the common ones, with their defaults
KINDS: dict[str, dict[str, float]] = {
    "steady": {},
    "warmup": {"warmup_s": 120.0},
    "linear_leak": {"leak_mib_per_min": 60.0},
    "stair_leak": {"step_mib": 512.0, "step_every_s": 60.0},
    "idle": {},
    "stall": {"stall_after_s": 120.0},
    "sawtooth": {"amplitude_mib": 4096.0, "period_s": 120.0},
}
_COMMON = {"kind", "memory_mib", "utilization", "noise"}
_GPU_KEYS = {"count", "name", "memory_mib", "base_memory_mib", "idle_power_watts", "max_power_watts",
             "temperature_c"}
_MAX_GPUS = 64
_GPUS = ("gpus",)


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """The simulated GPUs, all alike."""

    count: int = 8
    name: str = "NVIDIA H100 80GB HBM3 (simulated)"
    memory_bytes: int = 81559 * MiB
    base_memory_bytes: int = 420 * MiB
    idle_power_watts: float = 70.0
    max_power_watts: float = 700.0
    temperature_c: int = 40               # what the health counters read, but while a throttle event says

    def power(self, utilization: float) -> float:
        """Power in watts at a utilisation in percent."""
        return self.idle_power_watts + (self.max_power_watts - self.idle_power_watts) * utilization / 100.0


@dataclass(frozen=True, slots=True)
class Profile:
    """A named curve of GPU memory and SM utilisation over a process's life."""

    name: str
    kind: str
    memory_bytes: int
    utilization: float
    noise: float = 0.0
    warmup_s: float = 120.0
    leak_mib_per_min: float = 60.0
    step_mib: float = 512.0
    step_every_s: float = 60.0
    stall_after_s: float = 120.0
    amplitude_mib: float = 4096.0
    period_s: float = 120.0

    def memory_at(self, t: float, base_bytes: int | None = None) -> int:
        """GPU memory in bytes `t` seconds after the process started.

        Args:
            t: seconds since the process started (negative is taken as 0).
            base_bytes: replaces `memory_bytes` (CLUSTERWATCH_SIM_GPU_BASE_MB).
        """
        t = max(0.0, t)
        base = self.memory_bytes if base_bytes is None else base_bytes
        kind = self.kind
        if kind == "warmup":
            return int(base * min(1.0, t / self.warmup_s)) if self.warmup_s > 0 else base
        if kind == "linear_leak":
            return base + int(self.leak_mib_per_min * MiB * t / 60.0)
        if kind == "stair_leak":
            steps = math.floor(t / self.step_every_s) if self.step_every_s > 0 else 0
            return base + int(steps * self.step_mib * MiB)
        if kind == "sawtooth":
            phase = (t % self.period_s) / self.period_s if self.period_s > 0 else 0.0
            return base + int(self.amplitude_mib * MiB * phase)
        return base  # steady, idle, stall

    def utilization_at(self, t: float, seed: int) -> float:
        """SM utilisation in percent `t` seconds after start, with seeded noise, 0–100."""
        if self.kind == "idle" or (self.kind == "stall" and t >= self.stall_after_s):
            return 0.0
        value = self.utilization
        if self.noise:
            # One noise value per second of process life: the same (pid, start, second)
            # always gives the same reading, whoever polls and how often.
            value += self.noise * (2.0 * _unit(seed, int(t)) - 1.0)
        return min(100.0, max(0.0, value))


# the throttle reasons an event may name → their nvmlClocksEventReason* bits (nvml.h), by the names
# `clusterwatch health` and /metrics give them; all but sw_power_cap (a busy GPU at its power cap) are
# the gpu_throttle rule's
THROTTLE_REASONS = {"sw_power_cap": 0x4, "hw_slowdown": 0x8, "sw_thermal_slowdown": 0x20,
                    "hw_thermal_slowdown": 0x40, "hw_power_brake_slowdown": 0x80}
# kind → the keys it takes beyond at_s, gpu, kind and node
EVENT_KINDS: dict[str, frozenset[str]] = {
    "xid": frozenset({"xid"}),
    "lost": frozenset(),
    "throttle": frozenset({"reasons", "for_s", "temperature_c"}),
}
_EVENT_NEEDS = {"xid": ("xid", "48"), "throttle": ("reasons", '["hw_thermal_slowdown"]')}


@dataclass(frozen=True, slots=True)
class SimEvent:
    """Something that happens to one simulated GPU, `at_s` seconds after the agent started.

    An `xid` is raised once; a GPU `lost` stays lost; a `throttle` holds the clocks down for `for_s`.
    """

    at_s: float
    gpu: int
    kind: str
    xid: int = 0
    reasons: tuple[str, ...] = ()
    for_s: float = math.inf
    temperature_c: int | None = None
    node: str | None = None         # only the source of this node plays it (None: every one)

    @property
    def reason_bits(self) -> int:
        """The nvmlClocksEventReason* bits of a throttle's reasons."""
        return sum(THROTTLE_REASONS[name] for name in self.reasons)


def _event_fits_kind(fields: dict) -> None:
    kind = fields["kind"]
    common = ("at_s", "gpu", "kind", "node")
    for key in sorted(set(fields) - set(common) - EVENT_KINDS[kind]):
        takes = ", ".join([*common, *sorted(EVENT_KINDS[kind])])
        raise Invalid(f"{key} is not a key of kind {kind} (it takes {takes})", key=key)
    need = _EVENT_NEEDS.get(kind)
    if need and need[0] not in fields:
        raise Invalid(f"kind {kind} needs {need[0]} = {need[1]}", key="kind")


_EVENT = Table(
    keys={
        "at_s": Key("at_s", Number(), needs="30"),
        "gpu": Key("gpu", Number(integer=True), needs="0"),
        "kind": Key("kind", Text(tuple(EVENT_KINDS)), needs='"xid"'),
        "xid": Key("xid", Number(integer=True, at_least=1)),
        "reasons": Key("reasons", Strings("a list of reasons, at least one", tuple(THROTTLE_REASONS), "reason",
                                          non_empty=True)),
        "for_s": Key("for_s", Number()),
        "temperature_c": Key("temperature_c", Number(integer=True)),
        "node": Key("node", Text()),
    },
    build=lambda fields: SimEvent(**fields),
    checks=(_event_fits_kind,),
)
_EVENTS = ArrayOf(_EVENT)


@dataclass(frozen=True, slots=True)
class Scenario:
    """A scenario file, parsed: the GPUs, the profiles, the default profile's name and the GPUs' events."""

    gpus: GpuSpec
    profiles: dict[str, Profile]
    default_profile: str
    source: str = "<scenario>"
    events: tuple[SimEvent, ...] = ()

    def profile(self, name: str | None) -> Profile | None:
        """The profile called `name` (the default one for None); None if there is no such profile."""
        return self.profiles.get(self.default_profile if not name else name)


def parse_scenario(text: str, source: str) -> Scenario:
    """Parse a scenario file's text.

    Args:
        text: the TOML text.
        source: the file's name, for error messages.

    Returns:
        The scenario.

    Raises:
        ConfigError: one line naming the file, the line where it can be told, and what is wrong.
    """
    label = f"scenario {source}"

    def fail(problem: str, table: tuple[str, ...] = (), key: str | None = None) -> ConfigError:
        """The error for `problem`, at the line of `key` in `table` (the table's header without a key)."""
        return ConfigError(f"{toml_file.at_line(label, text, table, key)}: {problem}")

    doc = toml_file.parse(text, label)
    unknown = set(doc) - {"gpus", "defaults", "profiles", "events"}
    if unknown:
        raise fail(f"unknown table(s) {', '.join(sorted(unknown))} (expected gpus, defaults, profiles, events)",
                   key=sorted(unknown)[0])
    gpus = _gpus(_table(doc, "gpus", fail), fail)
    raw_profiles = _table(doc, "profiles", fail)
    if not raw_profiles:
        raise fail("no [profiles.NAME] table: define at least one profile")
    profiles = {name: _profile(name, raw, fail) for name, raw in raw_profiles.items()}
    defaults = _table(doc, "defaults", fail)
    if set(defaults) - {"profile"}:
        extra = sorted(set(defaults) - {"profile"})
        raise fail(f"unknown key(s) in [defaults]: {', '.join(extra)}", ("defaults",), extra[0])
    default = defaults.get("profile", next(iter(profiles)))
    if default not in profiles:
        raise fail(f"[defaults] profile = {default!r} names no profile (have: {', '.join(profiles)})",
                   ("defaults",), "profile")
    return Scenario(gpus=gpus, profiles=profiles, default_profile=default, source=source,
                    events=_events(doc.get("events", []), gpus.count, label, text))


def _events(raw: object, count: int, label: str, text: str) -> tuple[SimEvent, ...]:
    """The [[events]] entries, each on a GPU the scenario has."""
    try:
        events = _EVENTS.check_at(raw, ("events",))
        for i, event in enumerate(events, 1):
            if event.gpu >= count:
                raise Invalid(f"gpu {event.gpu} is not a GPU of the scenario (gpus.count = {count}: 0 to {count - 1})",
                              ("events", i), "gpu")
    except Invalid as exc:
        raise toml_file.error_at(label, text, exc) from None
    return events


def _table(doc: dict, key: str, fail) -> dict:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        raise fail(f"{key} must be a table ([{key}])", key=key)
    return value


def _number(raw: dict, key: str, where: tuple[str, ...], fail, default: float) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or math.isnan(value):
        raise fail(f"{'.'.join(where)}.{key} must be a number >= 0, not {value!r}", where, key)
    return float(value)


def _gpus(raw: dict, fail) -> GpuSpec:
    unknown = sorted(set(raw) - _GPU_KEYS)
    if unknown:
        raise fail(f"unknown key(s) in [gpus]: {', '.join(unknown)}", _GPUS, unknown[0])
    d = GpuSpec()
    count = raw.get("count", d.count)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= _MAX_GPUS:
        raise fail(f"gpus.count must be a whole number from 1 to {_MAX_GPUS}, not {count!r}", _GPUS, "count")
    name = raw.get("name", d.name)
    if not isinstance(name, str) or not name:
        raise fail(f"gpus.name must be a non-empty string, not {name!r}", _GPUS, "name")
    memory = int(_number(raw, "memory_mib", _GPUS, fail, d.memory_bytes / MiB) * MiB)
    base = int(_number(raw, "base_memory_mib", _GPUS, fail, d.base_memory_bytes / MiB) * MiB)
    if memory <= 0 or base >= memory:
        raise fail("gpus.memory_mib must be > 0 and above gpus.base_memory_mib", _GPUS, "memory_mib")
    idle = _number(raw, "idle_power_watts", _GPUS, fail, d.idle_power_watts)
    top = _number(raw, "max_power_watts", _GPUS, fail, d.max_power_watts)
    if top < idle:
        raise fail("gpus.max_power_watts must be >= gpus.idle_power_watts", _GPUS, "max_power_watts")
    temperature = int(_number(raw, "temperature_c", _GPUS, fail, d.temperature_c))
    return GpuSpec(count, name, memory, base, idle, top, temperature)


def _profile(name: str, raw: object, fail) -> Profile:
    table = ("profiles", name)
    where = f"profiles.{name}"
    if not isinstance(raw, dict):
        raise fail(f"{where} must be a table ([{where}])", ("profiles",), name)
    kind = raw.get("kind")
    if kind not in KINDS:
        raise fail(f"{where}.kind = {kind!r} is not one of {', '.join(KINDS)}", table, "kind")
    extra = KINDS[kind]
    unknown = sorted(set(raw) - _COMMON - set(extra))
    if unknown:
        raise fail(f"unknown key(s) in [{where}] for kind {kind}: {', '.join(unknown)}", table, unknown[0])
    utilization = _number(raw, "utilization", table, fail, 0.0 if kind == "idle" else 80.0)
    if utilization > 100:
        raise fail(f"{where}.utilization must be 0 to 100, not {utilization:g}", table, "utilization")
    params = {key: _number(raw, key, table, fail, default) for key, default in extra.items()}
    for key in ("period_s", "step_every_s"):
        if key in params and params[key] == 0:
            raise fail(f"{where}.{key} must be > 0", table, key)
    return Profile(
        name=name,
        kind=kind,
        memory_bytes=int(_number(raw, "memory_mib", table, fail, 4096.0) * MiB),
        utilization=utilization,
        noise=_number(raw, "noise", table, fail, 0.0),
        **params,
    )


def _unit(seed: int, n: int) -> float:
    """A deterministic pseudo-random number in [0, 1) from (seed, n): one splitmix64 round."""
    z = (seed * 0x9E3779B97F4A7C15 + n * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return ((z ^ (z >> 31)) >> 11) / float(1 << 53)
