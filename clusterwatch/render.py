"""Turn a JobView into the report `clusterwatch status` prints. Pure: a view in, text out.

The layout follows what users read first: who and what (header), how the whole job
is doing (meters), then each rank and GPU with its trend, then alerts and advice.
"""
from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from clusterwatch.humanize import duration, size
from clusterwatch.model import HELD_STATES

if TYPE_CHECKING:  # only for annotations: replay and provenance use printable() without protobuf
    from clusterwatch.v1 import query_pb2

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


def report_width() -> int | None:
    """The columns to fit: $COLUMNS or the terminal's (80 at least); None (no limit) into a file or a pipe."""
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
    return None


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


def _title(text: str) -> str:
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


def render(view: query_pb2.JobView, now: float | None = None, width: int | None = -1) -> str:
    """The full report for one job.

    `width`: the columns to fit (tables drop their least needed columns, alerts wrap); the default
    is report_width(); None: no limit. Rules span the widest line, within that width.
    """
    if width == -1:
        width = report_width()
    view = printable_message(view)
    now = now or view.now or time.time()
    job = view.job
    lines: list[str] = []
    ended = job.end_time > 0
    run_time = (job.end_time if ended else now) - job.start_time if job.start_time else 0
    name = f'  "{job.name}"' if job.name else ""
    lines.append(f"{RULE}═")
    lines.append(f" clusterwatch · job {job.job_id}{name}")
    lines.append(f"{RULE}═")
    state = job.state + (f" ({exit_text(job.exit_code)})" if job.HasField("exit_code") else "")
    ranks_seen = len({p.rank for p in view.processes if p.HasField("rank")})
    rows = [
        ("User/Account", f"{job.user or '?'}{'/' + job.account if job.account else ''}"),
        ("State", state),
        ("Nodes", f"{len(job.nodes)}  ({', '.join(job.nodes[:6])}{' …' if len(job.nodes) > 6 else ''})"),
        ("GPUs", str(job.gpus or len(view.gpus))),
    ]
    if job.partition:
        rows.append(("Partition", job.partition))
    if job.qos:
        rows.append(("QOS", job.qos))
    if job.cluster:
        rows.append(("Cluster", job.cluster))
    if job.cpus:
        rows.append(("CPU cores", str(job.cpus)))
    if job.memory_bytes:
        rows.append(("CPU memory", human_bytes(job.memory_bytes)))
    if job.start_time:
        rows.append(("Start time", time.strftime("%a %b %d %Y %H:%M:%S %Z", time.localtime(job.start_time))))
    rows.append(("Run time", human_duration(run_time)
                 + (f" of {human_duration(job.time_limit_s)} limit" if job.time_limit_s else "")))
    expected = job.ranks_expected
    if expected or ranks_seen:
        rows.append(("Ranks", f"{ranks_seen} seen" + (f" of {expected} expected" if expected else "")))
    rows.append(("Known from", job.source))
    for k, v in rows:
        lines.append(f"  {k:>13}: {v}")
    if job.note:
        lines.append(f"  {'Note':>13}: {job.note}")
    if view.tags:
        lines.append(f"  {'Tags':>13}: " + ", ".join(f"{k}={v}" for k, v in sorted(view.tags.items())))

    lines.extend(_overall(view, width, run_time))
    lines.extend(_nodes(view, width))
    lines.extend(_ranks(view, now, width))
    lines.extend(_gpus(view, width))
    lines.extend(_alerts(view, width))
    from .render_health import health_section  # it draws with this module's helpers

    lines.extend(health_section(view, width))
    from .render_requests import requests_section  # requests back to the ranks (render_requests.py)

    lines.extend(requests_section(view, now))
    lines.extend(_provenance(view))
    lines.extend(_notes(view, run_time))
    return _draw_rules("\n".join(lines) + "\n", width)


def _draw_rules(text: str, width: int | None) -> str:
    """Rules as wide as the widest line (at least WIDTH), within `width`; alert lines, which wrap only
    where there is a width to fit, do not count."""
    widest = max(len(x) for x in text.splitlines() if not x.startswith((RULE, "  ● ", "  ◐ ", "  ○ ", "  ? ")))
    span = max(WIDTH, min(widest, width if width is not None else widest))
    return text.replace(f"{RULE}─", "─" * span).replace(f"{RULE}═", "═" * span)


def job_cpu(view: query_pb2.JobView, run_time: float) -> tuple[float, float | None]:
    """(CPU time of the job's processes over their whole lives, CPU efficiency as jobstats shows it: that
    time over run time × allocated cores; None where Slurm gave no core count or no time has passed)."""
    cpu_s = sum(p.cpu_seconds for p in view.processes)
    cores = view.job.cpus
    return cpu_s, (cpu_s / (run_time * cores) if cores and run_time > 0 else None)


def _overall(view: query_pb2.JobView, width: int | None, run_time: float = 0.0) -> list[str]:
    out = [_title("Overall utilisation")]
    meters: list[tuple[str, float | None, str]] = []  # label, fraction, the figures after the meter
    lines: list[tuple[str, str]] = []  # label, figures without a meter (nothing to compare with)
    live = [p for p in view.processes if p.alive] or list(view.processes)
    gpus = list(view.gpus)
    ended = bool(view.job.end_time)
    if gpus:
        # the whole job, where the collector accumulated it (every reading while the job's processes were on
        # its GPUs); else averaged over the history held
        busy = sum(g.busy_seconds for g in gpus)
        covered = sum(g.covered_seconds for g in gpus)
        trend = [u for g in gpus for u in g.utilization_trend]
        util = [g.utilization for g in gpus if g.HasField("utilization")]
        if covered > 0:
            avg, how = busy / covered * 100, "  whole job"
        else:
            avg = sum(trend) / len(trend) if trend else (sum(util) / len(util) if util else None)
            how = "  average"
        meters.append(("GPU utilisation", avg / 100 if avg is not None else None, how))
        # an ended job is judged by its peaks (its last readings are after the processes left)
        used = sum(g.memory_peak_bytes if ended else g.memory_used_bytes for g in gpus
                   if ended or g.HasField("memory_used_bytes"))
        total = sum(g.memory_total_bytes for g in gpus)
        meters.append(("GPU memory", used / total if total else None,
                       f"  {human_bytes(used)} of {human_bytes(total)}{' at peak' if ended else ''}" if total else ""))
    cpu_s, efficiency = job_cpu(view, run_time)
    cores = view.job.cpus
    if efficiency is not None:
        meters.append(("CPU efficiency", efficiency,
                       f"  {duration(cpu_s)} CPU time of {cores} cores × {duration(run_time)}"))
    elif run_time > 0 and cpu_s > 0:  # what is known without Slurm's core count
        lines.append(("CPU", f"{cpu_s / run_time:.1f} cores busy on average ({duration(cpu_s)} CPU time); "
                             "allocated cores unknown"))
    else:  # no CPU time yet (the first polls): the latest readings
        now_cores = sum(p.cpu_percent for p in live if p.HasField("cpu_percent")) / 100
        if cores:
            meters.append(("CPU", now_cores / cores, f"  {now_cores:.1f} of {cores} cores"))
        else:
            lines.append(("CPU", f"{now_cores:.1f} cores busy now; allocated cores unknown"))
    # host memory against what Slurm allocated (the job is killed past it), never the node's RAM
    rss = (sum(p.rss_peak_bytes for p in view.processes) if ended
           else sum(p.rss_bytes for p in live if p.HasField("rss_bytes")))
    mem = view.job.memory_bytes
    at = " at peak" if ended else ""
    if mem:
        meters.append(("Host memory", rss / mem, f"  {human_bytes(rss)}{at} of {human_bytes(mem)} allocated"))
    else:
        ram = sum(n.memory_total_bytes for n in view.nodes)
        lines.append(("Host memory", f"{human_bytes(rss)}{at}; allocation unknown"
                                     + (f" (node RAM {human_bytes(ram)})" if ram else "")))
    # 40 cells, fewer where the lines must fit: 19 before the meter, 2 brackets and "  nnn%" after it
    cells = 40
    if width is not None:
        cells = max(10, min(40, width - 19 - 8 - max((len(t) for _, _, t in meters), default=0)))
    if not gpus:
        out.append("  GPU              no GPU reported for this job")
    for name, fraction, text in meters:
        out.append(f"  {name:<16} {meter(fraction, cells)}{text}")
    for name, text in lines:
        out.append(f"  {name:<16} {text}")
    return out


def _nodes(view: query_pb2.JobView, width: int | None) -> list[str]:
    """Per node: is its agent reporting, and what the job uses there (jobstats' per-node lines)."""
    if len(view.nodes) < 1:
        return []
    out = [_title("Nodes")]
    ended = bool(view.job.end_time)
    columns = [Col("NODE", 14, "<"), Col("AGENT", 6, "<"), Col("PROCS", 5), Col("CPU CORES", 9),
               Col("HOST MEM", 10), Col("GPUS", 4, drop=1), Col("GPU UTIL", 8),
               Col("GPU MEM (peak)" if ended else "GPU MEM", 20)]
    # grouped in one pass: a scan of every process per node was 3 ms of a 512-process job's 8 ms report
    procs_of: dict[str, list] = {}
    for p in view.processes:
        if p.alive or ended:
            procs_of.setdefault(p.node, []).append(p)
    gpus_of: dict[str, list] = {}
    for g in view.gpus:
        gpus_of.setdefault(g.node, []).append(g)
    rows = []
    for n in sorted(view.nodes, key=lambda n: n.node):
        procs = procs_of.get(n.node, [])
        cpu = sum(p.cpu_percent for p in procs if p.HasField("cpu_percent")) / 100
        rss = sum(p.rss_bytes for p in procs if p.HasField("rss_bytes"))
        gpus = gpus_of.get(n.node, [])
        covered = sum(g.covered_seconds for g in gpus)
        trend = [u for g in gpus for u in g.utilization_trend]
        if covered:  # the whole job's, while its processes were on them
            util = f"{sum(g.busy_seconds for g in gpus) / covered * 100:.0f}%"
        else:
            util = f"{sum(trend) / len(trend):.0f}%" if trend else "-"
        used = sum(g.memory_peak_bytes if ended else g.memory_used_bytes for g in gpus
                   if ended or g.HasField("memory_used_bytes"))
        total = sum(g.memory_total_bytes for g in gpus)
        mem = f"{human_bytes(used)} / {human_bytes(total)}" if total else "-"
        agent = "ended" if ended else ("up" if n.agent_up else "DOWN")
        rows.append([n.node, agent, str(len(procs)), f"{cpu:.1f}", human_bytes(rss), str(len(gpus)), util, mem])
    out.extend(table(columns, rows, width))
    down = [n.node for n in view.nodes if not n.agent_up and not ended]
    if down:
        out.append(f"  no recent samples from {', '.join(down)}: its figures are the last ones received")
    for n in sorted(view.nodes, key=lambda n: n.node):
        if n.gpu_pids_note:  # the agent cannot tie GPU memory to processes there (a container without host pids)
            out.append(f"  {n.node}: {n.gpu_pids_note}")
    return out


def _ranks(view: query_pb2.JobView, now: float, width: int | None) -> list[str]:
    out = [_title("Processes (by rank)")]
    if not view.processes:
        out.append("  no process of this job has been reported yet")
        return out
    has_steps = any(p.HasField("step") for p in view.processes)
    # the allocator's own figures, where a process reports them (clusterwatch.train): beside NVML's
    has_alloc = any(p.HasField("gpu_allocated_bytes") or p.HasField("gpu_reserved_bytes") for p in view.processes)
    # at 80 columns the trends, the GPU memory peak and the per-process GPU utilisation go first
    columns = [Col("RANK", 5), Col("NODE", 10, "<"), Col("PID", 7), Col("CMD", 10, "<"), Col("GPU MEM", 9)]
    if has_alloc:
        columns += [Col("ALLOC", 9), Col("RESERVED", 9)]
    columns += [Col("PEAK", 9, drop=2), Col("TREND", 12, "<", drop=3), Col("UTIL", 5, drop=1), Col("CPU", 5),
                Col("RSS", 9), Col("TREND", 8, "<", drop=3)]
    if has_steps:
        columns += [Col("STEP", 7), Col("STEP/S", 6)]
    rows, tails = [], []
    for p in view.processes:
        row = [str(p.rank) if p.HasField("rank") else "-", p.node, str(p.pid), p.command,
               human_bytes(p.gpu_memory_bytes) if p.HasField("gpu_memory_bytes") else "-"]
        if has_alloc:
            row += [human_bytes(p.gpu_allocated_bytes) if p.HasField("gpu_allocated_bytes") else "-",
                    human_bytes(p.gpu_reserved_bytes) if p.HasField("gpu_reserved_bytes") else "-"]
        row += [human_bytes(p.gpu_memory_peak_bytes) if p.gpu_memory_peak_bytes else "-",
                sparkline(list(p.gpu_memory_trend)) if p.gpu_memory_peak_bytes else "",
                f"{p.gpu_utilization:.0f}%" if p.HasField("gpu_utilization") else "-",
                f"{p.cpu_percent:.0f}%" if p.HasField("cpu_percent") else "-",
                human_bytes(p.rss_bytes) if p.HasField("rss_bytes") else "-",
                sparkline(list(p.rss_trend), 8)]
        if has_steps:
            row += [str(p.step) if p.HasField("step") else "-",
                    f"{p.steps_per_s:.2f}" if p.HasField("steps_per_s") else "-"]
        rows.append(row)
        tail = "  (gone)" if not p.alive and not view.job.end_time else ""
        if p.HasField("stalled_since"):  # its step has not moved for a while: its STEP/S reads 0
            tail += f"  stalled since {time.strftime('%H:%M:%S %Z', time.localtime(p.stalled_since))}"
            if p.alive and not view.job.end_time:
                tail += f" ({duration(now - p.stalled_since)})"
        if p.state:
            tail += f"  {held_text(p, now)}"
        tails.append(tail)
    out.extend(table(columns, rows, width, tails))
    if has_alloc:
        out.append("  GPU MEM is NVML's figure (the CUDA context and the allocator's reserve); ALLOC (live tensors) "
                   "and RESERVED are the allocator's own")
    rates = [(p.steps_per_s, p) for p in view.processes if p.HasField("steps_per_s") and p.alive]
    if len(rates) > 1:
        slow_rate, slow = min(rates, key=lambda r: r[0])
        fast = max(r for r, _ in rates)
        if fast > 0 and slow_rate < 0.9 * fast:
            who = f"rank {slow.rank}" if slow.HasField("rank") else f"pid {slow.pid}"
            out.append(f"  slowest: {who} on {slow.node} at {slow_rate:.2f} steps/s "
                       f"({(1 - slow_rate / fast) * 100:.0f}% behind the fastest)")
    mapped = sorted({p.mapped_by for p in view.processes if p.mapped_by})
    if mapped:
        out.append(f"  mapped to the job by: {', '.join(mapped)}")
    return out


def held_text(p: query_pb2.ProcessView, now: float) -> str:
    """A process held where it is, as the ranks table's tail says it: "in uninterruptible sleep (D) for 6 min,
    in nfs_wait_bit_killable"."""
    text = f"{HELD_STATES.get(p.state, 'held')} ({p.state})"
    if p.HasField("state_since"):
        text += f" for {duration(max(0.0, now - p.state_since))}"
    if p.wchan:
        text += f", in {p.wchan}"
    return text


def _gpus(view: query_pb2.JobView, width: int | None) -> list[str]:
    if not view.gpus:
        return []
    out = [_title("GPUs")]
    columns = [Col("NODE", 10, "<"), Col("GPU", 3), Col("NAME", 22, "<"), Col("UTIL", 5),
               Col("TREND", 12, "<", drop=2), Col("MEMORY", 21), Col("PEAK", 9, drop=1), Col("POWER", 6),
               Col("PROCS", 5)]
    rows = []
    for g in view.gpus:
        rows.append([g.node, str(g.index), g.name, f"{g.utilization:.0f}%" if g.HasField("utilization") else "-",
                     sparkline(list(g.utilization_trend)),
                     (f"{human_bytes(g.memory_used_bytes)} / {human_bytes(g.memory_total_bytes)}"
                      if g.HasField("memory_used_bytes") else "-"),
                     human_bytes(g.memory_peak_bytes),
                     f"{g.power_watts:.0f} W" if g.HasField("power_watts") else "-",
                     str(g.processes) if g.processes else "none"])
    out.extend(table(columns, rows, width))
    return out


def _alerts(view: query_pb2.JobView, width: int | None) -> list[str]:
    if not view.alerts:
        return []
    out = [_title("Alerts")]
    for a in sorted(view.alerts, key=lambda a: (_ALERT_ORDER.get(_alert_state(a), 4), -a.since)):
        state = _alert_state(a)
        # one that ended while firing keeps the firing mark: it never cleared (the process took it along)
        mark = {"firing": "●", "pending": "◐", "ended": "●", "resolved": "○"}.get(state, "?")
        head = f"  {mark} {state.upper():<8} {a.rule:<18} "
        if width is None or len(head) + len(a.description) <= width:
            out.append(head + a.description)
        else:  # the description wraps under itself
            out.extend(_wrap_words(a.description, head, " " * len(head), width))
    return out


_ALERT_ORDER = {"firing": 0, "pending": 1, "ended": 2, "resolved": 3}


def _alert_state(a) -> str:
    """An alert's state as the report says it: "ended" for one resolved only because its process or job
    ended while it fired (not good news, unlike "resolved")."""
    return "ended" if a.state == "resolved" and a.ended_while_firing else a.state


def describe_code(record: dict) -> str:
    """One line for a provenance record: where, which commit, how clean."""
    git = record.get("git") or {}
    if git.get("error") or git.get("commit") in (None, "unknown"):
        return printable(f"unknown ({git.get('error') or 'no git repository'})")
    state = "modified" if git.get("dirty") is True else "clean"
    untracked = git.get("untracked")
    if isinstance(untracked, int) and untracked:
        state += f", {untracked} untracked"
    diff = git.get("diff_sha256") or ""
    if git.get("dirty") is True and diff and diff != "unknown":
        state += f", diff {diff[:8]}"
    remote = git.get("remote_url")
    line = f"{git.get('root', '?')} @ {str(git.get('commit'))[:12]} ({git.get('branch', '?')}), {state}"
    if remote and remote != "unknown":
        line += f"; remote {remote}"
    return printable(line)


def _provenance(view: query_pb2.JobView) -> list[str]:
    if not view.provenance_json:
        return []
    import json

    try:
        records = json.loads(view.provenance_json)
    except ValueError:
        return []
    ranks = {(p.node, p.pid): (str(p.rank) if p.HasField("rank") else f"pid {p.pid}") for p in view.processes}
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(r.get("code_id", "unknown"), []).append(r)
    out = [_title("Code (git provenance)")]
    if len(groups) == 1:
        (records,) = groups.values()
        out.append(f"  {describe_code(records[0])}")
        out.append(f"  all {len(records)} recorded rank(s) run the same code")
        command = printable(" ".join(map(str, records[0].get("cmdline", []))))
        if command:
            out.append(f"  command: {command if len(command) <= WIDTH - 11 else command[:WIDTH - 12] + '…'}")
        return out
    out.append(f"  ranks run {len(groups)} different versions of the code:")
    for _, recs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        who = ", ".join(ranks.get((r.get("node"), r.get("pid")), f"pid {r.get('pid')}") for r in recs)
        out.append(f"  - ranks {who}: {describe_code(recs[0])}")
    return out


def _notes(view: query_pb2.JobView, run_time: float) -> list[str]:
    """Advice a user can act on, in the spirit of jobstats' notes."""
    notes = []
    gpus = [g for g in view.gpus if g.HasField("utilization")]
    idle = [g for g in view.gpus if g.processes == 0]
    for g in idle:
        notes.append(f"GPU {g.index} on {g.node} is allocated to this job but no process uses it. "
                     "If your code uses fewer GPUs than requested, ask for fewer (--gres=gpu:N).")
    if gpus and run_time > 600:
        avg = sum(g.utilization for g in gpus) / len(gpus)
        if avg < 25:
            notes.append(f"GPU utilisation is low ({avg:.0f}%). Check that the data loader keeps up "
                         "(more workers, pinned memory) or that the job needs a GPU at all.")
    job = view.job
    if job.memory_bytes and run_time > 600:
        peak = sum(p.rss_peak_bytes for p in view.processes)
        if peak < 0.2 * job.memory_bytes:
            notes.append(f"This job used at most {human_bytes(peak)} of the {human_bytes(job.memory_bytes)} "
                         "of host memory it requested; asking for less shortens queue times.")
    if job.time_limit_s and job.end_time and run_time < 0.2 * job.time_limit_s:
        notes.append(f"This job needed {run_time / job.time_limit_s * 100:.0f}% of its time limit "
                     f"({human_duration(job.time_limit_s)}); a shorter --time lowers queue times.")
    cpu_s, efficiency = job_cpu(view, run_time)
    if efficiency is not None and run_time > 600 and efficiency < 0.5:
        notes.append(f"CPU efficiency is {efficiency * 100:.0f}% ({duration(cpu_s)} of CPU time over "
                     f"{duration(run_time)} × {job.cpus} allocated cores). Ask for fewer cores (--cpus-per-task), "
                     "or give the cores work (more DataLoader workers).")
    stalled_alerted = {(a.node, a.pid) for a in view.alerts if a.rule == "training_stall" and a.state == "firing"}
    for p in view.processes:
        if not job.end_time and p.alive and p.HasField("stalled_since") and (p.node, p.pid) not in stalled_alerted:
            who = f"rank {p.rank}" if p.HasField("rank") else f"pid {p.pid}"
            notes.append(f"The step of {who} on {p.node} has not moved since "
                         f"{time.strftime('%H:%M:%S %Z', time.localtime(p.stalled_since))} (step {p.step}). "
                         f"`py-spy dump --pid {p.pid}` on {p.node} shows where it waits.")
    # ranks only: a job's short-lived helpers (a shell, git) come and go without harm
    gone = [p for p in view.processes if not p.alive and not job.end_time and p.HasField("rank")]
    if gone and any(p.alive and p.HasField("rank") for p in view.processes):
        who = ", ".join(f"rank {p.rank} on {p.node}" for p in gone[:4]) + (" …" if len(gone) > 4 else "")
        notes.append(f"{who} {'has' if len(gone) == 1 else 'have'} exited while the job runs: the other ranks may "
                     "wait for it forever in a collective. Look at its output for the error; cancel the job "
                     "if it cannot go on without it.")
    leak_alerted = any(a.rule == "gpu_memory_leak" and a.state == "firing" for a in view.alerts)
    for p in view.processes:
        word = trend_word(list(p.gpu_memory_trend))
        if word == "growing" and p.alive and not leak_alerted:  # a firing leak has its own note below
            who = f"rank {p.rank}" if p.HasField("rank") else f"pid {p.pid}"
            notes.append(f"GPU memory of {who} on {p.node} is growing; see Alerts for the rate and "
                         "the projected time until the GPU is full.")
    host_alerted = {(a.node, a.pid) for a in view.alerts if a.rule == "host_memory_leak"
                    and (a.state == "firing" or a.ended_while_firing)}
    for p in view.processes:  # host memory that climbs before (or without) an alert
        if (p.alive and (p.node, p.pid) not in host_alerted and trend_word(list(p.rss_trend)) == "growing"
                and p.rss_peak_bytes >= 256 * MIB):
            who = f"rank {p.rank}" if p.HasField("rank") else f"pid {p.pid}"
            notes.append(f"Host memory of {who} on {p.node} is growing ({human_bytes(p.rss_bytes)} now); a leak "
                         "ends with the job killed at its --mem.")
    if job.memory_bytes:
        peak = sum(p.rss_peak_bytes for p in view.processes)
        if peak >= 0.9 * job.memory_bytes:
            notes.append(f"Host memory reached {human_bytes(peak)} of the {human_bytes(job.memory_bytes)} "
                         "allocated: past it, Slurm kills the job (OUT_OF_MEMORY). Ask for more (--mem) or use less.")
    notes.extend(alert_notes(view))
    if not notes:
        return []
    out = [_title("Notes")]
    for n in notes:
        out.extend(_wrap(f"* {n}", "    "))
    return out


# What to do about an alert that is firing (or that ended with its process), by rule: one note a rule,
# naming who. The health rules (gpu_xid, ...) carry their advice in the Health section.
_ALERT_ADVICE = {
    "gpu_memory_leak": "GPU memory of {who} {full}. Look for tensors kept across steps (losses "
                       "appended without .item(), caches keyed by batch); torch.cuda.memory_summary() at two "
                       "steps shows what grows. Checkpoint now if the run matters.",
    "host_memory_leak": "Host memory of {who} {full}; past the job's --mem, Slurm kills it. Look for "
                        "data kept across steps and for DataLoader workers copying the dataset; tracemalloc "
                        "snapshots at two steps show what grows.",
    "training_stall": "Training of {who} is not advancing. `py-spy dump --pid PID` on its node shows where it "
                      "waits; a busy GPU with no steps is often a hung collective (NCCL_DEBUG=INFO, a timeout "
                      "in init_process_group). Cancel it if it does not recover: it holds its GPUs.",
    "gpu_stall": "The GPU of {who} is idle while the process runs: it waits on data or on the CPU. More "
                 "DataLoader workers, pinned memory, or `py-spy dump --pid PID` shows where it spends its time.",
    "idle_gpu": "GPUs allocated to this job are idle ({who}). If the code uses fewer GPUs than requested, ask "
                "for fewer (--gres=gpu:N).",
    "gpu_memory_fragmentation": "The allocator of {who} holds more and more free cache it cannot reuse (allocations "
                                "retry after freeing it): fragmentation. Start it with "
                                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; varying tensor shapes "
                                "(padding to fixed sizes helps) are the usual cause.",
    "handle_leak": "Threads or open files of {who} keep growing: something opened each step is never closed "
                   "(files, sockets, DataLoader iterators recreated). `ls /proc/PID/fd` shows what.",
    "agent_down": "The agent on {who} is not reporting: that node's figures are old. Tell the cluster's "
                  "operators if it lasts.",
    "code_mismatch": "Ranks run different versions of the code: check that every node sees the same checkout "
                     "(see Code below).",
}


def alert_notes(view) -> list[str]:
    """What to do about the alerts firing (and those that ended while firing), one note a rule."""
    by_rule: dict[str, list] = {}
    for a in view.alerts:
        if a.state == "firing" or (a.state == "resolved" and a.ended_while_firing):
            by_rule.setdefault(a.rule, []).append(a)
    notes = []
    for rule, alerts in by_rule.items():
        advice = _ALERT_ADVICE.get(rule)
        if advice is None:
            continue
        whos = []
        for a in alerts:
            if rule == "agent_down":
                who = a.node
            elif rule == "idle_gpu":
                who = f"{a.gpu[:12]} on {a.node}" if a.gpu else a.node
            else:
                who = f"rank {a.rank}" if a.HasField("rank") else f"pid {a.pid}"
                who += f" on {a.node}" if a.node else ""
            if who not in whos:
                whos.append(who)
        full = ""
        if rule in ("gpu_memory_leak", "host_memory_leak"):
            ended = [a for a in alerts if a.ended_while_firing]
            if ended and len(ended) == len(alerts):
                full = "was still growing when it ended (an out-of-memory kill looks like this)"
            else:
                full = "keeps growing (see Alerts for the rate and the time until it is full)"
        notes.append(advice.format(who=", ".join(whos[:4]) + (" …" if len(whos) > 4 else ""), full=full))
    return notes


def _wrap_words(text: str, first: str, indent: str, width: int) -> list[str]:
    """`text` in lines of at most `width`, the first after `first`, the others after `indent`."""
    lines, cur = [], first
    for w in text.split():
        if len(cur) + len(w) > width and cur.strip():
            lines.append(cur.rstrip())
            cur = indent
        cur += w + " "
    lines.append(cur.rstrip())
    return lines


def _wrap(text: str, indent: str) -> list[str]:
    words, lines, cur = text.split(), [], "  "
    for w in words:
        if len(cur) + len(w) + 1 > WIDTH:
            lines.append(cur.rstrip())
            cur = indent
        cur += w + " "
    lines.append(cur.rstrip())
    return lines


def render_jobs(jobs: list[query_pb2.JobInfo], firing: dict[str, int], now: float) -> str:
    if not jobs:
        return "no jobs known to the collector\n"
    jobs = [printable_message(j) for j in jobs]
    firing = {printable(k): v for k, v in firing.items()}
    out = [f"{'JOB':<14} {'USER':<10} {'STATE':<10} {'NODES':>5} {'GPUS':>4} {'RUN TIME':>11} {'ALERTS':>6}  NAME"]
    for j in jobs:
        run = ((j.end_time or now) - j.start_time) if j.start_time else 0
        alerts = str(firing.get(j.job_id, 0))
        out.append(f"{fit(j.job_id, 14):<14} {fit(j.user, 10):<10} {fit(j.state, 10):<10} {len(j.nodes):>5} "
                   f"{j.gpus:>4} {human_duration(run):>11} {alerts:>6}  {j.name}")
    return "\n".join(out) + "\n"
