"""What the live rules see of a node's batches: its processes every look (--rules-interval), from a batch's latest
sample and the history points between; a node they would still see too seldom is told of, once (live.py)."""
from __future__ import annotations

import logging
import random

from clusterwatch.collector.alerting.alerts import AlertStore
from clusterwatch.collector.alerting.live import Alerting
from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.rules import load_rules
from clusterwatch.collector.state.core import new_cluster_state
from clusterwatch.collector.state.store import open_db

T0 = 1_800_000_000.0


def _alerting(tmp_path, look_s: float) -> Alerting:
    config = CollectorConfig(db_path=str(tmp_path / "cw.db"))
    state = new_cluster_state(config)
    for node, every_s in (("slow-sender", 5.0), ("fast-sender", 0.5)):
        state.hello(node, f"boot-{node}", "1.0", 0.5, "sim", 1 << 34, [], T0).send_interval_s = every_s
    return Alerting(load_rules(None), state, AlertStore(open_db(config.db_path)), min_interval_s=look_s)


def test_batches_further_apart_than_the_rules_look_are_said_once_per_node(tmp_path, caplog):
    alerting = _alerting(tmp_path, look_s=0.7)  # a rules file whose shortest leak bucket is 2 s
    with caplog.at_level(logging.WARNING, logger="clusterwatch.collector"):
        for i in range(3):
            alerting.on_samples("slow-sender", [], T0 + 5 * i)
            alerting.on_samples("fast-sender", [], T0 + 5 * i)
    said = [r.getMessage() for r in caplog.records if "sends a batch every" in r.getMessage()]
    assert said == ["node slow-sender: the rules want a look at each process every 0.7 s (the shortest leak bucket "
                    "over 3, or --rules-interval), but its agent sends a batch every 5 s and history keeps a point "
                    "every 5 s: live they see one sample every 5 s; give its agent --send-interval 0.7 or less, or "
                    "lengthen the rules file's buckets"], said


def test_the_default_rules_say_nothing_however_far_apart_the_batches(tmp_path, caplog):
    alerting = _alerting(tmp_path, look_s=5.0)
    alerting.state.nodes["slow-sender"].send_interval_s = 30.0  # the rules look at the history points between
    with caplog.at_level(logging.WARNING, logger="clusterwatch.collector"):
        alerting.on_samples("slow-sender", [], T0)
    assert not [r for r in caplog.records if "sends a batch every" in r.getMessage()]


# -- what the rules see of a batch longer than a look ------------------------------------------------

GIB = 1 << 30


def _leaking_batches(polls_a_batch: int, minutes: int, leak_gib_per_h: float = 1.0, noise_mib: float = 150.0):
    """A rank whose GPU memory grows from its 31st minute (after the rule's 30 minutes of warm-up) under noise a
    bucket's minimum sees through only with most of its samples, polled every second, sent `polls_a_batch` polls a
    batch: (the batch's last time, the batch)."""
    from clusterwatch.model import GpuUse, ProcessSample

    from .test_ingest_integrity import make_batch

    rng = random.Random(7)
    rows, seq = [], 0
    for k in range(minutes * 60):
        t = T0 + k
        used = 20 * GIB + max(0.0, k - 1860) / 3600 * leak_gib_per_h * GIB + abs(rng.gauss(0, noise_mib)) * (1 << 20)
        rows.append(ProcessSample(t, "n1", 101, T0 - 100, ppid=1, uid=1000, user="alice", command="python",
                                  job_id="7", rank=0, cpu_percent=90.0, rss_bytes=4 * GIB, threads=30,
                                  open_fds=90, gpus=(GpuUse("GPU-a", int(used), 95.0),)))
        if len(rows) == polls_a_batch:
            seq += 1
            yield t, make_batch(seq, rows)
            rows = []


class _Seen(Alerting):
    """Alerting that keeps what its engine was shown of process 101 and the first leak it raised."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.looks: list[float] = []
        self.leak_at: float | None = None
        observe = self.engine.observe

        def spy(obs):
            self.looks.append(obs.t)
            return observe(obs)

        self.engine.observe = spy

    def handle(self, events, now) -> None:
        for e in events:
            if e.rule == "gpu_memory_leak" and e.state == "firing" and self.leak_at is None:
                self.leak_at = e.t
        super().handle(events, now)


def _run(tmp_path, polls_a_batch: int, minutes: int) -> _Seen:
    from clusterwatch.collector.state.core import CollectorCore
    from clusterwatch.collector.state.store import Store
    from clusterwatch.v1 import agent_pb2

    config = CollectorConfig(db_path=str(tmp_path / f"cw-{polls_a_batch}.db"))
    state = new_cluster_state(config)
    seen = _Seen(load_rules(None), state, AlertStore(open_db(config.db_path)), min_interval_s=5.0)
    clock = [T0]
    core = CollectorCore(config, Store(open_db(config.db_path)), clock=lambda: clock[0], listeners=(seen,),
                         state=state)
    core.hello(agent_pb2.Hello(node="n1", boot_id="b1", agent_version="t", interval_s=1.0,
                               send_interval_s=float(polls_a_batch),
                               gpus=[agent_pb2.GpuInfo(uuid="GPU-a", index=0, name="sim",
                                                       memory_total_bytes=80 * GIB)]),
               authenticated=True)
    for t, batch in _leaking_batches(polls_a_batch, minutes):
        clock[0] = t
        assert core.batch("n1", "b1", batch)
    return seen


def test_a_batch_of_thirty_polls_is_looked_at_every_five_seconds(tmp_path):
    seen = _run(tmp_path, 30, minutes=3)
    gaps = sorted({round(b - a) for a, b in zip(seen.looks, seen.looks[1:], strict=False)})
    # a look at most every 5 s (--rules-interval), the history's points 5 s apart between a batch's ends: never
    # one look a batch (30 s)
    assert 5 <= gaps[0] and gaps[-1] < 10, gaps
    assert len(seen.looks) >= 3 * 60 / 10


def test_a_noisy_leak_is_raised_as_soon_from_thirty_second_batches_as_from_five(tmp_path):
    five, thirty = _run(tmp_path, 5, minutes=60), _run(tmp_path, 30, minutes=60)
    assert five.leak_at is not None and thirty.leak_at is not None
    # The same looks, so the same bucket minima and the same alert, within a bucket (a look's samples fall on other
    # seconds). One look a batch took the minimum of 2 samples a bucket, not 12, and raised it 6 minutes later.
    assert abs(thirty.leak_at - five.leak_at) <= 60, (five.leak_at - T0, thirty.leak_at - T0)
