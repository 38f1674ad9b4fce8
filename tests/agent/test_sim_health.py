"""The simulated GPUs' health: a scenario's [[events]], played through the agent's real health readers."""
from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from clusterwatch.agent.backends.sim import SimGpuSource, open_sim_source
from clusterwatch.agent.backends.sim_nvml import SimNvml
from clusterwatch.agent.backends.sim_scenario import SimEvent, parse_scenario
from clusterwatch.agent.health.counters import CounterReader
from clusterwatch.agent.health.monitor import counters_to_proto, open_health
from clusterwatch.collector.health.decisions import GpuUser
from clusterwatch.collector.health.engine import HealthEngine
from clusterwatch.collector.health.xid_catalog import load_catalog
from clusterwatch.v1 import agent_pb2

from clusterwatch.errors import ConfigError
from clusterwatch.model import GpuUse
from tests.support.helpers import SIM_RUN, clean_environ, popen_exec_done

GPUS = '[gpus]\ncount = 2\n\n[profiles.steady]\nkind = "steady"\nmemory_mib = 1000\n'
T0 = 1_800_000_000.0


class Clock:
    """A wall clock the test moves."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def sim(events: list[SimEvent], clock: Clock) -> SimNvml:
    return SimNvml(["GPU-s0", "GPU-s1"], events, started=T0, temperature_c=41, clock=clock)


def test_events_parse_with_their_kinds_keys() -> None:
    text = GPUS + """
[[events]]
at_s = 30
gpu = 1
kind = "xid"
xid = 48

[[events]]
at_s = 60
gpu = 0
kind = "throttle"
reasons = ["hw_slowdown", "hw_thermal_slowdown"]
for_s = 120
temperature_c = 91
node = "n2"
"""
    xid, throttle = parse_scenario(text, "x.toml").events
    assert xid == SimEvent(at_s=30.0, gpu=1, kind="xid", xid=48)
    assert (throttle.kind, throttle.reasons, throttle.for_s, throttle.temperature_c, throttle.node) == (
        "throttle", ("hw_slowdown", "hw_thermal_slowdown"), 120.0, 91, "n2")
    assert throttle.reason_bits == 0x8 | 0x40


@pytest.mark.parametrize(
    "event, problem",
    [
        ('at_s = 1\ngpu = 2\nkind = "lost"', "line 10: [events #1] gpu 2 is not a GPU of the scenario"),
        ('at_s = 1\ngpu = 0\nkind = "xid"', "line 11: [events #1] kind xid needs xid = 48"),
        ('at_s = 1\ngpu = 0\nkind = "lost"\nxid = 79', "line 12: [events #1] xid is not a key of kind lost"),
        ('at_s = 1\ngpu = 0\nkind = "fire"', "line 11: [events #1] kind must be one of xid, lost, throttle"),
        ('gpu = 0\nkind = "lost"', "line 8: [events #1] needs at_s = 30"),
        ('at_s = 1\ngpu = 0\nkind = "throttle"\nreasons = []', "line 12: [events #1] reasons must be a list"),
        ('at_s = 1\ngpu = 0\nkind = "throttle"\nreasons = ["hot"]', "holds unknown reason 'hot'"),
        ('at_s = -1\ngpu = 0\nkind = "lost"', "line 9: [events #1] at_s must not be negative"),
        ('at_s = 1\ngpu = 0\nkind = "lost"\nwhen = 3', "line 12: [events #1] unknown key 'when'"),
    ],
)
def test_a_bad_event_is_one_line_naming_file_line_and_key(tmp_path: Path, event: str, problem: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(GPUS + "\n[[events]]\n" + event + "\n")
    with pytest.raises(ConfigError) as info:
        open_sim_source(str(path), run=SIM_RUN)
    line = str(info.value)
    assert "\n" not in line and line.startswith(f"scenario {path}: ")
    assert problem in line


def test_an_xid_comes_once_at_its_time_to_each_event_set_of_its_gpu() -> None:
    clock = Clock(T0 + 1)
    nvml = sim([SimEvent(at_s=5, gpu=0, kind="xid", xid=48), SimEvent(at_s=6, gpu=1, kind="lost")], clock)
    both, only_gpu1 = nvml.nvmlEventSetCreate(), nvml.nvmlEventSetCreate()
    for index in (0, 1):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlDeviceGetSupportedEventTypes(handle), both)
    nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(1), 0x0008, only_gpu1)
    with pytest.raises(nvml.NVMLError) as early:
        nvml.nvmlEventSetWait_v2(both, 1)
    assert early.value.value == 10                      # NVML's TIMEOUT: nothing due yet
    clock.now = T0 + 10
    got = [nvml.nvmlEventSetWait_v2(both, 1) for _ in range(2)]
    assert [(nvml.nvmlDeviceGetUUID(d.device), d.eventType, d.eventData) for d in got] == [
        ("GPU-s0", 0x0008, 48), ("GPU-s1", 0x0008, 79)]    # the lost GPU's XID 79, as the driver raises it
    with pytest.raises(nvml.NVMLError):
        nvml.nvmlEventSetWait_v2(both, 1)               # each once
    assert nvml.nvmlEventSetWait_v2(only_gpu1, 1).eventData == 79


def test_the_counters_reader_reads_throttling_its_time_and_a_lost_gpu() -> None:
    clock = Clock(T0)
    events = [SimEvent(at_s=100, gpu=0, kind="throttle", reasons=("hw_thermal_slowdown",), for_s=60, temperature_c=93),
              SimEvent(at_s=130, gpu=0, kind="throttle", reasons=("sw_thermal_slowdown",), for_s=60),
              SimEvent(at_s=300, gpu=1, kind="lost")]
    reader = CounterReader(sim(events, clock), clock=clock)

    def read(at_s: float) -> dict[str, object]:
        clock.now = T0 + at_s
        return {c.uuid: (c.clock_event_reasons, c.violation_seconds.get("thermal"), c.temperature_c)
                for c in reader.read()}

    assert read(50) == {"GPU-s0": (0, 0.0, 41), "GPU-s1": (0, 0.0, 41)}
    assert read(140)["GPU-s0"] == (0x40 | 0x20, 40.0, 93)
    assert read(170)["GPU-s0"] == (0x20, 70.0, 41)      # the first has ended; overlapping time counted once
    assert read(250)["GPU-s0"] == (0, 90.0, 41)
    assert read(400) == {"GPU-s0": (0, 90.0, 41)} and reader.lost == {"GPU-s1"}


def test_throttling_raises_gpu_throttle_in_the_collectors_health_engine() -> None:
    # what the agent sends every 30 s, into the collector's engine: five minutes held down is a finding
    clock = Clock(T0)
    reader = CounterReader(sim([SimEvent(at_s=60, gpu=1, kind="throttle", reasons=("hw_slowdown",))], clock),
                           clock=clock)
    engine = HealthEngine(load_catalog())
    users = [GpuUser(job_id="77", rank=3, pid=4242)]
    fired = []
    for at_s in range(0, 600, 30):
        clock.now = T0 + at_s
        for counters in reader.read():
            msg = agent_pb2.GpuHealth()
            counters_to_proto(counters, msg)
            fired += [(at_s, a.rule, a.gpu, a.job_id, a.rank) for a in engine.observe_counters("n1", msg, users)]
    # at 300 s the GPU has been watched the rule's whole five minutes, held down for 240 s of them; once
    assert fired == [(300, "gpu_throttle", "GPU-s1", "77", 3)]


@pytest.fixture
def child() -> Iterator:
    started = []

    def start(**env: str):
        p = popen_exec_done(["sleep", "300"], env={**clean_environ(), "CLUSTERWATCH_SIM_RUN": SIM_RUN, **env})
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()
        p.wait()


def test_a_lost_gpu_leaves_the_sources_polls_and_its_process_stays_on_it_without_figures(child) -> None:
    scenario = parse_scenario(GPUS + '[[events]]\nat_s = 100\ngpu = 1\nkind = "lost"\n', "x.toml")
    now = time.time()
    source = SimGpuSource(scenario, node="n1", run=SIM_RUN, started=now)
    try:
        rank = child(CLUSTERWATCH_SIM_GPU="1")
        uuid1 = source.inventory()[1].uuid
        before = source.poll(now + 10)
        assert [r.uuid for r in before.readings] == [g.uuid for g in source.inventory()] and not before.stale
        assert before.processes[rank.pid][0].used_memory_bytes == 1000 << 20
        after = source.poll(now + 110)
        assert [r.uuid for r in after.readings] == [source.inventory()[0].uuid] and after.stale == [uuid1]
        assert after.processes[rank.pid] == [GpuUse(uuid1)]   # a gap, not a freed GPU
    finally:
        source.close()


def test_only_a_scenario_with_events_for_this_node_has_health() -> None:
    other_node = parse_scenario(GPUS + '[[events]]\nat_s = 1\ngpu = 1\nkind = "lost"\nnode = "n2"\n', "x.toml")
    assert SimGpuSource(other_node, node="n1", run=SIM_RUN).health_nvml is None
    assert open_health("sim", None, sim_nvml=None) is None
    mine = SimGpuSource(other_node, node="n2", run=SIM_RUN)
    assert mine.health_nvml is not None
    assert open_health("sim", None, sim_nvml=mine.health_nvml).parts == ["nvml"]
