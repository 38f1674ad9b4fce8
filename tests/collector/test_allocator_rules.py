"""The leak rules over the allocator's own figures (issue 16 part 1): allocated bytes growing is a leak, said as
such; the cache (reserved rising in steps and levelling off, allocated flat) is none; reserved minus allocated
growing while allocation retries rise is gpu_memory_fragmentation, which suggests expandable_segments."""
from __future__ import annotations

import re

from clusterwatch.collector.rules import Engine, ProcessObservation, load_rules, parse_rules
from clusterwatch.collector.state.observations import process_from_record

MIB, GIB = 1 << 20, 1 << 30
CONTEXT = 500 * MIB  # the CUDA context: NVML's figure is it plus the allocator's reserve
POLL = 30.0


def _run(points, allocator: bool = True, mapping: bool = False) -> list:
    """points: (t, allocated, reserved, retries) every POLL; NVML's figure is the context plus reserved."""
    eng = Engine(load_rules())
    evs = []
    for t, allocated, reserved, retries in points:
        obs = ProcessObservation(t=t, node="n1", job_id="5", pid=7, rank=0, gpu="GPU-a",
                                 gpu_mem_bytes=CONTEXT + reserved, gpu_mem_total_bytes=80 * GIB, gpu_util=90.0)
        if allocator:
            obs = obs._replace(gpu_allocated_bytes=allocated, gpu_reserved_bytes=reserved, gpu_alloc_retries=retries)
        if mapping:  # as replay reads a trace line
            d = {k: v for k, v in obs._asdict().items() if v is not None}
            evs += eng.observe(process_from_record(d))
        else:
            evs += eng.observe(obs)
    return evs


def _firing(evs, rule: str | None = None) -> list:
    return [e for e in evs if e.state == "firing" and (rule is None or e.rule == rule)]


def _hours(h: float):
    return (i * POLL for i in range(int(h * 3600 / POLL)))


def test_allocated_tensors_growing_while_nvml_stays_flat_is_a_leak_naming_the_allocator():
    # the allocator reserved 20 GiB up front (NVML flat); live tensors grow 80 MiB/h inside it
    points = [(t, 4 * GIB + 80 * MIB * t / 3600, 20 * GIB, 0) for t in _hours(6)]
    for mapping in (False, True):
        [ev] = _firing(_run(points, mapping=mapping))
        assert ev.rule == "gpu_memory_leak" and ev.figures["source"] == "allocator"
        assert "allocated tensors grow" in ev.description and "the allocator's figure" in ev.description
        m = re.search(r"grow (\d+) MiB/h", ev.description)
        assert m and 60 <= int(m.group(1)) <= 100, ev.description
    assert _firing(_run(points, allocator=False)) == []    # NVML's figure alone: flat, nothing to see


def _cache_warming(t: float) -> float:
    """The reserve steps up 256 MiB every 10 min for 3 h (1.5 GiB/h), then stays."""
    return 2 * GIB + min(int(t // 600), 18) * 256 * MIB


def test_a_reserve_that_steps_up_and_levels_off_while_allocated_stays_flat_raises_nothing():
    points = [(t, 2 * GIB, _cache_warming(t), 0) for t in _hours(8)]
    assert _firing(_run(points)) == []
    # the same NVML curve without the allocator's figures reads as a leak: what the figures are for
    assert [e.rule for e in _firing(_run(points, allocator=False))] == ["gpu_memory_leak"]


def test_free_cache_growing_with_retries_rising_is_fragmentation():
    # allocated steady around 30 GiB, the reserve creeps up 300 MiB/h, the allocator retries more and more
    points = [(t, 30 * GIB + (t % 600) * MIB, 32 * GIB + 300 * MIB * t / 3600, int(t // 900)) for t in _hours(6)]
    evs = _run(points)
    [ev] = _firing(evs)
    assert ev.rule == "gpu_memory_fragmentation" and ev.severity == "warning"
    assert "reserved minus allocated grows" in ev.description
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in ev.description
    assert ev.figures["alloc_retries"] > ev.figures["alloc_retries_before"]
    # the same growth without retries: a cache that grows, no fault
    still = [(t, a, r, 3) for t, a, r, _ in points]
    assert _firing(_run(still), "gpu_memory_fragmentation") == []


def test_fragmentation_is_a_rule_of_the_rules_file():
    rules = parse_rules("[gpu_memory_fragmentation]\nmin_rate_mb_per_h = 500\nseverity = \"critical\"\n")
    assert rules.gpu_memory_fragmentation.min_rate_per_h == 500 * MIB   # the leak keys' MB are MiB
    assert rules.gpu_memory_fragmentation.severity == "critical"
    off = parse_rules("[gpu_memory_fragmentation]\nenabled = false\n")
    points = [(t, 30 * GIB, 32 * GIB + 300 * MIB * t / 3600, int(t // 900)) for t in _hours(6)]
    eng = Engine(off)
    evs = []
    for t, a, r, n in points:
        evs += eng.observe(ProcessObservation(t=t, node="n1", pid=7, gpu_mem_bytes=CONTEXT + r, gpu_allocated_bytes=a,
                                              gpu_reserved_bytes=r, gpu_alloc_retries=n))
    assert _firing(evs) == []


def test_a_leak_raised_on_nvmls_figure_resolves_once_the_allocators_figures_arrive():
    eng = Engine(load_rules())
    evs = []
    for t in _hours(4):  # NVML's figure grows 1 GiB/h, no allocator figures: a leak, as today
        evs += eng.observe(ProcessObservation(t=t, node="n1", pid=7, gpu_mem_bytes=4 * GIB + GIB * t / 3600,
                                              gpu_mem_total_bytes=80 * GIB))
    assert [e.rule for e in _firing(evs)] == ["gpu_memory_leak"] and "source" not in _firing(evs)[0].figures
    evs = eng.observe(ProcessObservation(t=4 * 3600.0, node="n1", pid=7, gpu_mem_bytes=8 * GIB,
                                         gpu_mem_total_bytes=80 * GIB, gpu_allocated_bytes=3 * GIB,
                                         gpu_reserved_bytes=7 * GIB))
    assert [(e.rule, e.state) for e in evs] == [("gpu_memory_leak", "resolved")]
    assert "judged on the allocator's figures from now on" in evs[0].description
    assert eng.active() == []
