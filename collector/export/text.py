"""The exposition text of a snapshot, written by hand for speed: Prometheus text 0.0.4 or OpenMetrics 1.0.0.

The two formats differ only in the `# HELP`/`# TYPE` lines and the final `# EOF`. Each label set's `{...}`
string is kept from one scrape to the next (labels rarely change) and rebuilt only for label sets the last
scrape did not have; label sets no longer present are dropped at every scrape. The text is
prometheus_client's `generate_latest` of the same families, line for line, but for one intended difference:
integer values are written as integers (`3221225472`, not `3.221225472e+09`), the same number to any parser
(tests/collector/test_exporter.py and bench/bench_metrics.py check both).
"""
from __future__ import annotations

from prometheus_client.utils import floatToGoString

from .families import GPU_FAMILIES, GPU_LABELS, PROCESS_FAMILIES, PROCESS_LABELS, RANK_FAMILIES, RANK_LABELS, Family
from .series import ExtraFamilies, Row, activity_series, job_series, other_series
from .snapshot import GpuRow, ProcessRow, RankRow, Snapshot


def format_value(v) -> str:
    """A sample value: an int as its digits (`3221225472`, where prometheus_client writes `3.221225472e+09`:
    the same number to a parser, and 8 times cheaper to write), anything else as prometheus_client writes it
    (Go's float formatting: `0.25`, `1.7e+09`, `+Inf`, `NaN`)."""
    cls = v.__class__
    if cls is int:
        return str(v)
    if cls is float and -1e16 < v < 1e6:
        return repr(v)
    return floatToGoString(v)


def same_exposition(ours: bytes, theirs: bytes) -> bool:
    """True when two exposition texts say the same thing line for line: comments and series (name and
    labels) byte for byte, values as numbers (for checking ours against prometheus_client's)."""
    a, b = ours.decode().split("\n"), theirs.decode().split("\n")
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x == y:
            continue
        if x.startswith("#") or y.startswith("#"):
            return False
        xs, _, xv = x.rpartition(" ")
        ys, _, yv = y.rpartition(" ")
        if xs != ys or float(xv) != float(yv):
            return False
    return True


def escape_label_value(v: str) -> str:
    """A label value as the text formats quote it: backslash, newline and double quote escaped."""
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def label_string(names: tuple[str, ...], values) -> str:
    """`{a="x",b="y"} ` with the names sorted (as prometheus_client writes them) and a trailing space."""
    if not names:
        return " "
    pairs = sorted(zip(names, values, strict=True))
    return "{" + ",".join(f'{n}="{escape_label_value(str(v))}"' for n, v in pairs) + "} "


def _headers(fam: Family, openmetrics: bool) -> str:
    if openmetrics:
        help_text = escape_label_value(fam.help)
        return f"# HELP {fam.name} {help_text}\n# TYPE {fam.name} {fam.type}\n"
    name = fam.sample_name
    help_text = fam.help.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {help_text}\n# TYPE {name} {'gauge' if fam.type == 'info' else fam.type}\n"


class TextWriter:
    """The text of one render, and its label strings: the last scrape's read (`old`), this one's kept (`new`).

    Label strings are cached by kind (job, rank, process, gpu, other, and the `extra` families' own) and
    key; a key this scrape does not write is not carried over, so an ended job's strings go with its series.
    """

    __slots__ = ("old", "new", "parts", "openmetrics", "names")

    def __init__(self, old: dict[str, dict], openmetrics: bool, names: set[str] | None) -> None:
        self.old, self.new = old, {}
        self.parts: list[str] = []
        self.openmetrics, self.names = openmetrics, names

    def caches(self, kind: str) -> tuple[dict, dict]:
        """(the last scrape's label strings of `kind`, this scrape's to fill)."""
        return self.old.get(kind, {}), self.new.setdefault(kind, {})

    def emit(self, fam: Family, lines: list[str]) -> None:
        """A family's headers and sample lines, unless the render's name filter leaves it out."""
        if self.names is not None and (fam.sample_name not in self.names or not lines):
            return
        self.parts.append(_headers(fam, self.openmetrics))
        self.parts.extend(lines)

    def generic(self, fam: Family, rows: list[Row], kind: str) -> None:
        """A family from `series()` rows: (label names, label values, value)."""
        cache, used = self.caches(kind)
        sname, fmt = fam.sample_name, format_value
        lines = []
        for label_names, values, value in rows:
            key = (label_names, values)
            lbl = cache.get(key)
            if lbl is None:
                lbl = label_string(label_names, values)
            used[key] = lbl
            lines.append(f"{sname}{lbl}{fmt(value)}\n")
        self.emit(fam, lines)


def render(snap: Snapshot, cache: dict[str, dict], openmetrics: bool = False, names: set[str] | None = None,
           extra: ExtraFamilies | None = None) -> tuple[bytes, dict[str, dict]]:
    """The exposition text of a snapshot, and the label strings to pass as `cache` to the next render.

    Args:
        snap: the snapshot.
        cache: the label strings the last render returned ({} the first time).
        openmetrics: OpenMetrics 1.0.0 rather than Prometheus text 0.0.4.
        names: only these families (by sample name, as prometheus_client's `name[]` parameter); families
            with no series are then left out.
        extra: more families (collector.py's `extra`): their text after every family of the state's.
    """
    out = TextWriter(cache, openmetrics, names)
    for fam, rows in job_series(snap.jobs):
        out.generic(fam, rows, "job")
    _write_ranks(out, snap.ranks)
    if snap.processes is not None:
        _write_processes(out, snap.processes)
    _write_gpus(out, snap.gpus)
    for fam, rows in activity_series(snap.gpus):
        out.generic(fam, rows, "gpu_activity")
    for fam, rows in other_series(snap):
        out.generic(fam, rows, "other")
    if snap.extra is not None and extra is not None:
        extra.write(snap.extra, out)
    if openmetrics:
        out.parts.append("# EOF\n")
    return "".join(out.parts).encode("utf-8"), out.new


def _write_ranks(out: TextWriter, ranks: list[RankRow]) -> None:
    """The ten rank families: one label string per rank, the loop written out (most of a scrape's time)."""
    cache, used = out.caches("rank")
    get, fmt = cache.get, format_value
    lines_by_family: list[list[str]] = [[] for _ in RANK_FAMILIES]
    a0, a1, a2, a3, a4, a5, a6, a7, a8, a9 = (lines.append for lines in lines_by_family)
    p0, p1, p2, p3, p4, p5, p6, p7, p8, p9 = (fam.sample_name for fam in RANK_FAMILIES)
    for key, v0, v1, v2, v3, v4, v5, v6, v7, v8, v9 in ranks:
        lbl = get(key)
        if lbl is None:
            lbl = label_string(RANK_LABELS, key)
        used[key] = lbl
        if v0 is not None:
            a0(f"{p0}{lbl}{fmt(v0)}\n")
        if v1 is not None:
            a1(f"{p1}{lbl}{fmt(v1)}\n")
        if v2 is not None:
            a2(f"{p2}{lbl}{fmt(v2)}\n")
        if v3 is not None:
            a3(f"{p3}{lbl}{fmt(v3)}\n")
        if v4 is not None:
            a4(f"{p4}{lbl}{fmt(v4)}\n")
        if v5 is not None:
            a5(f"{p5}{lbl}{fmt(v5)}\n")
        if v6 is not None:
            a6(f"{p6}{lbl}{fmt(v6)}\n")
        if v7 is not None:
            a7(f"{p7}{lbl}{fmt(v7)}\n")
        if v8 is not None:
            a8(f"{p8}{lbl}{fmt(v8)}\n")
        if v9 is not None:
            a9(f"{p9}{lbl}{fmt(v9)}\n")
    for fam, lines in zip(RANK_FAMILIES, lines_by_family, strict=True):
        out.emit(fam, lines)


def _write_processes(out: TextWriter, processes: list[ProcessRow]) -> None:
    """The per-process families (label `pid`), when asked for."""
    cache, used = out.caches("process")
    fmt = format_value
    lines_by_family: list[list[str]] = [[] for _ in PROCESS_FAMILIES]
    prefixes = [fam.sample_name for fam in PROCESS_FAMILIES]
    for key, *values in processes:
        lbl = cache.get(key)
        if lbl is None:
            lbl = label_string(PROCESS_LABELS, key)
        used[key] = lbl
        for lines, prefix, value in zip(lines_by_family, prefixes, values, strict=True):
            if value is not None:
                lines.append(f"{prefix}{lbl}{fmt(value)}\n")
    for fam, lines in zip(PROCESS_FAMILIES, lines_by_family, strict=True):
        out.emit(fam, lines)


def _write_gpus(out: TextWriter, gpus: list[GpuRow]) -> None:
    """The GPU families: the four-label string (with job_id) and the three-label one, cached together."""
    cache, used = out.caches("gpu")
    fmt = format_value
    util_l, used_l, total_l, power_l = [], [], [], []
    p_util, p_used, p_total, p_power = (fam.sample_name for fam in GPU_FAMILIES)
    short_labels = GPU_FAMILIES[2].labels
    for node, uuid, idx, job_id, util, mem_used, total, power, _activity in gpus:
        key = (node, uuid, idx, job_id)
        pair = cache.get(key)
        if pair is None:
            pair = (label_string(GPU_LABELS, key), label_string(short_labels, key[:3]))
        used[key] = pair
        if util is not None:
            util_l.append(f"{p_util}{pair[0]}{fmt(util)}\n")
        if mem_used is not None:
            used_l.append(f"{p_used}{pair[0]}{fmt(mem_used)}\n")
        if total:
            total_l.append(f"{p_total}{pair[1]}{fmt(total)}\n")
        if power is not None:
            power_l.append(f"{p_power}{pair[1]}{fmt(power)}\n")
    for fam, lines in zip(GPU_FAMILIES, (util_l, used_l, total_l, power_l), strict=True):
        out.emit(fam, lines)
