"""The signals that end a `run` or a `demo`: SIGINT (Ctrl-C), SIGTERM (kill, timeout, scancel), SIGHUP
(a dropped SSH session).

The handlers only record what arrived; the command's loop acts on it. A handler that raised could cut
short the cleanup it interrupts (stopping children, removing the temporary folder) and leave
processes behind, and one that printed could hit a write already under way.
"""
from __future__ import annotations

import os
import signal
import sys

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopSignals:
    """Records the stop signals received while installed (a context manager)."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self._saved: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        for sig in STOP_SIGNALS:
            self._saved[sig] = signal.signal(sig, self._record)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)

    def _record(self, signum: int, frame) -> None:
        self.received.append(signum)

    @property
    def exit_code(self) -> int | None:
        """128 + the first signal's number, as a shell reports a command a signal ended; None if none came."""
        return 128 + self.received[0] if self.received else None


def name(sig: int) -> str:
    return signal.Signals(sig).name


def terminal_sends_sigint_to_the_group() -> bool:
    """True when this process is in the terminal's foreground process group.

    Then a Ctrl-C reached the command (same group) at the same moment as us, and forwarding the
    SIGINT would deliver it twice; otherwise (`kill -INT`, no terminal) only we got it.
    """
    for stream in (sys.stdin, sys.stderr):
        try:
            fd = stream.fileno()
            if os.isatty(fd):
                return os.tcgetpgrp(fd) == os.getpgrp()
        except (OSError, ValueError, AttributeError):
            continue
    return False
