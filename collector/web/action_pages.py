"""The job page's actions: its buttons, the confirmation page and the answer (templates: escaped throughout).

Every step works without JavaScript: the buttons are GET forms to the confirmation page, which holds
the POST form with its token.
"""
from __future__ import annotations

from .actions import ACTIONS, Outcome
from .pages import page_context
from .templating import render

SAYS = {
    "diagnose": ("Ask every live rank for its Python stacks (py-spy, from outside: a hung rank answers too) "
                 "and, unless you untick it, for a CUDA memory snapshot, which each rank writes where only "
                 "its user can read it."),
    "checkpoint": ("Ask every live rank to save a checkpoint (its clusterwatch.train handler; several ranks "
                   "are given one step to save at)."),
    "stop": ("Ask every live rank to stop: its clusterwatch.train handler saves and exits, or, without one, "
             "the rank is told no handler is there. This ends the training run."),
}


def actions_section(job_id: str, refusal: str, live: bool) -> dict | None:
    """What the job page's Actions section shows (actions.html): its buttons, each to its confirmation page,
    or why there are none; None: no section (the job is not live)."""
    if not live:
        return None
    return {"job_id": job_id, "refusal": refusal, "labels": ACTIONS}


def confirm_page(job_id: str, job_name: str, action: str, snapshot: bool, token: str) -> str:
    """Say what the action does, and ask: the POST form with the page's token."""
    label = ACTIONS[action]
    what = SAYS[action]
    if action == "diagnose" and not snapshot:
        what = what.split(" and, unless")[0] + " (no memory snapshots)."
    return render("confirm.html", label=label, job_id=job_id, job_name=job_name, what=what, action=action,
                  token=token, snapshot=snapshot,
                  **page_context(f"clusterwatch: {label} job {job_id}", refresh=False))


def refused_page(job_id: str, why: str) -> str:
    """An action refused, and why."""
    return render("refused.html", job_id=job_id, why=why, **page_context("clusterwatch: refused", refresh=False))


def outcome_page(job_id: str, outcome: Outcome, now: float) -> str:
    """The answers: for Diagnose the grouped stacks and where each snapshot went; else each rank's answer."""
    from clusterwatch.report.requests import answer_line, who
    from clusterwatch.stacks import by_rank, group_ranks

    stacks = None
    answered = outcome.answers.get("dump_stacks")
    if answered is not None:
        dumps, noun = by_rank(answered)
        groups = [(g.summary(noun), "\n".join(str(f) for f in g.frames))
                  for g in (group_ranks(dumps) if dumps else [])]
        notes = [f"{who(a)}: no stacks: {a.message or a.status}" if not a.payload
                 else f"{who(a)}: its stacks were cut at 60000 bytes" for a in answered
                 if not a.payload or a.truncated]
        if not answered:
            notes.append("No process answered.")
        stacks = {"groups": groups, "notes": notes}
    answers = []
    for kind, title in (("memory_snapshot", "Memory snapshots (open one in PyTorch's memory viewer, "
                                            "https://pytorch.org/memory_viz)"),
                        ("checkpoint", "Answers"), ("stop", "Answers")):
        got = outcome.answers.get(kind)
        if got is not None:
            answers.append((kind, title, [answer_line(a, now).strip() for a in got] or ["no process answered"]))
    return render("outcome.html", label=ACTIONS[outcome.action], job_id=job_id, stacks=stacks, answers=answers,
                  **page_context(f"clusterwatch: {ACTIONS[outcome.action]} job {job_id}", refresh=False))
