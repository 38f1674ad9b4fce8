"""The report's text primitives: escaping user text, fitting, tables, meters, sparklines, wrapping.

Pure and free of protobuf at import: replay and provenance print with printable() alone.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from clusterwatch.humanize import duration, size

SPARKS = "▁▂▃▄▅▆▇█"
GIB = 1024**3
MIB = 1024**2
WIDTH = 78       # rules and wrapped text; tables may be wider where nothing limits them
MIN_WIDTH = 80   # a terminal narrower than this gets the 80-column layout all the same
RULE = "\0rule"  # where a rule goes: drawn once the report's width is known


# C0 and C1 controls, DEL, and the bidirectional marks, embeddings, overrides and isolates ("Trojan
# Source"): written raw, a job name, command, tag or path could move the cursor, clear or recolour the
# screen, set the window title, hide or reorder what is shown.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` from users (a job name, a command, a tag, a path) with its control characters shown escaped.

    ESC becomes the four characters `\\x1b`, a newline `\\x0a`: what they would have done to the terminal
    is visible instead of done. Everything the CLI prints that came from users goes through here.
    """
    return _UNSAFE.sub(_escaped, text) if _UNSAFE.search(text) else text


def printable_message(message):
    """A copy of a protobuf message (a JobView, a JobInfo, an alert) with every string in it `printable`."""
    copy = type(message)()
    copy.CopyFrom(message)
    _make_printable(copy)
    return copy


def _make_printable(message) -> None:
    strings, messages, maps = _plan(message.DESCRIPTOR)
    for name in strings:
        value = getattr(message, name)
        if isinstance(value, str):
            if _UNSAFE.search(value):
                setattr(message, name, printable(value))
        elif any(_UNSAFE.search(v) for v in value):  # repeated string
            value[:] = [printable(v) for v in value]
    for name in messages:
        field = message.DESCRIPTOR.fields_by_name[name]
        if field.is_repeated:
            for item in getattr(message, name):
                _make_printable(item)
        elif message.HasField(name):
            _make_printable(getattr(message, name))
    for name, values_are_messages in maps:
        value = getattr(message, name)
        if values_are_messages:
            for key in list(value):
                _make_printable(value[key])
                if printable(key) != key:
                    value[printable(key)].CopyFrom(value[key])
                    del value[key]
        else:
            items = {printable(k) if isinstance(k, str) else k: printable(v) if isinstance(v, str) else v
                     for k, v in value.items()}
            value.clear()
            value.update(items)


_PLANS: dict = {}


def _plan(descriptor) -> tuple[list[str], list[str], list[tuple[str, bool]]]:
    """A message type's string fields, message fields and map fields, worked out once per type.

    Message fields whose type holds no string at any depth are left out: a 512-process report
    would otherwise walk every trend and figure. Measured 2026-12-01 on the 2-core VM: the copy and walk of
    a 512-process, 512-GPU view take 2.5 ms of its 20 ms report.
    """
    plan = _PLANS.get(descriptor)
    if plan is None:
        strings, messages, maps = [], [], []
        for field in descriptor.fields:
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                value_type = field.message_type.fields_by_name["value"].message_type
                maps.append((field.name, value_type is not None))
            elif field.message_type is not None:
                if _holds_strings(field.message_type, set()):
                    messages.append(field.name)
            elif field.type == field.TYPE_STRING:
                strings.append(field.name)
        plan = _PLANS[descriptor] = (strings, messages, maps)
    return plan


def _holds_strings(descriptor, seen: set) -> bool:
    if descriptor.full_name in seen:
        return False
    seen.add(descriptor.full_name)
    return any(f.type == f.TYPE_STRING or (f.message_type is not None and _holds_strings(f.message_type, seen))
               for f in descriptor.fields)


def fit(text: str, width: int) -> str:
    """`text` cut to `width` characters, with "…" saying it was cut."""
    return text if len(text) <= width else text[:max(0, width - 1)] + "…"


def report_width() -> int:
    """The columns to fit: $COLUMNS or the terminal's (80 at least); 80 into a file or a pipe, where a
    mail, a log or a pager shows it."""
    import os
    import shutil
    import sys

    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return max(MIN_WIDTH, int(columns))
    try:
        if sys.stdout.isatty():
            return max(MIN_WIDTH, shutil.get_terminal_size().columns)
    except (OSError, ValueError, AttributeError):
        pass
    return MIN_WIDTH


class Col:
    """A table column: header, width, alignment ('<' or '>'), and when it goes (0: never; higher: sooner)."""

    __slots__ = ("header", "width", "align", "drop")

    def __init__(self, header: str, width: int, align: str = ">", drop: int = 0) -> None:
        self.header, self.width, self.align, self.drop = header, width, align, drop


def table(columns: list[Col], rows: list[list[str]], width: int | None, tails: list[str] | None = None) -> list[str]:
    """The header and rows, two spaces in, one between cells; cells cut with "…" to their column.

    Columns that can go are dropped, soonest first, until a line fits `width` (None: keep them all).
    `tails` are appended to their row as they are (a short "(gone)"), not counted.
    """
    keep = list(range(len(columns)))

    def line_width(idx: list[int]) -> int:
        return 2 + sum(columns[i].width for i in idx) + max(0, len(idx) - 1)

    if width is not None:
        for level in sorted({c.drop for c in columns if c.drop}, reverse=True):
            if line_width(keep) <= width:
                break
            keep = [i for i in keep if columns[i].drop != level]

    def cells(values: list[str]) -> str:
        return "  " + " ".join(f"{fit(values[i], columns[i].width):{columns[i].align}{columns[i].width}}"
                               for i in keep)

    out = [cells([c.header for c in columns]).rstrip()]
    for n, row in enumerate(rows):
        out.append(cells(row).rstrip() + (tails[n] if tails else ""))
    return out


@dataclass
class Table:
    """A section's table as data: the text report formats it with table() (lines()), the job page as an HTML
    table, so the two show the same rows."""

    title: str
    columns: list[Col]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # per row: said under it ("" for nothing)
    marks: list[str] = field(default_factory=list)  # per row: what the page marks it as ("held", "stalled"; "")
    footer: list[str] = field(default_factory=list)  # sentences under the table

    def add(self, row: list[str], note: str = "", mark: str = "") -> None:
        self.rows.append(row)
        self.notes.append(note)
        self.marks.append(mark)

    def lines(self, width: int | None) -> list[str]:
        """The section as the text report prints it: its title, the table with each row's note, the footer."""
        return ([title(self.title)] + with_notes(table(self.columns, self.rows, width), self.notes, width)
                + [f"  {line}" for line in self.footer])


def with_notes(lines: list[str], notes: list[str], width: int | None) -> list[str]:
    """A table's lines (header first) with each row's note, where it has one, on lines of its own below it:
    a row stays within the width however long its note."""
    out = lines[:1]
    for line, note in zip(lines[1:], notes, strict=True):
        out.append(line)
        if note:
            out.extend(wrap_words(note, "        ↳ ", "          ", width or len(note) + 12))
    return out


def human_bytes(n: float | None) -> str:
    """Bytes in IEC units, as the collector's alert text has them (clusterwatch.humanize)."""
    return size(n)


def human_duration(seconds: float) -> str:
    """A span of time as every report and alert writes one ("45 s", "6 min", "1 h 24 min": clusterwatch.humanize)."""
    return duration(seconds)


def sparkline(values: list[float], width: int = 12) -> str:
    """A small trend line; flat series draw flat, growth reads left to right."""
    if not values:
        return ""
    if len(values) > width:
        step = (len(values) - 1) / (width - 1)
        values = [values[round(i * step)] for i in range(width)]
    lo, hi = min(values), max(values)
    if hi - lo <= max(abs(hi) * 1e-3, 1e-9):
        return SPARKS[0] * len(values)
    return "".join(SPARKS[min(7, int((v - lo) / (hi - lo) * 7.999))] for v in values)


def meter(fraction: float | None, width: int = 40) -> str:
    if fraction is None:
        return "[" + " " * width + "]   n/a"
    f = min(max(fraction, 0.0), 1.0)
    filled = round(f * width)
    return "[" + "█" * filled + "░" * (width - filled) + f"] {fraction * 100:4.0f}%"


def trend_word(values: list[float]) -> str:
    """'growing' / 'falling' / 'flat' from the first and last quarter of a trend."""
    if len(values) < 8:
        return ""
    q = len(values) // 4
    a, b = sum(values[:q]) / q, sum(values[-q:]) / q
    if a <= 0 and b <= 0:
        return ""
    change = (b - a) / max(a, 1.0)
    if change > 0.05:
        return "growing"
    if change < -0.05:
        return "falling"
    return ""


def title(text: str) -> str:
    """A section's title and its rule."""
    return f"\n{text}\n{RULE}─"


def exit_text(code: int) -> str:
    """An exit code as people read it: 143 is "exit code 143: SIGTERM" (128 + the signal that ended the job)."""
    import signal

    if 128 < code < 128 + signal.NSIG:
        try:
            return f"exit code {code}: {signal.Signals(code - 128).name}"
        except ValueError:  # not a signal this system names
            pass
    return f"exit code {code}"


def draw_rules(text: str, width: int | None) -> str:
    """Rules as wide as the widest line (at least WIDTH), within `width`; alert lines, which wrap only
    where there is a width to fit, do not count."""
    widest = max(len(x) for x in text.splitlines() if not x.startswith((RULE, "  ● ", "  ◐ ", "  ○ ", "  ? ")))
    span = max(WIDTH, min(widest, width if width is not None else widest))
    return text.replace(f"{RULE}─", "─" * span).replace(f"{RULE}═", "═" * span)


def fit_lines(text: str, width: int | None) -> str:
    """Every line of `text` within `width`: a longer one (prose: a note, a command, an answer) wraps at its
    words, its next lines indented two more than it; a word longer than a line is cut with "…"."""
    if width is None:
        return text
    out = []
    for line in text.split("\n"):
        indent = " " * (len(line) - len(line.lstrip(" ")) + 2)
        while len(line) > width:
            cut = line.rfind(" ", len(indent), width + 1)  # the part kept keeps its spacing (a label's column)
            if cut < len(indent) or not line[:cut].strip():
                line = fit(line, width)
                break
            out.append(line[:cut].rstrip())
            line = indent + line[cut:].lstrip()
        out.append(line)
    return "\n".join(out)


def wrap_words(text: str, first: str, indent: str, width: int) -> list[str]:
    """`text` in lines of at most `width`, the first after `first`, the others after `indent`."""
    lines, cur = [], first
    for w in text.split():
        if len(cur) + len(w) > width and cur.strip():
            lines.append(cur.rstrip())
            cur = indent
        cur += w + " "
    lines.append(cur.rstrip())
    return lines


def wrap(text: str, indent: str) -> list[str]:
    """`text` in lines of at most WIDTH, two spaces in, the others after `indent`."""
    words, lines, cur = text.split(), [], "  "
    for w in words:
        if len(cur) + len(w) + 1 > WIDTH:
            lines.append(cur.rstrip())
            cur = indent
        cur += w + " "
    lines.append(cur.rstrip())
    return lines
