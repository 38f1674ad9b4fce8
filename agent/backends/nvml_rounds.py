"""One round of NVML reads a poll, every GPU within a deadline, a wedged GPU kept apart.

The healthy GPUs are read in turn on one shared thread: one thread switch a poll. A thread per GPU
costs several times the reads' own CPU: each ctypes call lets go of the GIL, and the threads take it
from each other at every call (bench/bench_agent.py's NVML rows, through the real pynvml and the C
stand-in). When the round overruns its deadline, the GPU the
shared thread is inside is set apart: that thread is left to finish its call and end, the GPU
gets a thread (a `Lane`) of its own, and a new shared thread reads the others from the next
round on. A GPU set apart goes back to the shared thread after it has answered in time for a
few rounds in a row. No GPU is ever read by two threads at once.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clusterwatch.agent.backends.nvml_lanes import Job, Lane

__all__ = ["Rounds", "RoundResult"]


@dataclass(slots=True)
class RoundResult:
    """What one round gave: each key's (ok, value or exception), the keys without a result, and
    those that overran the deadline in this round for the first time (to be said once)."""

    done: dict[int, tuple[bool, Any]] = field(default_factory=dict)
    late: list[int] = field(default_factory=list)
    newly_late: list[int] = field(default_factory=list)


@dataclass(slots=True)
class _Progress:
    results: dict[int, tuple[bool, Any]] = field(default_factory=dict)
    current: int | None = None
    cancelled: bool = False


@dataclass(slots=True)
class _Apart:
    lane: Lane
    blocker: Job | None  # the shared round still inside this GPU's call
    in_time: int = 0


class Rounds:
    """Runs `fn(key, *args)` for each key in a round, within a deadline.

    Args:
        deadline_s: how long a round waits.
        name: the threads' name (the shared one; a GPU's own adds its key).
        back_after: rounds in time, in a row, before a GPU set apart rejoins the shared thread.
    """

    def __init__(self, deadline_s: float, *, name: str = "cw-nvml", back_after: int = 3) -> None:
        self.deadline_s = deadline_s
        self._name = name
        self._back_after = back_after
        self._shared = Lane(name)
        self._apart: dict[int, _Apart] = {}

    @property
    def busy(self) -> bool:
        """Whether some thread is still inside a call."""
        return self._shared.busy or any(
            a.lane.busy or (a.blocker is not None and not a.blocker.done()) for a in self._apart.values())

    def run(self, fn: Callable[..., Any], keys: list[int], *args: Any) -> RoundResult:
        """One round over `keys`; returns within about the deadline whatever the calls do."""
        out = RoundResult()
        shared = [k for k in keys if k not in self._apart]
        progress = _Progress()
        shared_future = self._shared.submit(self._in_turn, fn, shared, args, progress) if shared else None
        own: dict[int, Job] = {}
        for k in keys:
            apart = self._apart.get(k)
            if apart is None or (apart.blocker is not None and not apart.blocker.done()):
                continue
            apart.blocker = None
            future = apart.lane.submit(fn, k, *args)
            if future is not None:
                own[k] = future
        waiting = [f for f in (shared_future, *own.values()) if f is not None]
        if waiting:
            end = time.monotonic() + self.deadline_s
            for job in waiting:  # all of them by the one deadline
                if not job.wait(end - time.monotonic()):
                    break
        if shared_future is not None and not shared_future.done():
            progress.cancelled = True  # the shared thread stops after the GPU it is inside
            stuck = progress.current
            self._shared.stop()
            self._shared = Lane(self._name)
            out.done.update(dict(progress.results))
            if stuck is not None and stuck not in out.done:
                self._apart[stuck] = _Apart(Lane(f"{self._name}{stuck}"), blocker=shared_future)
                out.newly_late.append(stuck)
        else:
            out.done.update(progress.results)
        out.late.extend(k for k in shared if k not in out.done)
        for k in keys:
            apart = self._apart.get(k)
            if apart is None or k in shared:
                continue
            future = own.get(k)
            if future is not None and future.done():
                out.done[k] = (False, future.error) if future.error is not None else (True, future.value)
                apart.in_time += 1
                if apart.in_time >= self._back_after:
                    apart.lane.stop()
                    del self._apart[k]
            else:
                apart.in_time = 0
                out.late.append(k)
        return out

    def stop(self) -> None:
        """Let every thread end after the call it is in (daemons: nobody waits for them)."""
        self._shared.stop()
        for apart in self._apart.values():
            apart.lane.stop()

    @staticmethod
    def _in_turn(fn: Callable[..., Any], keys: list[int], args: tuple, progress: _Progress) -> None:
        for k in keys:
            if progress.cancelled:
                return
            progress.current = k
            try:
                progress.results[k] = (True, fn(k, *args))
            except Exception as exc:  # noqa: BLE001 -- one GPU's failure, handed to the poll
                progress.results[k] = (False, exc)
