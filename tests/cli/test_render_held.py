"""`status` shows a process held where it is under its row in the ranks table (D with where it waits, T, t), and
says nothing of a process that runs or sleeps; what an agent sent as a wchan reaches the terminal printable."""
from __future__ import annotations

from clusterwatch.v1 import query_pb2

from clusterwatch.report import render


def _view(**held) -> query_pb2.JobView:
    view = query_pb2.JobView(now=1000.0)
    view.job.job_id, view.job.state, view.job.start_time = "9", "RUNNING", 100.0
    view.processes.add(node="n1", pid=10, command="python", alive=True, rank=0, last_seen=999.0)
    view.processes.add(node="n2", pid=11, command="python", alive=True, rank=1, last_seen=999.0, **held)
    return view


def _rank_line(text: str, rank: int) -> str:
    """The rank's row in the processes table, with the note on the line below it when it has one."""
    lines = text.splitlines()
    at = next(n for n, line in enumerate(lines) if line.split()[:1] == [str(rank)] and "python" in line)
    below = lines[at + 1].strip() if at + 1 < len(lines) else ""
    return lines[at] + (f" {below[2:]}" if below.startswith("↳ ") else "")


def test_a_process_in_d_shows_its_state_for_how_long_and_where_it_waits() -> None:
    text = render(_view(state="D", wchan="nfs_wait_bit_killable", state_since=630.0), width=None)
    assert _rank_line(text, 1).endswith("uninterruptible sleep (D) for 6 min, in nfs_wait_bit_killable"), text
    assert "(D)" not in _rank_line(text, 0)


def test_stopped_and_traced_processes_show_their_state() -> None:
    assert _rank_line(render(_view(state="T", state_since=990.0), width=None), 1).endswith("stopped (T) for 10 s")
    assert _rank_line(render(_view(state="t", state_since=990.0), width=None), 1).endswith(
        "stopped by a tracer (t) for 10 s")


def test_a_hostile_wchan_reaches_the_terminal_printable() -> None:
    text = render(_view(state="D", wchan="\x1b]0;owned\x07\x1b[2Jx", state_since=990.0), width=None)
    assert "\x1b" not in text and "\x07" not in text
