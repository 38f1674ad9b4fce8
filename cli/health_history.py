"""`clusterwatch health --history`: what the automation did (the collectors' audit trails), newest first, and
the repeat offenders (the GPUs and nodes by the findings each collector kept for them)."""
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


#: The GPUs, and the nodes, the ranking shows.
RANKED = 20


def merge_offenders(answers: list, field: str) -> list:
    """Several collectors' `gpus` (or `nodes`) as one ranking: a GPU or node once (the collector that kept the
    most of its findings), most findings first, then drains, then jobs hurt; a GPU by its serial where known
    (moved to another node, it is one GPU)."""
    best: dict[tuple[str, str], object] = {}
    for answer in answers:
        for o in getattr(answer, field):
            key = ("serial", o.serial) if o.serial else (o.node, o.gpu)
            held = best.get(key)
            if held is None or (o.findings, o.drains) > (held.findings, held.drains):
                best[key] = o
    ranked = sorted(best.values(), key=lambda o: (-o.findings, -o.drains, -o.jobs_hurt, o.node, o.gpu))
    return ranked[:RANKED]


def render_offenders(gpus: list, nodes: list) -> str:
    """The ranking in 80 columns: the GPUs (UUID, node; its serial under it where known), then the nodes, with
    findings, drains, jobs hurt of the jobs that held it and the mean time between findings."""
    from clusterwatch.report.text import fit, human_duration, printable

    def mtbf(o) -> str:
        return human_duration(o.mtbf_s) if o.HasField("mtbf_s") else "-"

    if not gpus and not nodes:
        return "no health finding kept (repeat offenders: none)\n"
    def jobs(o) -> str:  # a collector from before jobs_held sends 0 for it
        return f"{o.jobs_hurt}/{o.jobs_held if o.jobs_held >= o.jobs_hurt else '?'}"

    out = ["", "REPEAT OFFENDERS (findings of 90 days; JOBS: hurt/held; MTBF: between findings)"]
    if gpus:
        out.append(f"{'GPU':<36} {'NODE':<14} {'FINDINGS':>8} {'JOBS':>9} {'MTBF':>8}")
        for o in gpus:
            out.append(f"{fit(printable(o.gpu), 36):<36} {fit(printable(o.node), 14):<14} {o.findings:>8} "
                       f"{jobs(o):>9} {mtbf(o):>8}")
            if o.serial:
                out.append(f"  serial {fit(printable(o.serial), 70)}")
    if nodes:
        out.append(f"{'NODE':<36} {'FINDINGS':>8} {'DRAINS':>6} {'JOBS':>9} {'MTBF':>8}")
        out += [f"{fit(printable(o.node), 36):<36} {o.findings:>8} {o.drains:>6} {jobs(o):>9} {mtbf(o):>8}"
                for o in nodes]
    return "\n".join(out) + "\n"
