"""A thread that runs NVML calls one job at a time, so a wedged GPU holds up only that thread.

An NVML call on a GPU that stopped answering can block for seconds inside the driver, and
ctypes cannot interrupt it. The reads therefore run off the poll thread, in lanes (see
`nvml_rounds`); the poll waits for them up to a deadline. A lane still inside an old call is
not given a new one: the call in flight is left to finish, however long it takes. Lanes are
daemon threads: a C call that never returns cannot keep the agent from stopping.
"""
from __future__ import annotations

import _thread
import queue
import threading
from typing import Any, Callable

from clusterwatch.thread_names import name_os_thread

__all__ = ["Lane", "Job"]


class Job:
    """One call given to a lane: waited for through one lock, the lightest hand-off there is.

    (A concurrent.futures Future and `wait` cost a few times the hand-off itself: a poll makes one
    a round, bench/bench_agent.py's NVML rows.)
    """

    __slots__ = ("fn", "args", "value", "error", "_done")

    def __init__(self, fn: Callable[..., Any], args: tuple) -> None:
        self.fn, self.args = fn, args
        self.value: Any = None
        self.error: BaseException | None = None
        self._done = _thread.allocate_lock()
        self._done.acquire()  # released once, when the call has returned or raised

    def done(self) -> bool:
        return not self._done.locked()

    def wait(self, timeout: float) -> bool:
        """Whether the call finished within `timeout` seconds (0 or less: whether it has)."""
        if self._done.acquire(timeout=timeout) if timeout > 0 else self._done.acquire(False):
            self._done.release()
            return True
        return False

    def run(self) -> None:
        try:
            self.value = self.fn(*self.args)
        except BaseException as exc:  # noqa: BLE001 -- handed to the poll, which counts it
            self.error = exc
        self._done.release()


class Lane:
    """A thread that runs one job at a time.

    Args:
        name: the thread's name, as `top -H` shows it (15 bytes at most).
    """

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._pending: Job | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        """Whether the last job given is still running (or waiting to)."""
        return self._pending is not None and not self._pending.done()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Job | None:
        """Give the lane a job; None (and nothing queued) while the last one has not finished."""
        if self.busy:
            return None
        job = Job(fn, args)
        self._pending = job
        self._jobs.put(job)
        return job

    def stop(self) -> None:
        """Let the thread end after the job in flight (it is a daemon: nobody waits for it)."""
        self._jobs.put(None)

    def _run(self) -> None:
        name_os_thread(self._thread.name)
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job.run()
