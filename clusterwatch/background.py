"""A background thread that loops until it is told to stop.

The agent's readers and watchers (the NVML event wait, the health counters, the kernel log) each run
one: a daemon thread under a name Python shows, the same name in short as the system shows it, and a
stop Event the loop checks and waits on, so that stopping takes at most one of its waits.
"""
from __future__ import annotations

import threading
from typing import Callable

from clusterwatch.thread_names import name_os_thread

__all__ = ["BackgroundThread"]


class BackgroundThread:
    """Runs `loop` on a daemon thread of its own until `stop()`.

    `loop` ends when `stopping` is set: it checks `stopping.is_set()` and sleeps with
    `stopping.wait(seconds)`, never with time.sleep, so that a stop is seen within one wait.

    Args:
        loop: what the thread runs.
        name: the thread's name in Python (threading, logging, faulthandler).
        os_name: the name `top -H` and `ps -L` show (15 bytes at most are kept).
    """

    def __init__(self, loop: Callable[[], None], *, name: str, os_name: str) -> None:
        self.stopping = threading.Event()
        self._loop = loop
        self._name = name
        self._os_name = os_name
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread (once)."""
        self._thread = threading.Thread(target=self._main, name=self._name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        """Set `stopping` and wait up to `timeout` seconds for the thread to end; whether it has ended.

        False means it is still inside a call that does not look at `stopping` (a driver's wait):
        what that call uses must not be freed under it. A thread never started has ended.
        """
        self.stopping.set()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _main(self) -> None:
        name_os_thread(self._os_name)   # as top -H and ps -L show it
        self._loop()
