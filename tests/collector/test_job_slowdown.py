"""job_slowdown over generated traces: slowdowns with each culprit and none, the look-alikes that are not
faults, a recovery, the GPU side alone, and the rule's settings per job (tests/support/slowdown_traces.py)."""
from __future__ import annotations

import pytest
from clusterwatch.collector.rules import load_rules, parse_rules
from clusterwatch.collector.rules.causes import RankFigures
from clusterwatch.collector.rules.slowdown_causes import GpuPaceFigures, slowdown_cause

from clusterwatch.errors import ConfigError
from tests.support.slowdown_traces import (
    CULPRIT_VARIANTS,
    CULPRITS,
    GPU_ONLY_LOOKALIKES,
    LOOKALIKES,
    Scenario,
    Trace,
    generate,
    gpu_of,
)

RULES = load_rules()


def _slowdown(events):
    return [e for e in events if e.rule == "job_slowdown"]


@pytest.mark.parametrize("culprit", CULPRITS)
def test_a_slowdown_fires_with_its_figures_and_names_its_culprit(culprit: str) -> None:
    sc = Scenario(culprit, culprit=culprit, drop=0.3, culprit_rank=3, seed=1)
    events = _slowdown(generate(sc).run(RULES))
    assert [e.state for e in events] == ["firing", "resolved"]
    fired = events[0]
    assert sc.start_s < fired.t <= sc.start_s + 900  # within 15 min of the fall
    assert fired.job_id == "slow-1" and fired.pid == -1
    f = fired.figures
    assert f["baseline_per_s"] == pytest.approx(2.0, rel=0.05)  # the rate at speed
    assert f["drop_percent"] == pytest.approx(30, abs=6)
    assert sc.start_s - 300 <= f["since"] <= sc.start_s + 120  # since when, within a checkpoint's pause
    assert f["cause"] == culprit
    if culprit == "none":
        assert "cause_rank" not in f and "no rank stands out" in fired.description
    else:
        assert f["cause_rank"] == 3 and "rank 3" in fired.description
    if culprit in ("gpu_clocks", "gpu_power_cap", "gpu_hot", "gpu_link_errors"):
        assert f["cause_gpu"] == gpu_of(3)
    assert f"runs {f['drop_percent']:.0f} % slower" in fired.description
    assert events[1].figures.get("ended_while_firing") is True  # it lasted until the job ended


@pytest.mark.parametrize(("culprit", "variant"), CULPRIT_VARIANTS)
def test_a_culprit_drawn_otherwise_and_its_look_alikes(culprit: str, variant: str) -> None:
    sc = Scenario(variant, culprit=culprit, variant=variant, drop=0.35, culprit_rank=1, seed=2)
    fired = [e for e in _slowdown(generate(sc).run(RULES)) if e.state == "firing"]
    assert len(fired) == 1 and fired[0].figures["cause"] == culprit, fired
    if culprit != "none":
        assert fired[0].figures["cause_gpu"] == gpu_of(1)


def test_a_gpu_held_between_the_health_reads_is_seen_by_its_violation_time_alone() -> None:
    sc = Scenario("cycles", culprit="gpu_clocks", variant="thermal_cycles", drop=0.35, culprit_rank=1, seed=2)
    trace = generate(sc)
    fired = [e for e in _slowdown(trace.run(RULES)) if e.state == "firing"]
    assert "by NVML's violation time" in fired[0].description
    sampled = Trace(sc, [o._replace(violation_s=None) if hasattr(o, "violation_s") else o for o in trace.observations])
    fired = [e for e in _slowdown(sampled.run(RULES)) if e.state == "firing"]
    assert fired[0].figures["cause"] == "none"  # the reasons read every 30 s never catch it


@pytest.mark.parametrize("look", LOOKALIKES)
def test_look_alikes_stay_quiet(look: str) -> None:
    for seed in range(2):
        assert _slowdown(generate(Scenario(look, lookalike=look, seed=seed)).run(RULES)) == []


def test_a_slowdown_that_ends_resolves_once_back_to_speed() -> None:
    sc = Scenario("recovers", culprit="gpu_clocks", drop=0.35, end_s=7800.0)
    events = _slowdown(generate(sc).run(RULES))
    assert [e.state for e in events] == ["firing", "resolved"]
    back = events[1]
    assert 7800 < back.t <= 7800 + 600
    assert "back to speed" in back.description and not back.figures.get("ended_while_firing")
    assert back.figures["rate_per_s"] == pytest.approx(2.0, rel=0.1)


def test_a_small_fall_is_no_slowdown() -> None:
    sc = Scenario("small", culprit="gpu_clocks", drop=0.1)
    assert _slowdown(generate(sc).run(RULES)) == []


def test_the_gpu_side_alone_names_the_held_gpu_of_a_job_without_steps() -> None:
    sc = Scenario("gpu-only", culprit="gpu_clocks", drop=0.35, steps=False, culprit_rank=1)
    events = _slowdown(generate(sc).run(RULES))
    assert [e.state for e in events] == ["firing", "resolved"]
    fired = events[0]
    assert sc.start_s < fired.t <= sc.start_s + 900
    assert fired.gpu == gpu_of(1) and fired.rank == 1 and fired.figures["cause"] == "gpu_clocks"
    assert "judged from the GPUs alone" in fired.description


@pytest.mark.parametrize("look", GPU_ONLY_LOOKALIKES)
def test_gpu_side_look_alikes_stay_quiet(look: str) -> None:
    assert _slowdown(generate(Scenario(look, lookalike=look, steps=False)).run(RULES)) == []


def test_thresholds_per_job_and_the_allow_list() -> None:
    trace = generate(Scenario("x", culprit="none", drop=0.3))
    lenient = parse_rules('[[overrides]]\njob_name = "llm"\njob_slowdown = { drop_percent = 40 }\n')
    assert _slowdown(trace.run(lenient)) == []
    other_job = parse_rules('[[overrides]]\njob_name = "other"\njob_slowdown = { drop_percent = 40 }\n')
    assert len(_slowdown(trace.run(other_job))) == 2
    allowed = parse_rules('[[allow]]\nuser = "ana"\nrules = ["job_slowdown"]\nreason = "benchmarks"\n')
    assert _slowdown(trace.run(allowed)) == []
    strict = parse_rules("[job_slowdown]\ndrop_percent = 10\nfor_s = 300\n")
    assert strict.job_slowdown.for_s == 300 and len(_slowdown(generate(Scenario("s", culprit="none",
                                                                                drop=0.15)).run(strict))) == 2


def test_the_rules_file_checks_its_keys() -> None:
    with pytest.raises(ConfigError, match="drop_pct"):
        parse_rules("[job_slowdown]\ndrop_pct = 10\n")


def test_the_cause_most_specific_first() -> None:
    gpus = [GpuPaceFigures("n0", "G0", 0, 0, 0.0, 0, 0.0, 66.0), GpuPaceFigures("n0", "G1", 1, 1, 0.6, 0x8, 0.0, 90.0),
            GpuPaceFigures("n1", "G2", 0, 2, 0.02, 0, 0.0, 65.0)]
    ranks = [RankFigures(0, "n0", 10, "G0", 5, 98.0, 400.0), RankFigures(1, "n0", 11, "G1", 5, 40.0, 300.0),
             RankFigures(2, "n1", 12, "G2", 5, 98.0, 410.0)]
    assert slowdown_cause(gpus, ranks, [], 0.25).kind == "gpu_clocks"  # clocks before heat and activity
    cool = [g if g.gpu != "G1" else GpuPaceFigures("n0", "G1", 1, 1, 0.0, 0, 0.0, 90.0) for g in gpus]
    assert slowdown_cause(cool, ranks, [], 0.25).kind == "gpu_hot"
    alike = [GpuPaceFigures(g.node, g.gpu, g.index, g.rank, 0.0, 0, 0.0, 66.0) for g in gpus]
    assert slowdown_cause(alike, ranks, [], 0.25).figures["cause_rank"] == 1  # the rank whose GPU works less
    # two GPUs held down: none stands out by its clocks
    two = [GpuPaceFigures(g.node, g.gpu, g.index, g.rank, 0.6, 0x8, 0.0, 66.0) if g.gpu != "G2" else g for g in alike]
    level = [RankFigures(r.rank, r.node, r.pid, r.gpu, r.step, 98.0, 400.0) for r in ranks]
    assert slowdown_cause(two, level, [], 0.25).kind == "none"
