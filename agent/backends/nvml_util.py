"""Which process-utilisation samples of NVML's buffer one poll takes, and what a process reads.

NVML keeps a buffer of per-process SM utilisation samples, stamped with the CPU's wall clock
in microseconds, and returns those newer than the `lastSeenTimeStamp` asked with. It holds a
sample only for a process that used the GPU in the sample period: a process NVML lists on the
GPU with no sample is idle, and reads 0 % (not "unknown"), provided the query itself answered.

The buffer is minutes deep and the wall clock can step (NTP, a VM resumed). So a first query
asks from one window before `now` (not from 0, which would take minutes-old samples as
current); a later one asks from the newest stamp taken, unless that lies in the future (the
clock stepped back: asking from it would find nothing newer for as long as the step), when it
asks from one window back again. Samples stamped in the future (from before a step back) or
older than the hold (from before a step forward) are not taken. These functions are pure: the
source keeps the state between polls.
"""
from __future__ import annotations

from collections.abc import Iterable

__all__ = ["query_since", "newest_by_pid", "process_util"]

_US = 1_000_000


def query_since(last_seen_us: int, now: float, window_s: float, slack_s: float = 1.0) -> int:
    """The `lastSeenTimeStamp` to ask with.

    Args:
        last_seen_us: the newest sample stamp taken so far (0: none yet).
        now: the poll's wall-clock time (Unix seconds).
        window_s: how far back a first query looks (a poll interval; at least the driver's
            longest sample period, 1 s).
        slack_s: how far past `now` a stamp may lie and still count as now (clocks drift).

    Returns:
        A CPU timestamp in microseconds.
    """
    now_us = int(now * _US)
    if last_seen_us <= 0 or last_seen_us > now_us + int(slack_s * _US):
        return now_us - int(max(window_s, 1.0) * _US)
    return last_seen_us


def newest_by_pid(samples: Iterable[tuple[int, int, int]], live: set[int], since_us: int, now: float,
                  slack_s: float, oldest_s: float) -> tuple[dict[int, float], int]:
    """The newest sample of each listed process, and the newest stamp taken.

    Args:
        samples: NVML's samples as (pid, timeStamp µs, smUtil %).
        live: the pids NVML lists on the GPU now (the buffer also holds processes gone).
        since_us: the stamp the query asked from (the result when nothing is taken).
        now: the poll's wall-clock time (Unix seconds).
        slack_s: how far past `now` a stamp may lie and still be taken (clocks drift).
        oldest_s: how old a sample may be and still be current (the hold).

    Returns:
        pid → SM utilisation clamped to 0-100, and the newest stamp taken (µs).
    """
    limit = int((now + slack_s) * _US)
    floor = int((now - oldest_s) * _US)
    newest: dict[int, tuple[int, float]] = {}
    last = since_us
    for pid, ts, sm in samples:
        if ts <= since_us or ts > limit or ts < floor:
            continue  # older than asked (a driver that ignores the stamp), or from before a clock step
        if ts > last:
            last = ts
        if pid in live and (pid not in newest or ts >= newest[pid][0]):
            newest[pid] = (ts, min(100.0, max(0.0, float(sm))))
    return {pid: value for pid, (_ts, value) in newest.items()}, last


def process_util(live: Iterable[int], fresh: dict[int, float], seen: dict[int, tuple[float, float]],
                 now: float, hold_s: float, answered: bool) -> dict[int, float | None]:
    """What each listed process reads this poll.

    Args:
        live: the pids NVML lists on the GPU.
        fresh: the samples taken this poll (pid → %).
        seen: pid → (last value, poll time it was taken); updated here with `fresh`, and emptied
            of pids no longer listed.
        now: the poll's wall-clock time (Unix seconds).
        hold_s: how long a value stands with no newer sample (the driver's sample period may be
            longer than the poll interval).
        answered: the query answered (with samples, or with "none newer"); when it failed, a
            process with no value held reads None, not 0.

    Returns:
        pid → SM utilisation %, 0.0 for a listed process with no sample, None when unknown.
    """
    live = set(live)
    for gone in [p for p in seen if p not in live]:
        del seen[gone]
    for pid, value in fresh.items():
        seen[pid] = (value, now)
    result: dict[int, float | None] = {}
    for pid in live:
        held = seen.get(pid)
        if held is not None and 0.0 <= now - held[1] <= hold_s:
            result[pid] = held[0]
        else:
            result[pid] = 0.0 if answered else None
    return result
