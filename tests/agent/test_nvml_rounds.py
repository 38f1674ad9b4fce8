"""Rounds: the GPUs read in turn on one thread, a GPU that overran its deadline set apart."""
from __future__ import annotations

import threading
import time

import pytest
from clusterwatch.agent.backends.nvml_rounds import Rounds


class Gpus:
    """Reads that take `slow[key]` seconds; records any key read by two threads at once."""

    def __init__(self) -> None:
        self.slow: dict[int, float] = {}
        self.inside: set[int] = set()
        self.overlaps: list[int] = []
        self.threads: dict[int, set[str]] = {}
        self.lock = threading.Lock()

    def read(self, key: int, now: float) -> tuple[int, float]:
        with self.lock:
            if key in self.inside:
                self.overlaps.append(key)
            self.inside.add(key)
            self.threads.setdefault(key, set()).add(threading.current_thread().name)
        time.sleep(self.slow.get(key, 0.0))
        with self.lock:
            self.inside.discard(key)
        if key == 3:
            raise ValueError("a bug in one GPU's read")
        return key, now


@pytest.mark.serial  # times a round against its 0.3 s deadline (under 0.9 s, the wedged call takes 1 s)
def test_a_wedged_gpu_is_set_apart_and_rejoins() -> None:
    gpus = Gpus()
    rounds = Rounds(0.3, back_after=2)
    first = rounds.run(gpus.read, [0, 1, 2], 1.0)
    assert first.done == {0: (True, (0, 1.0)), 1: (True, (1, 1.0)), 2: (True, (2, 1.0))}
    assert first.late == [] and first.newly_late == []
    gpus.slow[1] = 1.0
    t0 = time.monotonic()
    wedged = rounds.run(gpus.read, [0, 1, 2], 2.0)
    assert time.monotonic() - t0 < 0.9  # the deadline, not the call
    # 0 came before it in turn; 2 after it waited behind it this once.
    assert set(wedged.done) == {0} and wedged.late == [1, 2] and wedged.newly_late == [1]
    after = rounds.run(gpus.read, [0, 1, 2], 3.0)
    assert set(after.done) == {0, 2} and after.late == [1] and after.newly_late == []  # still inside its call
    gpus.slow[1] = 0.0
    time.sleep(1.0)
    for now in (4.0, 5.0):
        back = rounds.run(gpus.read, [0, 1, 2], now)
        assert back.done[1] == (True, (1, now)) and back.late == []
    assert "cw-nvml1" in gpus.threads[1]  # it had a thread of its own meanwhile
    assert not rounds.busy
    assert gpus.overlaps == []
    rounds.stop()


def test_one_gpu_s_exception_is_its_own() -> None:
    gpus = Gpus()
    rounds = Rounds(1.0)
    out = rounds.run(gpus.read, [3, 4], 1.0)
    ok, exc = out.done[3]
    assert not ok and isinstance(exc, ValueError)
    assert out.done[4] == (True, (4, 1.0))
    rounds.stop()
