"""slowdown_causes: a slow job's GPU figures over the window from what the engine keeps of each GPU (the
clock-event reasons sampled, NVML's violation time, the link error counters, the temperature), and the cause
they name, with hostile readings: counters that go back after a GPU reset, readings missing, values past any
real count, values that are no number."""
from __future__ import annotations

import math

import pytest
from clusterwatch.collector.rules.causes import RankFigures
from clusterwatch.collector.rules.model import GpuClockObservation
from clusterwatch.collector.rules.slowdown_causes import (
    GpuMark,
    GpuPaceFigures,
    counter_rise,
    gpu_cause,
    pace_figures,
    slowdown_cause,
)
from clusterwatch.v1 import agent_pb2

START, END = 1000.0, 1600.0  # a 10-minute window, read every 30 s
READS = [START - 30.0 + 30.0 * i for i in range(22)]  # from the read before the window to its end


def _marks(**counters) -> list[GpuMark]:
    """A GpuMark per read, each counter given as a function of the read's time (None: not read then)."""
    return [GpuMark(t, **{k: f(t) for k, f in counters.items()}) for t in READS]


def _figures(gpu: str, reasons=lambda t: 0, **counters) -> GpuPaceFigures:
    return pace_figures("n0", gpu, int(gpu[-1]), int(gpu[-1]), [(t, reasons(t)) for t in READS],
                        _marks(**counters), START, END)


def _job(culprit: GpuPaceFigures, **counters) -> list[GpuPaceFigures]:
    """The culprit among four GPUs, the three others alike."""
    return [culprit, *(_figures(f"G{i}", **counters) for i in range(4) if f"G{i}" != culprit.gpu)]


# ---- counter_rise -------------------------------------------------------------------------------------------


def test_a_counter_rises_from_the_read_before_the_window_to_its_last_read() -> None:
    points = [(t, 10 * t) for t in READS]
    assert counter_rise(points, START, END) == (10 * 600, 600)  # a read at the window's start is its base
    assert counter_rise(points, START + 1, END - 1) == (10 * (1570 - 1000), 570)  # the last reads at or before
    assert counter_rise(points[:1], START, END) is None  # one read compares with nothing
    assert counter_rise([], START, END) is None


def test_a_counter_that_goes_back_after_a_gpu_reset_adds_nothing_for_that_step() -> None:
    # 100 before the reset, zeroed at 1300, then 40 more: 140, never a negative rise
    points = [(970.0, 500), (1200.0, 600), (1300.0, 0), (1600.0, 40)]
    assert counter_rise(points, START, END) == (140, 630.0)
    assert counter_rise([(970.0, 9), (1600.0, 3)], START, END) == (0, 630.0)


def test_a_step_past_the_time_elapsed_is_cut_to_it_where_bounded() -> None:
    # violation time cannot rise faster than the clock: 2**40 s in one step counts as the step's 30 s
    points = [(970.0, 0.0), (1000.0, 2.0**40), (1030.0, 2.0**40 + 3.0)]
    assert counter_rise(points, 980.0, END, per_s_max=1.0) == (33.0, 60.0)
    assert counter_rise(points, 980.0, END)[0] == 2.0**40 + 3.0  # unbounded: as the counter says


# ---- pace_figures ---------------------------------------------------------------------------------------------


def test_violation_time_sees_what_the_polls_miss() -> None:
    # held thermally 12 s of every 30 s, always between two reads: the sampled reasons never show it, NVML's
    # thermal violation time rises 12 s a read
    cycling = _figures("G0", held_s=lambda t: 0.4 * (t - 970.0))
    assert cycling.slowed_share == pytest.approx(0.4) and cycling.counted
    sampled = _figures("G0", lambda t: 0)
    assert sampled.slowed_share == 0.0 and not sampled.counted
    cause = gpu_cause(_job(cycling, held_s=lambda t: 0.0), 0.25)
    assert cause is not None and cause.kind == "gpu_clocks" and cause.figures["cause_gpu"] == "G0"
    assert "40% of the time (thermal, by NVML's violation time)" in cause.text


def test_a_reason_no_policy_counts_keeps_its_sampled_share_beside_a_flat_counter() -> None:
    # hardware slowdown (0x8) at every read, the thermal violation time still: no policy counts it
    held = _figures("G0", lambda t: 0x8, held_s=lambda t: 5.0, capped_s=lambda t: 0.0)
    assert held.slowed_share == 1.0 and held.reasons == 0x8 and not held.counted
    cause = gpu_cause(_job(held, held_s=lambda t: 5.0), 0.25)
    assert cause is not None and cause.kind == "gpu_clocks" and "(hardware slowdown)" in cause.text


def test_the_power_cap_share_is_the_power_policys_time_where_counted() -> None:
    capped = _figures("G0", capped_s=lambda t: 0.7 * t, held_s=lambda t: 0.0)
    assert capped.capped_share == pytest.approx(0.7) and capped.slowed_share == 0.0
    cause = gpu_cause(_job(capped, capped_s=lambda t: 0.02 * t, held_s=lambda t: 0.0), 0.25)
    assert cause is not None and cause.kind == "gpu_power_cap" and cause.figures["cause_share"] == 0.7


def test_counters_read_over_less_than_half_the_window_leave_the_sampled_shares() -> None:
    late = _figures("G0", lambda t: 0x4, capped_s=lambda t: 0.0 if t >= 1400 else None,
                    pcie_replays=lambda t: 9 if t >= 1400 else None)
    assert late.capped_share == 1.0 and late.pcie_replays is None  # the reasons', not the counter's 0
    never = pace_figures("n0", "G0", 0, 0, [], [], START, END)
    assert (never.slowed_share, never.capped_share, never.temperature_c, never.pcie_replays) == (None, None, None,
                                                                                                  None)


def test_a_gpu_reset_in_the_window_and_values_that_are_no_count() -> None:
    # the violation time zeroed by a reset at 1300 (it held 20 % before and after), NaN and infinite reads
    def held(t: float) -> float | None:
        if t in (1090.0, 1120.0):
            return math.nan if t == 1090.0 else math.inf
        return 0.2 * (t - 970.0) if t < 1300.0 else 0.2 * (t - 1300.0)

    reset = pace_figures("n0", "G0", 0, 0, [], [GpuMark.of(t, 66.0, {"thermal": held(t)}, None, None) for t in READS],
                         START, END)
    # the reads left are 20 % held between them, but the steps across the gaps and the reset add what they can
    assert 0.1 < reset.slowed_share <= 0.2 and reset.counted
    assert GpuMark.of(1.0, math.nan, {"thermal": -3.0, "power": math.inf}, -1, None) == GpuMark(1.0)


def test_huge_counts_are_carried_as_counts() -> None:
    huge = _figures("G0", pcie_replays=lambda t: 0 if t < 1300 else 2**64 - 1, held_s=lambda t: 2.0**70)
    assert huge.pcie_replays == 2**64 - 1 and huge.slowed_share == 0.0
    cause = gpu_cause(_job(huge, pcie_replays=lambda t: 0), 0.25)
    assert cause is not None and f"{2**64 - 1:,} PCIe replays" in cause.text


# ---- the link errors --------------------------------------------------------------------------------------------


def test_one_gpu_whose_pcie_replays_climb_names_that_gpu() -> None:
    g = _figures("G3", pcie_replays=lambda t: round(2 * (t - 970.0)), nvlink_errors=lambda t: 7)
    cause = slowdown_cause(_job(g, pcie_replays=lambda t: 12, nvlink_errors=lambda t: 0), [], [], 0.25)
    assert cause.kind == "gpu_link_errors"
    assert cause.figures == {"cause": "gpu_link_errors", "cause_node": "n0", "cause_gpu": "G3", "cause_rank": 3,
                             "cause_pcie_replays": 1200}
    assert cause.text == "GPU 3 (G3) of rank 3 on n0: 1,200 PCIe replays in the slow window, the others none"


def test_nvlink_errors_and_a_few_on_the_others() -> None:
    g = _figures("G0", nvlink_errors=lambda t: 100 + round(t - 970.0))
    few = _figures("G1", nvlink_errors=lambda t: 0 if t < 1300 else 30)
    cause = gpu_cause([g, few, _figures("G2", nvlink_errors=lambda t: 5)], 0.25)
    assert cause is not None and cause.figures["cause_nvlink_errors"] == 600
    assert cause.text.endswith(": 600 NVLink errors in the slow window, the others at most 30")


@pytest.mark.parametrize("case", ["together", "burst_before", "trickle", "reset_only", "two"])
def test_link_errors_that_are_no_one_gpus(case: str) -> None:
    rising = {"pcie_replays": lambda t: round(3 * t)}
    if case == "together":  # every GPU's errors climbing alike: the fabric's, not a GPU's
        gpus = _job(_figures("G0", **rising), **rising)
    elif case == "burst_before":  # 50,000 replays once, long before the window; flat since
        gpus = _job(_figures("G0", pcie_replays=lambda t: 50_000), pcie_replays=lambda t: 0)
    elif case == "trickle":  # a few a minute corrected: below the rate that costs a collective anything
        gpus = _job(_figures("G0", pcie_replays=lambda t: round((t - 970.0) / 60.0)), pcie_replays=lambda t: 0)
    elif case == "reset_only":  # the counter zeroed by a reset inside the window: a fall, no rise
        gpus = _job(_figures("G0", pcie_replays=lambda t: 90_000 if t < 1300 else 0), pcie_replays=lambda t: 0)
    else:  # two GPUs with the same errors: none stands out
        gpus = [_figures("G0", **rising), _figures("G1", **rising), _figures("G2", pcie_replays=lambda t: 0)]
    assert gpu_cause(gpus, 0.25) is None
    assert slowdown_cause(gpus, [], [], 0.25).kind == "none"


def test_the_link_comes_after_the_gpus_own_figures_and_before_the_ranks() -> None:
    link = {"pcie_replays": lambda t: round(5 * t)}
    hot_and_link = _figures("G0", temperature_c=lambda t: 90.0, **link)
    job = _job(hot_and_link, temperature_c=lambda t: 65.0, pcie_replays=lambda t: 0)
    assert slowdown_cause(job, [], [], 0.25).kind == "gpu_hot"
    link_only = _job(_figures("G2", temperature_c=lambda t: 66.0, **link), temperature_c=lambda t: 65.0,
                     pcie_replays=lambda t: 0)
    ranks = [RankFigures(r, "n0", 10 + r, f"G{r}", 5, 40.0 if r == 1 else 98.0, 300.0 if r == 1 else 400.0)
             for r in range(4)]
    cause = slowdown_cause(link_only, ranks, [], 0.25)
    assert (cause.kind, cause.figures["cause_gpu"]) == ("gpu_link_errors", "G2")


# ---- the hot GPU ----------------------------------------------------------------------------------------------------


def test_the_hot_gpu_against_others_spread_by_their_place_in_the_airflow() -> None:
    # the bench's miss before: one read each, the others 61.8 to 69.6 °C, the hot one 84.6: no single band held
    # them all, so none was named; now its last minutes against every other GPU's
    spread = {"G1": 61.8, "G2": 66.4, "G3": 69.6}
    gpus = [_figures("G0", temperature_c=lambda t: 84.6 if t >= 1300 else 66.0),
            *(_figures(g, temperature_c=lambda t, c=c: c) for g, c in spread.items())]
    cause = gpu_cause(gpus, 0.25)
    assert cause is not None and cause.kind == "gpu_hot" and cause.figures["cause_gpu"] == "G0"
    assert cause.text.endswith("runs at 85 °C, the others ~66 °C")
    warm = [_figures("G0", temperature_c=lambda t: 78.0), *gpus[1:]]  # 8.4 °C above the warmest other: no
    assert gpu_cause(warm, 0.25) is None
    two = [gpus[0], _figures("G1", temperature_c=lambda t: 84.0), *gpus[2:]]
    assert gpu_cause(two, 0.25) is None


def test_one_read_far_off_does_not_make_a_gpu_hot() -> None:
    spike = _figures("G0", temperature_c=lambda t: 120.0 if t == 1570.0 else 66.0)
    assert gpu_cause(_job(spike, temperature_c=lambda t: 65.0), 0.25) is None


# ---- from the agent's reading -----------------------------------------------------------------------------------


def test_a_health_reading_carries_its_violation_time_and_link_counters() -> None:
    msg = agent_pb2.GpuHealth(time=5.0, uuid="GPU-a", clock_event_reasons=0x20, temperature_c=71, pcie_replays=12)
    msg.violation_seconds.update({"thermal": 3.5, "power": 1.0})
    msg.nvlink_errors.update({"replay": 2, "crc_flit": 40})
    obs = GpuClockObservation.of_reading("n0", msg, "j1", 0)
    assert (obs.violation_s, obs.pcie_replays, obs.nvlink_errors) == ({"thermal": 3.5, "power": 1.0}, 12, 42)
    mark = GpuMark.of(obs.t, obs.temperature_c, obs.violation_s, obs.pcie_replays, obs.nvlink_errors)
    assert mark == GpuMark(5.0, 71.0, 3.5, 1.0, 12, 42)
    bare = GpuClockObservation.of_reading("n0", agent_pb2.GpuHealth(time=6.0, uuid="GPU-a"), "j1", 0)
    assert (bare.violation_s, bare.pcie_replays, bare.nvlink_errors) == (None, None, None)
