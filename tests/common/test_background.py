"""BackgroundThread: named as Python and the system show it, stopped within one wait, says whether it ended."""
from __future__ import annotations

import threading

from clusterwatch.background import BackgroundThread


def test_the_thread_carries_both_names_and_a_stop_ends_its_wait() -> None:
    seen: dict[str, str] = {}
    named = threading.Event()

    def loop() -> None:
        seen["python"] = threading.current_thread().name
        with open(f"/proc/self/task/{threading.get_native_id()}/comm") as f:
            seen["os"] = f.read().strip()
        named.set()
        while not background.stopping.is_set():
            background.stopping.wait(60)   # only a stop ends this wait in time

    background = BackgroundThread(loop, name="clusterwatch-test-loop", os_name="cw-test-loop-long")
    background.start()
    assert named.wait(10.0)
    assert background.stop(10.0) is True   # well before the loop's own 60 s wait is over
    assert seen == {"python": "clusterwatch-test-loop", "os": "cw-test-loop-lo"}  # the kernel keeps 15 bytes


def test_stop_says_the_thread_is_still_running_when_the_loop_does_not_look() -> None:
    release = threading.Event()
    background = BackgroundThread(lambda: release.wait(30), name="clusterwatch-test-stuck", os_name="cw-test-stuck")
    background.start()
    try:
        assert background.stop(0.05) is False   # inside a call that ignores `stopping` (a driver's wait)
        assert background.stopping.is_set()
    finally:
        release.set()
    assert background.stop(10.0) is True


def test_a_thread_never_started_has_ended() -> None:
    background = BackgroundThread(lambda: None, name="clusterwatch-test-idle", os_name="cw-test-idle")
    assert background.stop(0.0) is True
    assert background.stopping.is_set()
