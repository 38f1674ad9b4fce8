"""A process's held state and wchan cross the wire (ProcessTable.states, only the held rows) and back; what an
agent sends is checked on the way in: an unknown state is dropped, a wchan cleaned, a row past the table's is
refused."""
from __future__ import annotations

import pytest
from clusterwatch.v1 import agent_pb2

from clusterwatch.model import WCHAN_CHARS, ProcessSample
from clusterwatch.wire import ProcessColumns, processes_from_table, processes_to_table


def _samples() -> list[ProcessSample]:
    return [ProcessSample(10.0, "n1", 100 + i, 1.0, job_id="7", rank=i) for i in range(4)]


def test_held_states_round_trip_and_only_held_rows_are_listed() -> None:
    samples = _samples()
    samples[1].state, samples[1].wchan = "D", "nfs_wait_bit_killable"
    samples[3].state = "T"
    t = agent_pb2.ProcessTable()
    processes_to_table(samples, t)
    assert [(m.row, m.state, m.wchan) for m in t.states] == [(1, "D", "nfs_wait_bit_killable"), (3, "T", "")]
    back = processes_from_table(agent_pb2.ProcessTable.FromString(t.SerializeToString()), "n1")
    assert back == samples
    assert [(s.state, s.wchan) for s in back] == [("", ""), ("D", "nfs_wait_bit_killable"), ("", ""), ("T", "")]


def test_a_table_with_no_held_process_carries_no_state() -> None:
    t = agent_pb2.ProcessTable()
    processes_to_table(_samples(), t)
    assert len(t.states) == 0 and not ProcessColumns(t).states


def test_what_an_agent_sends_is_checked() -> None:
    t = agent_pb2.ProcessTable()
    processes_to_table(_samples(), t)
    t.states.add(row=0, state="D", wchan="\x1b]0;owned\x07" + "x" * 500)
    t.states.add(row=1, state="Q", wchan="whatever")  # a state this collector does not know: dropped
    t.states.add(row=2, state="T", wchan="only_d_has_one")
    cols = ProcessColumns(t)
    state, wchan = cols.state_of(0)
    assert state == "D" and len(wchan) <= WCHAN_CHARS and wchan.isascii() and wchan.isprintable()
    assert "\x1b" not in wchan and "\x07" not in wchan
    assert cols.state_of(1) == ("", "") and cols.state_of(2) == ("T", "")
    t.states.add(row=4, state="D")
    with pytest.raises(ValueError, match="process state points at row 4 of 4"):
        ProcessColumns(t)
