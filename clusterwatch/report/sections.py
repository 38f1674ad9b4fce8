"""The report's sections as data, for the job page to draw as HTML: built by the same functions the text report
formats (usage, requests, code, notes), so the page and `clusterwatch status` cannot disagree.

Every string in it is `printable` (a bidirectional override in a job name reorders a browser's line as it
would a terminal's); HTML escaping is the template's.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .code import code_versions
from .notes import job_notes
from .requests import answer_row
from .text import Col, Table, printable_message
from .usage import gpus_table, nodes_table, overall_figures, ranks_table, training_table

if TYPE_CHECKING:
    from clusterwatch.v1 import query_pb2

# tables only the page draws: their widths are unused (a browser sizes its columns)
REQUEST_COLUMNS = [Col("RANK", 0, "<"), Col("REQUEST", 0, "<"), Col("ANSWER", 0, "<"), Col("WHEN", 0, "<"),
                   Col("ASKED BY", 0, "<"), Col("MESSAGE", 0, "<")]
CODE_COLUMNS = [Col("RANKS", 0, "<"), Col("CODE", 0, "<"), Col("COMMAND", 0, "<")]


@dataclass
class JobSections:
    """What the page shows of the report, section by section, in the report's order."""

    overall: list[tuple[str, float | None, str, bool]]  # usage.overall_figures
    tables: list[Table] = field(default_factory=list)  # Nodes, Processes, Training, GPUs, Requests, Code
    notes: list[str] = field(default_factory=list)


def run_time(view: query_pb2.JobView, now: float) -> float:
    """How long the job ran (until now where it runs), as the report's header says it."""
    job = view.job
    return ((job.end_time or now) - job.start_time) if job.start_time else 0.0


def job_sections(view: query_pb2.JobView, now: float | None = None) -> JobSections:
    view = printable_message(view)
    now = now or view.now or time.time()
    ran = run_time(view, now)
    out = JobSections(overall_figures(view, ran))
    if view.nodes:
        out.tables.append(nodes_table(view))
    if view.processes:
        out.tables.append(ranks_table(view, now))
        training = training_table(view, now)
        if training:
            out.tables.append(training)
    if view.gpus:
        out.tables.append(gpus_table(view))
    if view.train_answers:
        requests = Table("Requests to the training processes", REQUEST_COLUMNS)
        for answer in view.train_answers:
            requests.add(answer_row(answer, now))
        out.tables.append(requests)
    versions = code_versions(view)
    if versions:
        code = Table("Code (git provenance)", CODE_COLUMNS)
        for whose, described, command in versions:
            code.add([", ".join(whose), described, command])
        if len(versions) > 1:
            code.footer.append(f"ranks run {len(versions)} different versions of the code")
        out.tables.append(code)
    out.notes = job_notes(view, ran)
    return out
