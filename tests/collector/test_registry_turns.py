"""Shards' registries take turns: a deployment of N collectors lists Slurm's jobs once an interval in all, as
one collector does, not N times (issue 19); one collector keeps its interval."""
from __future__ import annotations

import asyncio

import pytest
from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.jobmap.fake import FakeJobMapper
from clusterwatch.collector.jobmap.registry import JobRegistry, build_registry
from clusterwatch.collector.state.core import CollectorCore
from clusterwatch.collector.state.store import Store, open_db

from clusterwatch.shards import Collectors
from tests.collector.test_registry import T0, Clock, record

SHARDS = ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]
INTERVAL = 5.0


def registry(clock: Clock, shard: str | None, jobs) -> JobRegistry:
    config = CollectorConfig(slurm_refresh_s=INTERVAL, collectors=",".join(SHARDS) if shard else "", shard=shard)
    core = CollectorCore(config, Store(open_db(":memory:")), clock=clock)
    built = build_registry(core, config)
    built.mapper = FakeJobMapper(jobs)
    built.clock = clock  # the registry's own clock is Unix time; the turns are on it
    return built


def play(registries: list[JobRegistry], clock: Clock, seconds: float) -> list[list[float]]:
    """Run each registry's loop (a pass, then next_delay) on the fake clock; the times of each one's passes."""
    passes: list[list[float]] = [[] for _ in registries]
    due = [clock.now + i * 0.37 for i in range(len(registries))]  # started a little apart, as processes are
    end = clock.now + seconds
    while min(due) < end:
        i = due.index(min(due))
        clock.now = due[i]
        asyncio.run(registries[i].refresh())
        passes[i].append(clock.now)
        due[i] = clock.now + registries[i].next_delay()
    return passes


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_three_shards_list_as_often_as_one_collector(clock: Clock) -> None:
    jobs = [record(job_id=100 + i) for i in range(12)]
    one = registry(clock, None, jobs)
    [alone] = play([one], clock, 600)
    clock.now = T0
    shards = [registry(clock, s, jobs) for s in SHARDS]
    play(shards, clock, 600)
    listings = [sum(1 for method, _ in r.mapper.calls if method == "list_jobs") for r in shards]
    # one collector: a pass every interval; three shards: one listing an interval in all (each shard's first
    # pass at its start aside), where each shard used to list every interval
    assert len(alone) == 120
    assert sum(listings) <= len(alone) + len(SHARDS), listings
    assert all(38 <= n <= 42 for n in listings), listings


def test_each_shard_passes_in_its_own_slots(clock: Clock) -> None:
    shards = [registry(clock, s, [record()]) for s in SHARDS]
    passes = play(shards, clock, 300)
    slots = [{round(t / INTERVAL) % len(SHARDS) for t in times[1:]} for times in passes]
    assert slots == [{0}, {1}, {2}]  # the shards' places in the list, never two in one slot
    for times in passes:
        gaps = {round(b - a, 6) for a, b in zip(times[1:], times[2:], strict=False)}
        assert gaps == {INTERVAL * len(SHARDS)}


def test_a_turn_is_not_taken_twice_by_a_sleep_that_wakes_early(clock: Clock) -> None:
    shard = registry(clock, SHARDS[1], [])
    period = INTERVAL * len(SHARDS)
    start = (T0 // period + 1) * period + INTERVAL  # a start of shard 1's turn
    clock.now = start - 0.002  # woken 2 ms early, its pass done
    assert shard.next_delay() == pytest.approx(period + 0.002)
    clock.now = start + 1.5  # woken late, or a slow pass: the next turn, not a pass at once
    assert shard.next_delay() == pytest.approx(period - 1.5)


def test_one_collector_keeps_its_interval_and_a_shard_backs_off_from_its_period(clock: Clock) -> None:
    one = registry(clock, None, [])
    assert one.turn is None and one.next_delay() == INTERVAL
    shard = registry(clock, SHARDS[2], [])
    assert shard.turn == (2, 3)
    shard.failures = 1
    assert shard.next_delay() == pytest.approx(30.0)  # its period, 15 s, doubled
    shard.failures = 5  # capped at max_backoff_s (60 s)
    assert shard.next_delay() == pytest.approx(60.0)


def test_a_shard_of_the_earlier_list_has_its_place_too(clock: Clock) -> None:
    config = CollectorConfig(slurm_refresh_s=INTERVAL, collectors=",".join(SHARDS[:2]),
                             collectors_before=f"500={SHARDS[2]}", shard=SHARDS[2])
    core = CollectorCore(config, Store(open_db(":memory:")), clock=clock)
    built = build_registry(core, config)
    members = Collectors.parse(config.collectors, config.collectors_before).all
    assert built.turn == (members.index(SHARDS[2]), len(members)) == (2, 3)
