"""A trace's held ranks (`state`, `state_since` on its process lines, docs/traces.md) in replay: a stall names a
rank held long enough as its likely cause, as the collector does (collector/alerting/stall_causes.py); a hold a hostile
or broken trace spells wrongly is no hold, and crashes nothing."""
from __future__ import annotations

import json

import pytest
from clusterwatch.collector.rules import load_rules
from clusterwatch.collector.traces.replay import ReplayStats, replay_lines

T0 = 1_800_000_000.0


def _trace(hold: dict) -> list[bytes]:
    """Ranks 0 and 1 of job 9 step every 5 s for 100 s, then stop; rank 1's lines carry `hold` from then on."""
    lines = []
    for i in range(0, 200):
        t = T0 + 5 * i
        for rank in (0, 1):
            line = {"t": t, "node": f"n{rank}", "pid": 100 + rank, "start_time": T0 - 10, "job_id": "9",
                    "rank": rank, "gpu": f"GPU-{rank}", "gpu_util": 99.0, "step": min(i, 20)}
            if rank == 1 and i >= 20:
                line.update(hold)
            lines.append(json.dumps(line).encode())
    return lines


def _stall_of_rank_0(lines: list[bytes], stats: ReplayStats | None = None) -> dict:
    rules = load_rules(None)
    [ev] = [e for e in replay_lines(iter(lines), rules, stats)
            if e.rule == "training_stall" and e.state == "firing" and e.rank == 0]
    return {**ev.figures, "description": ev.description}


def test_a_stall_names_the_rank_held_in_uninterruptible_sleep() -> None:
    stall = _stall_of_rank_0(_trace({"state": "D", "state_since": T0 + 100, "wchan": "nfs_wait_bit_killable"}))
    assert (stall["cause"], stall["cause_rank"], stall["cause_node"], stall["cause_pid"], stall["cause_state"],
            stall["cause_wchan"]) == ("process_held", 1, "n1", 101, "D", "nfs_wait_bit_killable"), stall
    assert "rank 1 on n1 (pid 101) has been in uninterruptible sleep for " in stall["description"]


def test_without_the_hold_the_cause_is_the_rank_behind_or_none() -> None:
    assert _stall_of_rank_0(_trace({})).get("cause") != "process_held"


@pytest.mark.parametrize("hold", [
    {"state": "R", "state_since": T0 + 100},              # running: no hold
    {"state": "Z\n\x1b[31m", "state_since": T0 + 100},    # not a state
    {"state": "T", "state_since": "yesterday"},
    {"state": "T"},                                       # since when, unsaid
    {"state": "T", "state_since": 1e308},                 # held from a far future
    {"state": ["T"], "state_since": T0 + 100},
    {"state": "D", "state_since": T0 + 100, "wchan": {"x": 1}},
])
def test_a_hold_spelled_wrongly_is_no_cause_and_breaks_nothing(hold: dict) -> None:
    stats = ReplayStats()
    stall = _stall_of_rank_0(_trace(hold), stats)
    if hold.get("state") == "D":   # a wchan that is not a name: the hold stands, the wait channel is text
        assert stall["cause"] == "process_held"
    else:
        assert stall.get("cause") != "process_held", stall
    assert stats.bad_lines == 0
