"""Take each training process's provenance once, off the poll loop.

git in a large repository can take a second or more; the poll must not wait for it.
New rank processes are queued; a single worker thread records them (as each
process's owner, see provenance/) and the poll loop drains the finished records
into the next batch.
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from clusterwatch.background import BackgroundThread
from clusterwatch.model import ProcessSample

from .gitrun import kill_running
from .provenance import GitStateCache, Provenance, ProvenanceConfig, provenance_of_pid

# At most this many processes wait for a record; a burst beyond it is skipped, not queued forever.
MAX_PENDING = 256


class ProvenanceWorker:
    """Records the provenance of every new rank process once.

    Args:
        config: how git is run.
        capture: the capture function (tests pass their own).
    """

    def __init__(self, config: ProvenanceConfig | None = None,
                 capture: Callable[[int, ProvenanceConfig], Provenance] | None = None) -> None:
        self.config = config or ProvenanceConfig()
        # one git state for the ranks that start together in one checkout (see GitStateCache)
        self.git_cache = GitStateCache()
        self._capture = capture or (lambda pid, cfg: provenance_of_pid(pid, cfg, git_cache=self.git_cache))
        self._seen: dict[tuple[int, float], None] = {}  # the processes offered, the newest last
        self._todo: queue.Queue = queue.Queue(MAX_PENDING)
        self._done: list[Provenance] = []
        self._lock = threading.Lock()
        self.skipped = 0
        self.captured = 0  # captures run (once per new rank process)
        self._thread = BackgroundThread(self._run, name="clusterwatch-provenance", os_name="cw-provenance")
        self._thread.start()

    def offer(self, samples: list[ProcessSample]) -> None:
        """Queue the rank processes (job members not merely inherited from a parent) not yet recorded."""
        for s in samples:
            if not s.job_id or s.mapped_by == "tree":
                continue
            key = (s.pid, s.start_time)
            if key in self._seen:
                continue
            self._seen[key] = None
            try:
                self._todo.put_nowait(s.pid)
            except queue.Full:
                self.skipped += 1
        # The agent offers each process at its first sight only, so this is a guard, not the record of every
        # live process: the oldest are forgotten, so it stays bounded.
        while len(self._seen) > 4 * MAX_PENDING:
            del self._seen[next(iter(self._seen))]

    def drain(self) -> list[Provenance]:
        with self._lock:
            done, self._done = self._done, []
        return done

    def stop(self, timeout: float = 2.0) -> None:
        """Take no more records; kill the git call running now (and anything it started)."""
        self._thread.stopping.set()
        try:
            self._todo.put_nowait(None)  # wakes a worker waiting for work
        except queue.Full:
            pass  # a busy worker sees `stopping` before its next record
        deadline = time.monotonic() + timeout
        while not self._thread.stop(0.0) and time.monotonic() < deadline:
            kill_running()  # again while it lasts: a call may have started after the last kill
            self._thread.stop(0.1)

    def _run(self) -> None:
        stopping = self._thread.stopping
        while True:
            pid = self._todo.get()
            try:
                if pid is None or stopping.is_set():
                    return
                record = self._capture(pid, self.config)
                self.captured += 1
                if record.pid is not None and record.start_time:
                    with self._lock:
                        self._done.append(record)
            finally:
                self._todo.task_done()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every queued process has been recorded; False if that took longer than `timeout` s."""
        deadline = time.monotonic() + timeout
        with self._todo.all_tasks_done:
            while self._todo.unfinished_tasks:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._todo.all_tasks_done.wait(left)
        return True

    def close(self) -> None:
        try:
            self._todo.put_nowait(None)
        except queue.Full:
            pass
