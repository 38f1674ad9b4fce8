"""The job page's report: the sections `clusterwatch status` prints, as HTML tables built from the same rows.

The page and the text cannot disagree: each table's column headers and cells are checked against the text
report of the same view; the rows the text says are held, gone or stalled are marked; hostile text is text.
"""
from __future__ import annotations

import json
import re
from html.parser import HTMLParser

from clusterwatch.collector.web.pages import job_page
from clusterwatch.v1 import query_pb2
from markupsafe import escape

from clusterwatch.report import render
from clusterwatch.report.text import fit
from tests.cli.test_render_layout import stalled_view

EVIL = "<script>alert(1)</script>\"'&" + "x" * 300


class _Tables(HTMLParser):
    """The page's report tables: {data-section: (headers, [(data-mark, cells)])}; a note row is a row of one cell."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, tuple[list[str], list[tuple[str, list[str]]]]] = {}
        self.section = None
        self.cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table" and "data-section" in a:
            self.section = self.tables.setdefault(a["data-section"], ([], []))
        elif self.section is not None and tag == "tr":
            self.row = (a.get("data-mark", ""), [])
        elif self.section is not None and tag in ("td", "th"):
            self.cell = []

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)

    def handle_endtag(self, tag):
        if self.section is None:
            return
        if tag in ("td", "th") and self.cell is not None:
            self.row[1].append("".join(self.cell).strip())
            self.cell = None
        elif tag == "tr":
            headers, rows = self.section
            if not headers:
                headers.extend(self.row[1])
            else:
                rows.append(self.row)
        elif tag == "table":
            self.section = None


def _page(view: query_pb2.JobView) -> tuple[str, dict]:
    page = job_page(view, render(view, width=None), [], [], stored=False)
    parser = _Tables()
    parser.feed(page)
    return page, parser.tables


def _text_table(text: str, title: str) -> list[str]:
    """The header and row lines of `title`'s table in the text report (its note lines left out)."""
    body = text.split(f"\n{title}\n", 1)[1].split("\n", 1)[1]  # past the rule
    lines = []
    for line in body.split("\n"):
        if not line.startswith("  ") or not line.strip():
            break
        if not line.lstrip().startswith("↳") and not line.startswith("          "):
            lines.append(line)
    return lines


def test_each_table_has_the_columns_and_cells_status_prints():
    view = stalled_view()
    text = render(view, width=None)
    page, tables = _page(view)
    for title in ("Nodes", "Processes (by rank)", "Training (by rank, as reported)", "GPUs"):
        headers, rows = tables[title]
        header, *lines = _text_table(text, title)
        assert " ".join(headers) == " ".join(header.split()), title
        rows = [cells for _, cells in rows if len(cells) > 1]  # not the note rows
        lines, footer = lines[:len(rows)], lines[len(rows):]  # the sentences under the table follow its rows
        assert len(rows) == len(lines) >= 1, title
        for said in footer:
            assert f'<p class="footer">{escape(said.strip())}</p>' in page, said
        for cells, line in zip(rows, lines, strict=True):
            for cell in cells:  # the text cuts a cell to its column; the page shows it whole
                assert fit(cell, len(cell)) in line or fit(cell, 10)[:-1] in line, (title, cell, line)


def test_the_held_gone_and_stalled_rows_are_marked_with_what_status_says_of_them():
    view = stalled_view()
    _, tables = _page(view)
    _, procs = tables["Processes (by rank)"]
    marks = [(mark, cells) for mark, cells in procs]
    assert [m for m, c in marks if len(c) > 1] == ["", "held", "gone"]
    notes = [c[0] for m, c in marks if len(c) == 1]
    assert notes[0].startswith("↳ uninterruptible sleep (D) for") and notes[1] == "↳ gone"
    view.alerts.add(rule="gpu_memory_leak", state="firing", node=view.processes[0].node, pid=123456)
    _, tables_alerted = _page(view)
    assert tables_alerted["Processes (by rank)"][1][0][0] == "alerted"  # the rank a firing alert is about
    _, training = tables["Training (by rank, as reported)"]
    assert [m for m, c in training if len(c) > 1] == ["", "stalled", ""]
    assert [c[0] for m, c in training if len(c) == 1] == ["↳ stalled since " + _hhmmss(700.0) + " (5 min)"]


def _hhmmss(t: float) -> str:
    import time

    return time.strftime("%H:%M:%S %Z", time.localtime(t))


def test_overall_requests_code_and_notes_show_what_status_says():
    view = stalled_view()
    view.job.cpus, view.job.memory_bytes = 8, 64 << 30
    text = render(view, width=None)
    page, tables = _page(view)
    _, overall = tables["Overall utilisation"]
    assert [c[0] for _, c in overall] == ["GPU utilisation", "GPU memory", "CPU efficiency", "Host memory"]
    for name, used, figures in (c for _, c in overall):
        assert re.search(rf"  {re.escape(name)} +\[[█░]+\] +{used}  {re.escape(figures)}\n", text), name
    headers, (answer,) = tables["Requests to the training processes"]
    assert headers == ["RANK", "REQUEST", "ANSWER", "WHEN", "ASKED BY", "MESSAGE"]
    assert f"  {answer[1][0]}: {answer[1][1]} {answer[1][2]}, {answer[1][3]} (asked by {answer[1][4]}): " in text
    _, (code,) = tables["Code (git provenance)"]
    assert f"  {code[1][1]}\n" in text and code[1][2].startswith("python train.py --option=value")
    assert "<h3>Notes</h3>" in page and "has exited while the job runs" in page


def test_the_report_text_stays_whole_in_a_details():
    view = stalled_view()
    page, _ = _page(view)
    shown = re.search(r'<details id="status-text"><summary>.*?</summary><pre id="status">(.*?)</pre></details>',
                      page, re.S)
    assert shown and shown.group(1) == escape(render(view, width=None))


def test_hostile_text_in_every_section_is_text():
    view = stalled_view()
    view.job.name = view.tags["exp"] = "n" + EVIL
    view.nodes.add(node="node" + EVIL, agent_up=False, gpu_pids_note="pids" + EVIL)
    view.processes.add(node="node" + EVIL, pid=9, command="cmd" + EVIL, alive=True, rank=5, state="D",
                       wchan="wait" + EVIL, step=1, stalled_since=900.0)
    view.gpus.add(node="node" + EVIL, index=3, name="gpu" + EVIL, processes=0)
    view.train_answers.add(node="node" + EVIL, pid=9, kind="kind" + EVIL, status="status" + EVIL,
                           asked_by="who" + EVIL, message="said" + EVIL, asked_at=999.0)
    view.provenance_json = json.dumps([{"node": "n", "pid": 1, "code_id": "a", "cmdline": ["cmd" + EVIL],
                                        "git": {"root": "/r" + EVIL, "commit": "1" * 40, "branch": "b" + EVIL}},
                                       {"node": "n", "pid": 2, "code_id": "b", "git": {"error": "e" + EVIL}}])
    view.alerts.add(rule="gpu_memory_leak", state="firing", rank=5, node="node" + EVIL, description="d" + EVIL)
    view.job.state = "RUNNING\u202eevil\x1b[2J"
    page, tables = _page(view)
    assert "<script>" not in page.replace("<script>var changed", "") and "\"'&<" not in page
    assert "\u202e" not in page and "\x1b" not in page  # shown as \u202e and \x1b, as status shows them
    report = page.split('<section id="report">', 1)[1]
    for text in ("node" + EVIL, "cmd" + EVIL, "gpu" + EVIL, "said"):
        assert escape(text) in report, text
    cells = [c for _, rows in tables.values() for _, row in rows for c in row]
    assert "node" + EVIL in cells and "cmd" + EVIL in cells  # whole, as text, in their cells
    assert any(c.startswith("↳ uninterruptible sleep (D)") and c.endswith("wait" + EVIL) for c in cells)
