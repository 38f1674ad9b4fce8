"""The HTML of the job page's actions: its buttons, the confirmation page and the answer (escaped throughout).

Every step works without JavaScript: the buttons are GET forms to the confirmation page, which holds
the POST form with its token.
"""
from __future__ import annotations

from html import escape
from urllib.parse import quote

from .actions import ACTIONS, Outcome
from .pages import page

SAYS = {
    "diagnose": ("Ask every live rank for its Python stacks (py-spy, from outside: a hung rank answers too) "
                 "and, unless you untick it, for a CUDA memory snapshot, which each rank writes where only "
                 "its user can read it."),
    "checkpoint": ("Ask every live rank to save a checkpoint (its clusterwatch.train handler; several ranks "
                   "are given one step to save at)."),
    "stop": ("Ask every live rank to stop: its clusterwatch.train handler saves and exits, or, without one, "
             "the rank is told no handler is there. This ends the training run."),
}


def _href(job_id: str, tail: str = "") -> str:
    return f"/jobs/{quote(job_id, safe='')}{tail}"


def actions_section(job_id: str, refusal: str, live: bool) -> str:
    """The job page's buttons (each to its confirmation page), or why there are none."""
    if not live:
        return ""
    if refusal:
        return f'<h2>Actions</h2><p class="refused" id="actions-refused">{escape(refusal)}</p>'
    forms = []
    for action, label in ACTIONS.items():
        extra = ('<label><input type="checkbox" name="snapshot" value="1" checked> with memory snapshots</label> '
                 if action == "diagnose" else "")
        forms.append(f'<form method="get" action="{escape(_href(job_id, "/confirm"))}">'
                     f'<input type="hidden" name="action" value="{action}">{extra}'
                     f'<button type="submit" id="action-{action}">{escape(label)}</button></form>')
    return '<h2>Actions</h2><div class="actions">' + "".join(forms) + "</div>"


def confirm_page(job_id: str, job_name: str, action: str, snapshot: bool, token: str) -> str:
    """Say what the action does, and ask: the POST form with the page's token."""
    label = ACTIONS[action]
    what = SAYS[action]
    if action == "diagnose" and not snapshot:
        what = what.split(" and, unless")[0] + " (no memory snapshots)."
    body = (f"<h1>{escape(label)}: job {escape(job_id)} <span class=\"name\">{escape(job_name)}</span></h1>"
            f"<p>{escape(what)}</p>"
            f'<form method="post" action="{escape(_href(job_id, "/act"))}" class="actions">'
            f'<input type="hidden" name="action" value="{action}">'
            f'<input type="hidden" name="token" value="{escape(token)}">'
            f'<input type="hidden" name="snapshot" value="{1 if snapshot else 0}">'
            f'<button type="submit" id="confirm">Yes, {escape(label.lower())}</button></form>'
            f'<p><a href="{escape(_href(job_id))}" id="cancel">No, back to the job</a></p>')
    return page(f"clusterwatch: {label} job {job_id}", body, refresh=False)


def refused_page(job_id: str, why: str) -> str:
    body = (f'<h1>Refused</h1><p class="refused" id="refused">{escape(why)}</p>'
            f'<p><a href="{escape(_href(job_id))}">Back to the job</a></p>')
    return page("clusterwatch: refused", body, refresh=False)


def outcome_page(job_id: str, outcome: Outcome, now: float) -> str:
    """The answers: for Diagnose the grouped stacks and where each snapshot went; else each rank's answer."""
    from clusterwatch.report.requests import answer_line, who
    from clusterwatch.stacks import by_rank, group_ranks

    parts = [f"<h1>{escape(ACTIONS[outcome.action])}: job {escape(job_id)}</h1>"]
    stacks = outcome.answers.get("dump_stacks")
    if stacks is not None:
        parts.append("<h2>Stacks (main thread; ranks with the same stack once)</h2>")
        dumps, noun = by_rank(stacks)
        for group in group_ranks(dumps) if dumps else []:
            frames = "\n".join(str(f) for f in group.frames)
            parts.append(f'<div class="stack-group"><b>{escape(group.summary(noun))}</b>'
                         f"<pre>{escape(frames)}</pre></div>")
        for a in stacks:
            if not a.payload:
                parts.append(f"<p>{escape(who(a))}: no stacks: {escape(a.message or a.status)}</p>")
            elif a.truncated:
                parts.append(f"<p>{escape(who(a))}: its stacks were cut at 60000 bytes</p>")
        if not stacks:
            parts.append("<p>No process answered.</p>")
    for kind, title in (("memory_snapshot", "Memory snapshots (open one in PyTorch's memory viewer, "
                                            "https://pytorch.org/memory_viz)"),
                        ("checkpoint", "Answers"), ("stop", "Answers")):
        answers = outcome.answers.get(kind)
        if answers is None:
            continue
        lines = [answer_line(a, now).strip() for a in answers] or ["no process answered"]
        parts.append(f"<h2>{escape(title)}</h2><ul id=\"answers-{kind}\">"
                     + "".join(f"<li>{escape(x)}</li>" for x in lines) + "</ul>")
    parts.append(f'<p><a href="{escape(_href(job_id))}">Back to the job</a> (its report lists the latest '
                 "request to each rank)</p>")
    return page(f"clusterwatch: {ACTIONS[outcome.action]} job {job_id}", "".join(parts), refresh=False)
