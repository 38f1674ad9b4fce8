"""`clusterwatch health --history`: what the automation did (the collectors' audit trails), newest first."""
from __future__ import annotations

import time

HISTORY_SCHEMA = "clusterwatch.health_history/1"


def merge_actions(answers: list) -> list:
    """Several collectors' actions as one list, newest first (each collector acts on its own jobs and nodes,
    so a row is never on two)."""
    return sorted((a for answer in answers for a in answer.actions), key=lambda a: (-a.time, a.node, a.action))


def render_actions(actions: list) -> str:
    """One line an action (when, what, on which node and job, what came of it), then its detail and why."""
    from clusterwatch.report.text import fit, printable

    if not actions:
        return "no automatic action recorded\n"
    out = [f"{'WHEN':<19} {'ACTION':<10} {'NODE':<16} {'JOB':<10} OUTCOME"]
    for a in actions:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a.time))
        out.append(f"{when:<19} {fit(printable(a.action), 10):<10} {fit(printable(a.node) or '-', 16):<16} "
                   f"{fit(printable(a.job_id) or '-', 10):<10} {printable(a.outcome)}")
        if a.detail:
            out.append(f"{'':<19} {printable(a.detail)}")
        if a.why:
            out.append(f"{'':<19} why: {printable(a.why)}")
    return "\n".join(out) + "\n"
