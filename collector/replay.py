"""Replay a recorded trace through the rule engine, in time order.

A trace is JSON lines, one observation per line (docs/traces.md). Reading the
file is the only I/O here; everything else is the same engine the collector runs.
Lines that are not JSON objects with `t`, `node` and `pid` are counted and
skipped, not fatal: a trace cut off by a crash still replays.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from clusterwatch.errors import ParseError

from .rules import AlertEvent, Engine, GpuObservation, NodeHeartbeat, RuleSet


@dataclass
class ReplayStats:
    """What a replay read.

    Attributes:
        samples: Observations fed to the engine.
        bad_lines: Lines skipped as malformed.
        first_bad: Up to five (line number, reason) of skipped lines.
        out_of_order: Observations older than the one before (fed anyway, counted).
    """

    samples: int = 0
    bad_lines: int = 0
    first_bad: list[tuple[int, str]] = field(default_factory=list)
    out_of_order: int = 0


def _bad(stats: ReplayStats, lineno: int, why: str) -> None:
    stats.bad_lines += 1
    if len(stats.first_bad) < 5:
        stats.first_bad.append((lineno, why))


def replay_lines(lines: IO[bytes] | Iterator[bytes], rules: RuleSet, stats: ReplayStats | None = None
                 ) -> Iterator[AlertEvent]:
    """Feed trace lines to a fresh engine and yield alert events as they happen.

    Args:
        lines: Trace lines as bytes (an open binary file works).
        rules: The rule set.
        stats: Filled with counts of samples and bad lines, when given.

    Yields:
        Alert events, oldest first. `agent_down` is checked at every "node" record.
    """
    st = stats if stats is not None else ReplayStats()
    eng = Engine(rules)
    observe = eng.observe_mapping
    loads = orjson.loads
    last_t = float("-inf")
    n = 0
    for lineno, line in enumerate(lines, 1):
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
                events = observe(d)
            elif kind == "gpu":
                events = eng.observe_gpu(GpuObservation(
                    t=float(t), node=str(d["node"]), gpu=str(d["gpu"]), job_id=str(d.get("job_id", "")),
                    utilization=d.get("utilization"), processes=d.get("processes"), index=d.get("index")))
            elif kind == "node":
                hb = NodeHeartbeat(t=float(t), node=str(d["node"]), has_jobs=bool(d.get("has_jobs", True)))
                events = [*eng.tick(hb.t), *eng.heartbeat(hb)]
            else:
                _bad(st, lineno, f"unknown kind {kind!r}")
                continue
        except (KeyError, TypeError, AttributeError) as exc:
            _bad(st, lineno, f"missing or wrong field {exc}" if isinstance(exc, KeyError) else
                 "not an observation object" if isinstance(exc, AttributeError) else f"wrong type ({exc})")
            continue
        n += 1
        if t < last_t:
            st.out_of_order += 1
        else:
            last_t = t
        if events:
            yield from events
    st.samples += n


def replay_file(path: str | Path, rules: RuleSet, stats: ReplayStats | None = None) -> Iterator[AlertEvent]:
    """Replay a trace file; see `replay_lines`.

    Args:
        path: Trace file (JSON lines).
        rules: The rule set.
        stats: Filled with counts, when given.

    Yields:
        Alert events, oldest first.

    Raises:
        ParseError: The file cannot be opened.
    """
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below, after the generator is drained
    except OSError as exc:
        raise ParseError(f"{path}: cannot read the trace: {exc.strerror or exc}") from exc
    with f:
        yield from replay_lines(f, rules, stats)


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
