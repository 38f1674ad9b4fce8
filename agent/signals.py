"""Signals the collector asks for (an alert action, off by default): checked, then sent.

The collector names a process by (pid, start time). The agent sends the signal only
to a process it watches, and only if that pid still has that start time, so a pid
reused by another process since the alert is never hit.
"""
from __future__ import annotations

import logging
import os
import signal as signal_mod
from collections.abc import Callable

log = logging.getLogger("clusterwatch.agent")

# Signals an alert may ask for: ask a job to checkpoint or report, never to die.
ALLOWED = frozenset({signal_mod.SIGUSR1, signal_mod.SIGUSR2, signal_mod.SIGCONT})


class SignalHandler:
    """Delivers SignalRequests from the collector.

    Args:
        start_time: pid → its start time (None when gone), from the process source.
        watched: whether a pid is one the agent watches.
    """

    def __init__(self, start_time: Callable[[int], float | None], watched: Callable[[int], bool]) -> None:
        self.start_time = start_time
        self.watched = watched
        self.sent = 0
        self.refused = 0

    def __call__(self, req) -> bool:
        why = self._refusal(req)
        if why:
            self.refused += 1
            log.warning("not sending signal %d to pid %d (%s): %s", req.signal, req.pid, req.reason, why)
            return False
        try:
            os.kill(req.pid, req.signal)
        except OSError as exc:
            self.refused += 1
            log.warning("signal %d to pid %d failed: %s", req.signal, req.pid, exc.strerror)
            return False
        self.sent += 1
        log.warning("sent signal %d to pid %d: %s", req.signal, req.pid, req.reason)
        return True

    def _refusal(self, req) -> str:
        if req.signal not in ALLOWED:
            return f"only {', '.join(sorted(s.name for s in ALLOWED))} may be sent by an alert"
        return identity_refusal(req.pid, req.start_time, self.watched, self.start_time)


def identity_refusal(pid: int, start_time: float, watched, start_time_of) -> str:
    """Why a request from the collector names no process of this agent's ("" when it does): the pid is one the
    agent watches and still the process that started at `start_time` (a reused pid is left alone)."""
    if pid <= 1 or not watched(pid):
        return "not a process this agent watches"
    st = start_time_of(pid)
    if st is None:
        return "the process is gone"
    if abs(st - start_time) > 0.05:
        return "the pid now belongs to another process"
    return ""
