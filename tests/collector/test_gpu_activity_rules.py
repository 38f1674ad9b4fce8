"""The GPU's true activity (NVML GPM) in the rules (issue 27): an allocated GPU whose SM activity stays near zero
is idle whatever its utilisation; a stall whose GPUs spin (high utilisation, SMs near idle, no tensor activity)
names a hung collective whatever their power, and the rank whose tensor activity differs from the others' is the
odd one out. A GPU without GPM keeps the utilisation-and-power rules exactly."""
from __future__ import annotations

import random

import pytest
from clusterwatch.collector.rules import Engine, GpuObservation, ProcessObservation, load_rules, parse_rules
from clusterwatch.collector.rules.causes import RankFigures, hung_collective, odd_rank_out
from clusterwatch.collector.state.observations import gpu_from_record, gpu_record


def _fired(evs: list, rule: str) -> list:
    return [e for e in evs if e.rule == rule and e.state == "firing"]


def _idle_run(eng: Engine, util: float | None, sm: float | None, tensor: float | None, minutes: int = 40) -> list:
    """One allocated GPU with a process on it, read every minute at these figures."""
    evs = []
    for i in range(minutes):
        evs += eng.observe_gpu(GpuObservation(i * 60.0, "g1", "GPU-x", "42", util, 1, 2, 300.0, sm, tensor))
    return evs


# ---- idle_gpu -------------------------------------------------------------------------------------------------

def test_a_gpu_busy_by_utilisation_with_its_sms_near_idle_is_idle_and_says_so():
    evs = _idle_run(Engine(load_rules()), util=100.0, sm=2.0, tensor=0.0)
    assert [e.state for e in evs] == ["pending", "firing"]
    ev = evs[1]
    assert "GPU 2 (GPU-x) on g1, allocated to job 42, is idle (2 % SM activity at 100 % utilisation)" \
        in ev.description, ev.description
    assert ev.figures["sm_active_percent"] == 2.0 and ev.figures["util_percent"] == 100.0
    # the GPU's own shape names the cause where the job shows none: it spins
    assert "likely cause: a hung collective: its GPU reads 100 % utilisation with 2 % SM activity" in ev.description
    assert ev.figures["cause"] == "hung_collective"


def test_the_same_gpu_without_gpm_is_busy_as_today_and_an_idle_one_says_what_it_said():
    assert _idle_run(Engine(load_rules()), util=100.0, sm=None, tensor=None) == []
    evs = _idle_run(Engine(load_rules()), util=0.0, sm=None, tensor=None)
    assert [e.state for e in evs] == ["pending", "firing"]
    assert evs[1].description == "GPU 2 (GPU-x) on g1, allocated to job 42, is idle (0 %) for 30 min"
    assert evs[1].figures == {"idle_for_s": 1800.0, "processes": 1, "util_percent": 0.0}


def test_a_gpu_at_work_by_gpm_is_not_idle_and_one_going_idle_resolves_when_its_sms_work_again():
    assert _idle_run(Engine(load_rules()), util=100.0, sm=60.0, tensor=35.0) == []
    eng = Engine(load_rules())
    assert [e.state for e in _idle_run(eng, util=100.0, sm=1.0, tensor=0.0)] == ["pending", "firing"]
    back = eng.observe_gpu(GpuObservation(2500.0, "g1", "GPU-x", "42", 100.0, 1, 2, 300.0, 55.0, 30.0))
    assert [(e.state, e.description) for e in back] == [("resolved", "GPU GPU-x on g1: in use again")]


def test_the_sm_threshold_comes_from_the_rules_file():
    strict = parse_rules("[idle_gpu]\nsm_active_below_percent = 1\nfor_s = 600\n", "rules.toml")
    assert strict.idle_gpu.sm_active_below_percent == 1.0 and load_rules().idle_gpu.sm_active_below_percent == 5.0
    assert _idle_run(Engine(strict), util=100.0, sm=2.0, tensor=0.0) == []
    assert [e.state for e in _idle_run(Engine(strict), util=100.0, sm=0.5, tensor=0.0, minutes=11)] == [
        "pending", "firing"]


@pytest.mark.parametrize("seed", range(40))
def test_generated_gpus_are_idle_by_sm_activity_where_read_else_by_utilisation(seed):
    # Each run: one GPU, GPM or not, its figures drawn once and held for 40 minutes (the rule's 30 and more)
    rnd = random.Random(seed)
    gpm = rnd.random() < 0.5
    util = rnd.choice([0.0, 3.0, 4.9, 5.0, 40.0, 100.0])
    sm = rnd.choice([0.0, 2.0, 4.9, 5.0, 30.0, 90.0]) if gpm else None
    tensor = rnd.choice([0.0, 20.0]) if gpm else None
    fired = bool(_fired(_idle_run(Engine(load_rules()), util, sm, tensor), "idle_gpu"))
    assert fired == (sm < 5.0 if sm is not None else util < 5.0), (util, sm, tensor)


# ---- a stall's cause ------------------------------------------------------------------------------------------

def _stall(gpm: dict[int, tuple[float, float]] | None, ranks: int = 4, power: float = 300.0) -> list:
    """`ranks` ranks on n1 advance for 100 s then stop at step 9, their GPUs at 100 % utilisation and at
    `power` throughout; after 100 s each rank's GPU reads GPM's (SM, tensor) activity `gpm[rank]`, or none."""
    eng = Engine(load_rules())
    evs = []
    t = 0.0
    while t <= 900.0:
        for rank in range(ranks):
            sm, tensor = (None, None) if gpm is None else (60.0, 40.0) if t < 100 else gpm[rank]
            evs += eng.observe_gpu(GpuObservation(t, "n1", f"GPU-{rank}", "9", 100.0, 1, rank, power, sm, tensor))
            evs += eng.observe(ProcessObservation(t=t, node="n1", job_id="9", pid=10 + rank, gpu=f"GPU-{rank}",
                                                  rank=rank, gpu_util=100.0, step=min(int(t // 10), 9)))
        t += 15.0
    return _fired(evs, "training_stall")


def test_spinning_gpus_name_a_hung_collective_at_full_power_where_gpm_reads_them():
    fired = _stall({r: (2.0, 0.0) for r in range(4)})
    assert len(fired) == 4
    for ev in fired:
        assert "likely cause: a hung collective: its GPU reads 100 % utilisation with 2 % SM activity and no " \
               "tensor activity" in ev.description, ev.description
        assert (ev.figures["cause"], ev.figures["sm_active_percent"], ev.figures["tensor_active_percent"]) == (
            "hung_collective", 2.0, 0.0)
    # without GPM the same GPUs at full power name nothing: power alone does not say it
    for ev in _stall(None):
        assert "likely cause" not in ev.description and "cause" not in ev.figures


def test_the_rank_whose_tensor_activity_differs_is_named():
    [ev, *_] = _stall({0: (2.0, 0.0), 1: (2.0, 0.0), 2: (70.0, 35.0), 3: (3.0, 0.0)})
    assert "likely cause: rank 2 (pid 12 on n1) has tensor activity 35 %, the others ~0 %" in ev.description
    assert (ev.figures["cause_by"], ev.figures["cause_rank"], ev.figures["cause_gpu"]) == (
        "tensor_activity", 2, "GPU-2")
    # of two ranks, the one computing while the other waits in the collective
    [ev, *_] = _stall({0: (2.0, 0.0), 1: (60.0, 30.0)}, ranks=2)
    assert "rank 1 (pid 11 on n1) has tensor activity 30 %, the other ~0 %" in ev.description


def test_odd_rank_out_reads_tensor_activity_where_every_rank_has_it_else_power_as_today():
    def r(rank, power, tensor=None):
        return RankFigures(rank, "n", 100 + rank, power_watts=power, sm_active=None if tensor is None else 2.0,
                           tensor_active=tensor)

    # every rank with GPM, their tensor cores alike: power apart does not name one (GPM is the finer reading)
    assert odd_rank_out([r(0, 300.0, 0.0), r(1, 120.0, 0.0), r(2, 295.0, 0.0), r(3, 305.0, 0.0)]) is None
    # one rank without GPM: power as today
    found = odd_rank_out([r(0, 300.0, 0.0), r(1, 120.0), r(2, 295.0, 0.0), r(3, 305.0, 0.0)])
    assert found is not None and found.figures["cause_by"] == "power" and found.figures["cause_rank"] == 1
    # several apart: none named; of two both at work: none
    assert odd_rank_out([r(0, 1.0, 0.0), r(1, 1.0, 30.0), r(2, 1.0, 40.0), r(3, 1.0, 0.0)]) is None
    assert odd_rank_out([r(0, 1.0, 30.0), r(1, 1.0, 35.0)]) is None


def test_hung_collective_by_gpm_decides_alone_and_without_it_by_power():
    spinning = RankFigures(0, "n", 1, "GPU-a", util=100.0, power_watts=300.0, power_peak_watts=310.0,
                           sm_active=3.0, tensor_active=0.0)
    assert hung_collective(spinning) is not None
    working = RankFigures(0, "n", 1, "GPU-a", util=100.0, power_watts=70.0, power_peak_watts=300.0,
                          sm_active=40.0, tensor_active=20.0)
    assert hung_collective(working) is None  # low power, but its SMs work: not spinning
    assert hung_collective(RankFigures(0, "n", 1, util=30.0, sm_active=1.0, tensor_active=0.0)) is None
    no_gpm = RankFigures(0, "n", 1, util=100.0, power_watts=70.0, power_peak_watts=300.0)
    assert "at 70 W, 23% of the 300 W" in hung_collective(no_gpm).text



# ---- the trace's gpu record -----------------------------------------------------------------------------------

def test_the_gpu_record_carries_activity_where_read_and_an_old_one_reads_as_without_gpm():
    obs = GpuObservation(5.0, "n1", "GPU-a", "9", 100.0, 1, 0, 250.0, 2.0, 0.0)
    rec = gpu_record(obs)
    assert (rec["sm_active"], rec["tensor_active"]) == (2.0, 0.0)
    assert gpu_from_record(rec) == obs
    old = {"kind": "gpu", "t": 5.0, "node": "n1", "gpu": "GPU-a", "job_id": "9", "utilization": 100.0}
    back = gpu_from_record(old)
    assert (back.sm_active, back.tensor_active) == (None, None)
    assert "sm_active" not in gpu_record(back) and "tensor_active" not in gpu_record(back)
