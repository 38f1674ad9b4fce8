"""The requests back to a job's training processes, as `status` and `diagnose` print them.

`status` shows the latest request to each rank and its answer, one line each (JobView.train_answers);
`diagnose` prints the ranks' stacks grouped (clusterwatch/stacks.py) and where each snapshot went.
"""
from __future__ import annotations

import time

from .text import printable, title

MAX_NOTE = 160  # characters of an answer's message on a status line
SAID = {
    "done": "done", "accepted": "accepted", "refused": "refused",
    "no_handler": "no handler (clusterwatch.train.on_request)", "failed": "failed",
    "unreachable": "unreachable", "not_yours": "not its agent's process", "no_answer": "no answer", "sent": "sent",
}


def who(answer) -> str:
    """`rank 3` where the rank is known, else `pid 4242 on gpu01`."""
    return f"rank {answer.rank}" if answer.HasField("rank") else f"pid {answer.pid} on {answer.node}"


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.0f} h ago"


def answer_row(answer, now: float) -> list[str]:
    """An answer's cells: whose, what was asked, what came back, when, who asked, its message (cut)."""
    message = printable(answer.message)
    if len(message) > MAX_NOTE:
        message = message[:MAX_NOTE - 1] + "…"
    when = answer.answered_at or answer.asked_at
    said = SAID.get(answer.status, printable(answer.status))
    return [who(answer), printable(answer.kind), said, _ago(now - when), printable(answer.asked_by) or "unknown",
            message]


def answer_line(answer, now: float) -> str:
    """One answer on one line: whose, what was asked, what came back, when, who asked."""
    whose, kind, said, ago, asked_by, message = answer_row(answer, now)
    return (f"  {whose}: {kind} {said}, {ago} (asked by {asked_by})" + (f": {message}" if message else ""))


def requests_section(view, now: float | None = None) -> list[str]:
    """`status`'s lines for the latest request to each rank; none when nothing was ever asked."""
    if not view.train_answers:
        return []
    now = now or view.now or time.time()
    return [title("Requests to the training processes"),
            "  the latest to each rank (`clusterwatch diagnose` asks for their stacks)"] + \
        [answer_line(a, now) for a in view.train_answers]
