"""History as columns in a ring (collector/state/point_ring.py, issue 19): what a deque of tuples gave its readers
(order, len, maxlen, [-1], None for unknown)."""
from __future__ import annotations

import random
from collections import deque

import pytest
from clusterwatch.collector.state.cluster import Point, process_history
from clusterwatch.collector.state.point_ring import GpuRing, PowerRing

T0 = 1_800_000_000.0


def _random_point(rng: random.Random, t: float) -> Point:
    def maybe(v):
        return None if rng.random() < 0.2 else v

    return Point(t, maybe(rng.uniform(0, 800)), maybe(rng.randrange(1 << 40)), maybe(rng.randrange(1 << 37)),
                 maybe(rng.uniform(0, 100)), maybe(rng.randrange(1, 500)), maybe(rng.randrange(0, 70000)))


@pytest.mark.parametrize("maxlen", [0, 1, 7, 720])
def test_the_ring_reads_as_a_deque_of_points(maxlen: int) -> None:
    rng = random.Random(maxlen)
    ring, reference = process_history(maxlen), deque(maxlen=maxlen)
    for i in range(3 * maxlen + 5):
        p = _random_point(rng, T0 + i)
        ring.append(p)
        reference.append(p)
        assert len(ring) == len(reference) and ring.maxlen == maxlen
        if i % 3 == 0 or i > 3 * maxlen:
            assert list(ring) == list(reference)
            if reference:
                assert ring[-1] == reference[-1] and ring[0] == reference[0]
                assert ring.last_t == reference[-1].t
                assert ring[len(ring) // 2] == reference[len(reference) // 2]
            since = T0 + i - rng.randrange(maxlen + 3)
            newer = [p for p in reference if p.t > since]
            assert ring.times_after(since) == [p.t for p in newer]
            assert [ring[i - len(newer)] for i in range(len(newer))] == newer
    # named fields, and tuple(p) as trace.py takes it
    if reference:
        last = ring[-1]
        assert isinstance(last, Point) and last.t == reference[-1].t and tuple(last) == tuple(reference[-1])
        assert ring.column(2) == [p.rss_bytes for p in reference]
    with pytest.raises(IndexError):
        ring[len(reference)]


@pytest.mark.parametrize("maxlen", [0, 2, 5])
def test_a_gpu_s_rings_read_as_deques_of_plain_tuples(maxlen: int) -> None:
    rng = random.Random(maxlen)
    gpu, power = GpuRing(maxlen), PowerRing(maxlen)
    ref_gpu, ref_power = deque(maxlen=maxlen), deque(maxlen=maxlen)
    for i in range(4 * maxlen + 3):
        reading = (T0 + i, None if i % 3 == 0 else rng.uniform(0, 100), None if i % 4 == 0 else rng.randrange(1 << 36))
        watts = (T0 + i, None if i % 5 == 0 else rng.uniform(60, 700))
        for ring, ref, row in ((gpu, ref_gpu, reading), (power, ref_power, watts)):
            ring.append(row)
            ref.append(row)
            assert list(ring) == list(ref) and len(ring) == len(ref)
    assert all(type(r) is tuple for r in gpu)
    if maxlen:
        assert gpu[-1] == ref_gpu[-1] and power.last_t == ref_power[-1][0]


def test_zero_is_a_reading_not_unknown() -> None:
    gpu = GpuRing(3)
    gpu.append((T0, 0.0, 0))
    gpu.append((T0 + 1, None, None))
    assert list(gpu) == [(T0, 0.0, 0), (T0 + 1, None, None)]


def test_a_gpu_memory_sum_past_int64_is_kept_as_unknown_not_raised() -> None:
    ring = process_history(2)
    ring.append((T0, 1.0, 5, 2048 * (1 << 52), 1.0, 3, 4))  # 2,048 GPU uses at ingest_checks' bound, summed
    assert ring[-1] == Point(T0, 1.0, 5, None, 1.0, 3, 4)
