"""A thread that runs NVML calls one job at a time, so a wedged GPU holds up only that thread.

An NVML call on a GPU that stopped answering can block for seconds inside the driver, and
ctypes cannot interrupt it. The reads therefore run off the poll thread, in lanes (see
`nvml_rounds`); the poll waits for them up to a deadline. A lane still inside an old call is
not given a new one: the call in flight is left to finish, however long it takes. Lanes are
daemon threads: a C call that never returns cannot keep the agent from stopping.
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable

from clusterwatch.agent.thread_names import name_os_thread

__all__ = ["Lane"]


class Lane:
    """A thread that runs one job at a time.

    Args:
        name: the thread's name, as `top -H` shows it (15 bytes at most).
    """

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future, Callable[..., Any], tuple] | None] = queue.SimpleQueue()
        self._pending: Future | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        """Whether the last job given is still running (or waiting to)."""
        return self._pending is not None and not self._pending.done()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future | None:
        """Give the lane a job; None (and nothing queued) while the last one has not finished."""
        if self.busy:
            return None
        future: Future = Future()
        self._pending = future
        self._jobs.put((future, fn, args))
        return future

    def stop(self) -> None:
        """Let the thread end after the job in flight (it is a daemon: nobody waits for it)."""
        self._jobs.put(None)

    def _run(self) -> None:
        name_os_thread(self._thread.name)
        while True:
            item = self._jobs.get()
            if item is None:
                return
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 -- handed to the poll, which counts it
                future.set_exception(exc)
