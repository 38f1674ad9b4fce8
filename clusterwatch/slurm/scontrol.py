"""Parse ``scontrol show job -d`` (text and ``--json``) into :class:`JobRecord`.

Text format (every Slurm version): records separated by blank lines, each a run of ``Key=Value`` tokens;
``-d`` adds one line per node group, ``Nodes=<hostlist> CPU_IDs=<ids> Mem=<MB> GRES=<detail>``
(``GRES_IDX=`` in 19.05 and before). Some values hold spaces (``JobName=``, ``Command=``, ``WorkDir=``,
``StdOut=``...): Slurm prints those last on their line or on a line of their own, which is how we read
them. ``scontrol -o`` puts a whole record on one line; there a value runs until the next ``Key=``.
Values are printed raw, newlines included: see "What Slurm guarantees" below for how records and their
owners are read so that no value can make or change another job's record.

JSON (``scontrol --json``, Slurm 23.02+): ``{"jobs": [...]}``. ``job_state`` is a string in data_parser
v0.0.39 and a list of flags from v0.0.40; numbers that may be unset are ``{"set", "infinite", "number"}``
(plain integers before v0.0.39).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from typing import Any

from clusterwatch.errors import ParseError
from clusterwatch.slurm import hostlist

_MIB = 1024 * 1024


@dataclass(frozen=True)
class JobRecord:
    """One Slurm job as ``scontrol show job -d`` describes it.

    Attributes:
        job_id: numeric job id.
        name: job name.
        user: user name (None when Slurm does not know it).
        uid: numeric user id.
        account: account charged, None when unset (``(null)``).
        partition: partition name.
        state: the job state as squeue shows it: the base state (``RUNNING``, ``PENDING``, ``COMPLETED``, …),
            or ``COMPLETING`` while the job completes.
        submit_time: Unix seconds, None when unknown.
        start_time: Unix seconds, None when unknown (a pending job's expected start counts as known).
        end_time: Unix seconds, None when unknown (for a running job with a limit, its expected end).
        time_limit_s: time limit in seconds, None for UNLIMITED.
        nodes: allocated nodes, expanded, in Slurm's order; empty while pending.
        cpus: allocated (or requested, while pending) CPUs.
        memory_bytes: allocated memory over all nodes, None when Slurm does not say.
        gpus_by_node: node name → GPU indexes on that node (Slurm's per-node indexes, for display).
        gpu_count_by_node: node name → number of GPUs, also when Slurm gives a count without indexes.
        num_tasks: number of tasks, None when not set.
        exit_code: the job's exit status (``ExitCode=3:0`` → 3), None when unknown.
        exit_signal: the signal that ended it (``0:9`` → 9), None when unknown.
        sluid: Slurm 26's job SLUID (also the cgroup folder name), None before 26.05.
        work_dir: working directory.
        command: the batch script or command, None when unset.
        reason: the pending or end reason (``None`` in Slurm's text is kept as the string "None").
        batch_host: the node running the batch step, None for srun/salloc allocations before it starts.
        qos: the job's QOS, None when unset.
        cluster: the cluster's name, None where the output does not say (the text form never does).
    """

    job_id: int
    name: str
    user: str | None
    uid: int | None
    account: str | None
    partition: str | None
    state: str
    submit_time: int | None
    start_time: int | None
    end_time: int | None
    time_limit_s: int | None
    nodes: tuple[str, ...]
    cpus: int | None
    memory_bytes: int | None
    gpus_by_node: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    gpu_count_by_node: Mapping[str, int] = field(default_factory=dict)
    num_tasks: int | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    sluid: str | None = None
    work_dir: str | None = None
    command: str | None = None
    reason: str | None = None
    batch_host: str | None = None
    qos: str | None = None
    cluster: str | None = None


# ---------------------------------------------------------------------------------------------- helpers


def _short(text: str) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= 60 else text[:57] + "..."


_NULLS = {"", "(null)", "N/A", "None", "Unknown", "n/a"}


def _opt(value: str | None) -> str | None:
    return None if value is None or value in _NULLS else value


def _int(value: str | None, key: str) -> int | None:
    if value is None or value in _NULLS:
        return None
    try:
        return int(value)
    except ValueError:
        raise ParseError(f"scontrol: {key}={_short(value)!r} is not a whole number") from None


def _time(value: str | None, key: str, tz: tzinfo | None) -> int | None:
    """``2026-11-29T18:36:46`` in local time (or ``tz``) → Unix seconds."""
    if value is None or value in _NULLS:
        return None
    try:
        moment = datetime.strptime(value, "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        raise ParseError(
            f"scontrol: {key}={_short(value)!r} is not a time like 2026-11-29T18:36:46"
        ) from None
    # A naive datetime's timestamp() uses the machine's local timezone, which is what scontrol printed in.
    return int(moment.replace(tzinfo=tz).timestamp()) if tz is not None else int(moment.timestamp())


_DURATION = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_duration(value: str) -> int | None:
    """Parse a Slurm time limit (``UNLIMITED``, ``1-00:00:00``, ``10:00``, ``30``) into seconds.

    Args:
        value: the text after ``TimeLimit=``.

    Returns:
        Seconds, or None for ``UNLIMITED``/``INFINITE``/``Partition_Limit``/``N/A``.

    Raises:
        ParseError: anything else.
    """
    if value in ("UNLIMITED", "INFINITE", "Partition_Limit", "NOT_SET") or value in _NULLS:
        return None
    match = _DURATION.match(value)
    if match is None:
        raise ParseError(f"scontrol: time limit {_short(value)!r} is not [D-]HH:MM:SS")
    days, a, b, c = match.groups()
    if days is not None:
        # D-HH, D-HH:MM, D-HH:MM:SS
        hours, minutes, seconds = int(a), int(b or 0), int(c or 0)
        return int(days) * 86400 + hours * 3600 + minutes * 60 + seconds
    if c is not None:
        return int(a) * 3600 + int(b) * 60 + int(c)
    if b is not None:
        return int(a) * 60 + int(b)  # MM:SS
    return int(a) * 60  # minutes


_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([KMGTP]?)$")
_SIZE_MB = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024**2, "P": 1024**3}


def _size_bytes(value: str, key: str) -> int:
    """Slurm memory sizes are MB unless suffixed (``100M``, ``4G``, ``1.50G``)."""
    match = _SIZE.match(value)
    if match is None:
        raise ParseError(f"scontrol: {key}={_short(value)!r} is not a memory size like 4000M")
    return int(float(match.group(1)) * _SIZE_MB[match.group(2)] * _MIB)


def _split_outside_parens(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p]


def _index_ranges(text: str) -> tuple[int, ...]:
    """``0-1,3`` → (0, 1, 3)."""
    indexes: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ParseError(f"scontrol: GRES index list {_short(text)!r} is not like 0-1,3")
        lo_n, hi_n = int(lo), int(hi) if hi else int(lo)
        if hi_n < lo_n or hi_n - lo_n > 65536:
            raise ParseError(f"scontrol: GRES index range {part!r} is out of order or too long")
        indexes.extend(range(lo_n, hi_n + 1))
    return tuple(indexes)


_GRES_ITEM = re.compile(r"^(?P<head>[^()]*)(?:\((?P<kind>IDX|CNT):(?P<body>.*)\))?$")


def parse_gres_detail(text: str) -> tuple[tuple[int, ...], int]:
    """Parse a node's ``GRES=`` detail into its GPU indexes and GPU count.

    Understands ``gpu:2(IDX:0-1)``, ``gpu:a100:1(IDX:3)``, ``gpu(IDX:0-1)`` (19.05, no count),
    ``gpu(CNT:2)`` (count, no indexes), several items joined by commas (``gpu:1(IDX:0),shard:2(...)``)
    and an empty detail (ended jobs). Non-GPU GRES (``shard``, ``mps``, ``nic``...) are skipped.

    Args:
        text: the value after ``GRES=``.

    Returns:
        (indexes, count): count is the number of GPUs even when no indexes are given.

    Raises:
        ParseError: a GPU item that is not in one of the forms above.
    """
    indexes: list[int] = []
    count = 0
    for item in _split_outside_parens(text.strip()):
        match = _GRES_ITEM.match(item)
        if match is None:
            raise ParseError(f"scontrol: GRES item {_short(item)!r} is not like gpu:2(IDX:0-1)")
        head = match.group("head").split(":")
        if head[0] != "gpu":
            continue
        kind, body = match.group("kind"), match.group("body")
        item_indexes: tuple[int, ...] = ()
        if kind == "IDX" and body not in ("N/A", ""):
            item_indexes = _index_ranges(body)
        item_count = len(item_indexes)
        if kind == "CNT":
            item_count = _int(body, "GRES CNT") or 0
        elif len(head) > 1 and head[-1].isdigit():
            item_count = int(head[-1])
        indexes.extend(item_indexes)
        count += item_count
    return tuple(indexes), count


# ------------------------------------------------------------------------------------------- text format
#
# What Slurm guarantees, and what it does not (slurm_sprint_job_info in src/api/job_info.c, 19.05-26.05):
#
# * A record begins with ``JobId=<digits> `` at the start of a line, then optionally
#   ``ArrayJobId=<n> ArrayTaskId=<range> [ArrayTaskThrottle=<n> ]`` or ``HetJobId=<n> HetJobOffset=<n> ``,
#   then ``JobName=<name>``: all of it written by Slurm, the name last on that first line.
# * Every further line of a record is ``line_end`` ("\n" plus three spaces) and Slurm's own ``Key=`` (node
#   groups: five spaces and ``Nodes=``); a record ends with ``\n   \n\n``. The line after the name is
#   ``UserId=<user>(<uid>) GroupId=<group>(<gid>) MCS_label=<label>`` (after ``HetJobIdSet=`` for a
#   heterogeneous job and ``SLUID=`` from 26.05); state, nodes, CPUs and the GRES detail follow, and only
#   then the free texts (Command, WorkDir, Comment, StdOut...).
# * Values are printed raw. Slurm accepts newlines and carriage returns in job names, comments and paths,
#   so a value can hold lines that look like Slurm's own, a blank line, and a whole made-up record.
#
# So the text alone cannot always say where a name ends: a job of user A whose comment forges the lines of
# a record prints the same bytes as a job of user B whose name forges A's lines. What is safe:
#
# 1. Lines are split at "\n" only (str.splitlines() would also split at \r, \x1c, \u2028...).
# 2. Within one record, the name runs from ``JobName=`` to the UserId line; everything below it is Slurm's
#    lines, one ``Key=`` each. Reading from the record's end upwards, the first UserId line met is the real
#    one as long as no value *below* the name holds a newline: a name cannot reach below it. A record
#    whose lower part holds a line that is not Slurm's (a newline in a path or comment) does not parse and
#    is skipped; a key seen twice there (a forged line) also.
# 3. Where records begin is not certain either: a name can hold ``\n   \n\nJobId=<other> ...``. The caller
#    gives the owners Slurm reported through a channel no value reaches (``squeue -o "%A %U %u"``: numbers
#    and login names, one job a line). A record start whose JobId is unknown to that list or appears twice
#    is not trusted: that block is dropped, the block before it (whose end may be a forgery inside its own
#    text) is not trusted either, and both job ids are returned for a query of their own
#    (``scontrol show job -d <id>``), whose record begins at the first byte and ends at the last, so that
#    a forged boundary inside it has nothing to cut. A record whose UserId differs from the owners list is
#    handled the same way, and never returned with a user other than the list's.
#
# The one-line form (``scontrol -o``) is read for the fixtures of old versions; the mapper never asks for it.

_KEY = r"[A-Za-z][A-Za-z0-9_/:]*"
_TOKEN_START = re.compile(rf"(?:^|(?<=\s))({_KEY})=")
# The first line of every record, as Slurm writes it: nothing in it before JobName= comes from a user.
_RECORD_START = re.compile(
    r"^JobId=(?P<id>\d+) "
    r"(?:ArrayJobId=\d+ ArrayTaskId=\S+ (?:ArrayTaskThrottle=\d+ )?|HetJobId=\d+ HetJobOffset=\d+ )?"
    r"JobName="
)
_USER_LINE = re.compile(
    r"^   UserId=(?P<user>[^\s()]*)\((?P<uid>\d+)\) GroupId=[^\s()]*\(\d+\) MCS_label=\S*$"
)
# Lines Slurm prints between the name and the UserId line (heterogeneous jobs; Slurm 26's SLUID).
_BEFORE_USER_LINE = re.compile(r"^   (?:HetJobIdSet|SLUID)=\S*$")
# One of Slurm's own lines below the name: three spaces and a key, or a node group's five and Nodes=.
_SLURM_LINE = re.compile(rf"^   (?:{_KEY}=|  Nodes=)")
# With -o the UserId field follows the name on the same line; the real one is the last such run before the
# fields that follow it (a forged copy inside the name comes before).
_ONE_LINE_USER = re.compile(
    r" UserId=(?P<user>[^\s()]*)\((?P<uid>\d+)\) GroupId=[^\s()]*\(\d+\) MCS_label=\S* Priority=\d+ "
)
# Keys whose values may hold spaces; Slurm prints each last on its line (or alone on it).
_REST_OF_LINE = {
    "JobName",
    "Command",
    "WorkDir",
    "StdErr",
    "StdIn",
    "StdOut",
    "Comment",
    "AdminComment",
    "SystemComment",
    "Reservation",
    "Container",
    "ContainerID",
    "Features",
    "Prefer",
}
_NODE_GROUP_KEYS = {"CPU_IDs", "Mem", "GRES", "GRES_IDX"}


def _tokens_of_line(line: str, multiline: bool) -> list[tuple[str, str]]:
    """Split one line into (key, value) pairs; a value runs to the next `` Key=`` or the line's end.

    In multi-line output the free-text keys (``Command=``, ``WorkDir=``...) are last on their line, so
    their value is the whole rest of the line even when it holds `` x=y`` (a command's arguments). With
    ``-o`` everything is on one line and the next ``Key=`` is the only boundary there is.
    """
    starts = list(_TOKEN_START.finditer(line))
    if not starts or starts[0].start() != 0:
        raise ParseError(f"scontrol: line {_short(line)!r} does not start with Key=")
    pairs: list[tuple[str, str]] = []
    for i, match in enumerate(starts):
        key = match.group(1)
        if multiline and key in _REST_OF_LINE:
            pairs.append((key, line[match.end() :].rstrip()))
            break
        end = starts[i + 1].start() if i + 1 < len(starts) else len(line)
        pairs.append((key, line[match.end() : end].rstrip()))
    return pairs


@dataclass(frozen=True)
class _Head:
    """What a record says of itself before its other fields: id, name, owner (as printed)."""

    job_id: int
    name: str
    user: str | None
    uid: int


def _split_one_line(line: str) -> tuple[_Head, list[tuple[str, str]]]:
    start = _RECORD_START.match(line)
    assert start is not None
    users = list(_ONE_LINE_USER.finditer(line, start.end()))
    if not users:
        raise ParseError(f"scontrol: job {start.group('id')} has no UserId=name(uid) after its name")
    user = users[-1]
    head = _Head(int(start.group("id")), line[start.end() : user.start()],
                 _opt(user.group("user")), int(user.group("uid")))
    pairs = _tokens_of_line(line[user.start() + 1 :].rstrip(), multiline=False)
    return head, pairs


def _split_lines(lines: list[str]) -> tuple[_Head, list[tuple[str, str]]]:
    """A multi-line record → its head and the (key, value) pairs of Slurm's lines below the name."""
    start = _RECORD_START.match(lines[0])
    assert start is not None
    end = len(lines)
    while end > 1 and not lines[end - 1].strip():
        end -= 1  # the record's closing "   " and blank lines
    # Upwards from the end: Slurm's own lines, until the first UserId line (see the argument above).
    user_at = None
    for i in range(end - 1, 0, -1):
        if _USER_LINE.match(lines[i]):
            user_at = i
            break
        if not _SLURM_LINE.match(lines[i]):
            raise ParseError(
                f"scontrol: job {start.group('id')}: line {_short(lines[i])!r} is not one of Slurm's"
            )
    if user_at is None:
        raise ParseError(f"scontrol: job {start.group('id')} has no UserId=name(uid) line")
    first = user_at
    # A HetJobIdSet= line is Slurm's only for a heterogeneous job (its first line says HetJobId=); a name
    # ending in one is read as the name. (Slurm 26's SLUID= line cannot be told apart that way.)
    while first > 1 and _BEFORE_USER_LINE.match(lines[first - 1]) and (
        "HetJobId=" in lines[0][: start.end()] or not lines[first - 1].startswith("   HetJobIdSet=")
    ):
        first -= 1
    user = _USER_LINE.match(lines[user_at])
    assert user is not None
    name = "\n".join([lines[0][start.end() :], *lines[1:first]])
    head = _Head(int(start.group("id")), name, _opt(user.group("user")), int(user.group("uid")))
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    for line in [*lines[first:user_at], *lines[user_at + 1 : end]]:
        for key, value in _tokens_of_line(line.strip(), multiline=True):
            if key in seen and key not in _NODE_GROUP_KEYS and key != "Nodes":
                raise ParseError(f"scontrol: job {head.job_id} prints {key}= twice")
            seen.add(key)
            pairs.append((key, value))
    return head, pairs


def _record(head: _Head, pairs: list[tuple[str, str]], tz: tzinfo | None) -> JobRecord:
    fields: dict[str, str] = {}
    groups: list[dict[str, str]] = []
    current: dict[str, str] | None = None
    for key, value in pairs:
        if key == "Nodes":
            current = {"Nodes": value}
            groups.append(current)
        elif current is not None and key in _NODE_GROUP_KEYS:
            current[key] = value
        else:
            current = None
            fields.setdefault(key, value)
    job_id = head.job_id

    nodes = tuple(hostlist.expand(fields.get("NodeList", "") if _opt(fields.get("NodeList")) else ""))

    gpus_by_node: dict[str, tuple[int, ...]] = {}
    gpu_count_by_node: dict[str, int] = {}
    detail_mem = 0
    for group in groups:
        group_nodes = hostlist.expand(group["Nodes"])
        gres = group.get("GRES", group.get("GRES_IDX", ""))
        # 19.05 and before printed GRES_IDX=gpu(IDX:0-1) with the same shape.
        indexes, count = parse_gres_detail(gres)
        mem_mb = _int(group.get("Mem"), "Mem") or 0
        detail_mem += mem_mb * len(group_nodes)
        for node in group_nodes:
            if count:
                gpus_by_node[node] = indexes
                gpu_count_by_node[node] = count

    memory_bytes: int | None = detail_mem * _MIB if detail_mem else None
    if memory_bytes is None:
        for part in fields.get("TRES", "").split(","):
            if part.startswith("mem="):
                memory_bytes = _size_bytes(part[4:], "TRES mem")
    if memory_bytes is None:
        per_node = fields.get("MinMemoryNode")
        if per_node and per_node != "0" and nodes:
            memory_bytes = _size_bytes(per_node, "MinMemoryNode") * len(nodes)

    exit_code = exit_signal = None
    if _opt(fields.get("ExitCode")):
        code, _, sig = fields["ExitCode"].partition(":")
        exit_code, exit_signal = _int(code, "ExitCode"), _int(sig or None, "ExitCode")

    state = fields.get("JobState", "")
    if not state:
        raise ParseError(f"scontrol: job {job_id} has no JobState=")

    return JobRecord(
        job_id=job_id,
        name=head.name,
        user=head.user,
        uid=head.uid,
        account=_opt(fields.get("Account")),
        partition=_opt(fields.get("Partition")),
        state=state,
        submit_time=_time(fields.get("SubmitTime"), "SubmitTime", tz),
        start_time=_time(fields.get("StartTime"), "StartTime", tz),
        end_time=_time(fields.get("EndTime"), "EndTime", tz),
        time_limit_s=parse_duration(fields.get("TimeLimit", "UNLIMITED")),
        nodes=nodes,
        cpus=_int(fields.get("NumCPUs"), "NumCPUs"),
        memory_bytes=memory_bytes,
        gpus_by_node=gpus_by_node,
        gpu_count_by_node=gpu_count_by_node,
        num_tasks=_int(fields.get("NumTasks"), "NumTasks"),
        exit_code=exit_code,
        exit_signal=exit_signal,
        sluid=_opt(fields.get("SLUID")),
        work_dir=_opt(fields.get("WorkDir")),
        command=_opt(fields.get("Command")),
        reason=fields.get("Reason"),
        batch_host=_opt(fields.get("BatchHost")),
        qos=_opt(fields.get("QOS")),
    )


def _parse_block(lines: list[str], tz: tzinfo | None) -> JobRecord:
    """One record's lines (the first is its JobId= line) → the record; ParseError when it does not read."""
    try:
        if len([line for line in lines if line.strip()]) == 1:
            head, pairs = _split_one_line(lines[0])
        else:
            head, pairs = _split_lines(lines)
        return _record(head, pairs, tz)
    except ParseError:
        raise
    except (ValueError, OverflowError, OSError) as exc:
        # Out-of-range dates or numbers: still a malformed text, reported as one.
        raise ParseError(f"scontrol: cannot read job record ({_short(str(exc))})") from None


#: A job's owner as Slurm reports it apart from the record text: (uid, user name).
Owner = tuple[int, str | None]


@dataclass(frozen=True)
class TextListing:
    """What :func:`read_show_job_text` made of a listing.

    Attributes:
        records: the records read safely, in the order printed.
        skipped: records left out (not readable, not trusted, or of a job the owners list does not know).
        recheck: job ids whose record could not be told apart from a forgery in this listing; a query of
            their own (``scontrol show job -d <id>``, read with :func:`read_one_job_text`) settles them.
        errors: one line for each record left out, for a log line (not for the log on every pass).
    """

    records: list[JobRecord]
    skipped: int
    recheck: tuple[int, ...]
    errors: tuple[str, ...] = ()


def _lines(text: str) -> list[str]:
    if not isinstance(text, str):
        raise ParseError(f"scontrol output must be text, not {type(text).__name__}")
    # "\n" only: Slurm ends its lines with it; \r and the other characters splitlines() breaks at are values.
    return text.split("\n")


def _owned(record: JobRecord, owners: Mapping[int, Owner] | None) -> bool:
    if owners is None:
        return True
    owner = owners.get(record.job_id)
    return owner is not None and owner[0] == record.uid and (owner[1] is None or owner[1] == record.user)


def read_show_job_text(
    text: str, tz: tzinfo | None = None, owners: Mapping[int, Owner] | None = None
) -> TextListing:
    """Read ``scontrol show job -d`` text (all jobs, multi-line or ``-o``) without trusting any value.

    Args:
        text: scontrol's standard output.
        tz: the timezone scontrol printed times in; None means this machine's local timezone.
        owners: job id → (uid, user name) as Slurm reported them through a channel no value reaches
            (``squeue -h -a -t all -o "%A %U %u"``, asked before scontrol). With it, a record start is
            trusted only for a job on that list that appears once, and a record's owner must match.
            Without it, boundaries forged inside a value cannot all be told from real ones.

    Returns:
        The records read, how many were skipped, and the job ids to ask for one by one.

    Raises:
        ParseError: the text is not scontrol job output at all (no record in it).
    """
    lines = _lines(text)
    if text.strip() in ("", "No jobs in the system"):
        return TextListing([], 0, ())
    starts = [i for i, line in enumerate(lines) if _RECORD_START.match(line)]
    if not starts:
        raise ParseError(f"scontrol: no JobId= record in {_short(text.strip())!r}")
    ids = [int(_RECORD_START.match(lines[i]).group("id")) for i in starts]  # type: ignore[union-attr]
    seen: dict[int, int] = {}
    for job_id in ids:
        seen[job_id] = seen.get(job_id, 0) + 1
    doubtful = [seen[j] > 1 or (owners is not None and j not in owners) for j in ids]
    records: list[JobRecord] = []
    recheck: dict[int, None] = {}
    errors: list[str] = []
    skipped = 1 if any(line.strip() for line in lines[: starts[0]]) else 0
    if skipped:
        errors.append(f"scontrol: text before the first JobId= ({_short(lines[0])!r})")
    bounds = [*starts, len(lines)]
    for k, job_id in enumerate(ids):
        known = owners is None or job_id in owners
        if doubtful[k] or (k + 1 < len(ids) and doubtful[k + 1]):
            # This start, or the end of this block (the next start), may be a forgery inside a value.
            if known:
                recheck[job_id] = None
            else:
                skipped += 1
                errors.append(f"scontrol: job {job_id} is not on squeue's list (forged, or newer)")
            continue
        try:
            record = _parse_block(lines[bounds[k] : bounds[k + 1]], tz)
        except ParseError as exc:
            recheck[job_id] = None  # asked alone, a forged boundary has nothing to cut
            errors.append(str(exc))
            continue
        if not _owned(record, owners):
            recheck[job_id] = None
            continue
        records.append(record)
    # A job asked for again is not also returned from here (two records of one job, one of them doubtful).
    records = [r for r in records if r.job_id not in recheck]
    return TextListing(records, skipped, tuple(recheck), tuple(errors))


def read_one_job_text(
    text: str, job_id: int, tz: tzinfo | None = None, owner: Owner | None = None
) -> JobRecord | None:
    """Read the output of ``scontrol show job -d JOB`` for that one job.

    The record begins at the first byte and ends at the last, so any ``JobId=`` line below the first
    is a value's (see the argument above the text format's code).

    Args:
        text: scontrol's standard output.
        job_id: the job asked for.
        tz: see :func:`read_show_job_text`.
        owner: (uid, user name) from squeue; the record must agree.

    Returns:
        The record, or None when the output is not that job's.

    Raises:
        ParseError: the record does not read, or its owner disagrees with ``owner``.
    """
    lines = _lines(text)
    start = _RECORD_START.match(lines[0])
    if start is None or int(start.group("id")) != job_id:
        return None
    record = _parse_block(lines, tz)
    if owner is not None and not _owned(record, {job_id: owner}):
        raise ParseError(f"scontrol: job {job_id}: its UserId= line is not the owner squeue reports")
    return record


def parse_show_job_text(
    text: str, tz: tzinfo | None = None, owners: Mapping[int, Owner] | None = None
) -> list[JobRecord]:
    """Parse the text of ``scontrol show job -d``: the records :func:`read_show_job_text` reads safely.

    Args:
        text: scontrol's standard output.
        tz: the timezone scontrol printed times in; None means this machine's local timezone.
        owners: see :func:`read_show_job_text`.

    Returns:
        One record per job read, in the order printed; ``No jobs in the system`` gives an empty list.

    Raises:
        ParseError: the text is not scontrol job output.
    """
    return read_show_job_text(text, tz, owners).records


# ------------------------------------------------------------------------------------------- JSON format


def _no_val(value: Any, key: str) -> int | None:
    """A v0.0.39+ ``{"set", "infinite", "number"}`` (or a plain number before) → int or None."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ParseError(f"scontrol --json: {key} is a boolean, expected a number")
    if isinstance(value, (int, float)):
        return int(value)
    if isinstance(value, Mapping):
        if not value.get("set", False) or value.get("infinite", False):
            return None
        number = value.get("number")
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            raise ParseError(f"scontrol --json: {key}.number is {number!r}, expected a number")
        return int(number)
    raise ParseError(f"scontrol --json: {key} is {type(value).__name__}, expected a number")


def _str(job: Mapping[str, Any], key: str) -> str | None:
    value = job.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ParseError(f"scontrol --json: {key} is {type(value).__name__}, expected text")
    return value or None


def _json_state(value: Any) -> str:
    # v0.0.39: "RUNNING"; v0.0.40+: ["CANCELLED", "COMPLETING"], the base state first, then its flags. As the
    # text output and squeue do, a completing job reads COMPLETING: its exit code is not final until then.
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return "COMPLETING" if "COMPLETING" in value[1:] else value[0]
    raise ParseError(f"scontrol --json: job_state {_short(repr(value))} is neither a state nor a list")


def _json_exit(value: Any) -> tuple[int | None, int | None]:
    if value is None:
        return None, None
    if isinstance(value, Mapping) and "return_code" in value:  # v0.0.40+
        signal = value.get("signal")
        sig = signal.get("id") if isinstance(signal, Mapping) else None
        return _no_val(value.get("return_code"), "exit_code.return_code"), _no_val(sig, "exit_code.signal.id")
    raw = _no_val(value, "exit_code")  # v0.0.39: the raw wait status
    if raw is None:
        return None, None
    return (raw >> 8) & 0xFF, raw & 0x7F


def _json_record(job: Any, tz_unused: tzinfo | None) -> JobRecord:
    if not isinstance(job, Mapping):
        raise ParseError("scontrol --json: a job is not an object")
    job_id = _no_val(job.get("job_id"), "job_id")
    if job_id is None:
        raise ParseError("scontrol --json: a job has no job_id")
    node_expr = _str(job, "nodes") or ""
    nodes = tuple(hostlist.expand(node_expr))

    gpus_by_node: dict[str, tuple[int, ...]] = {}
    gpu_count_by_node: dict[str, int] = {}
    details = job.get("gres_detail") or []
    if not isinstance(details, list) or not all(isinstance(d, str) for d in details):
        raise ParseError("scontrol --json: gres_detail is not a list of strings")
    # gres_detail has one entry per allocated node, in the order of the expanded node list.
    for node, detail in zip(nodes, details, strict=False):
        indexes, count = parse_gres_detail(detail)
        if count:
            gpus_by_node[node] = indexes
            gpu_count_by_node[node] = count

    memory_mb = None
    per_node = _no_val(job.get("memory_per_node"), "memory_per_node")
    per_cpu = _no_val(job.get("memory_per_cpu"), "memory_per_cpu")
    cpus = _no_val(job.get("cpus"), "cpus")
    if per_node and nodes:
        memory_mb = per_node * len(nodes)
    elif per_cpu and cpus:
        memory_mb = per_cpu * cpus
    exit_code, exit_signal = _json_exit(job.get("exit_code"))
    limit_min = _no_val(job.get("time_limit"), "time_limit")

    def when(key: str) -> int | None:
        value = _no_val(job.get(key), key)
        # Slurm reports "not yet" as 0.
        return value if value else None

    return JobRecord(
        job_id=job_id,
        name=_str(job, "name") or "",
        user=_str(job, "user_name"),
        uid=_no_val(job.get("user_id"), "user_id"),
        account=_str(job, "account"),
        partition=_str(job, "partition"),
        state=_json_state(job.get("job_state")),
        submit_time=when("submit_time"),
        start_time=when("start_time"),
        end_time=when("end_time"),
        time_limit_s=limit_min * 60 if limit_min is not None else None,
        nodes=nodes,
        cpus=cpus,
        memory_bytes=memory_mb * _MIB if memory_mb else None,
        gpus_by_node=gpus_by_node,
        gpu_count_by_node=gpu_count_by_node,
        num_tasks=_no_val(job.get("tasks"), "tasks"),
        exit_code=exit_code,
        exit_signal=exit_signal,
        sluid=_str(job, "sluid"),
        work_dir=_str(job, "current_working_directory"),
        command=_str(job, "command"),
        reason=_str(job, "state_reason"),
        batch_host=_str(job, "batch_host"),
        qos=_str(job, "qos"),
        cluster=_str(job, "cluster"),
    )


def parse_show_job_json(text: str | bytes) -> list[JobRecord]:
    """Parse ``scontrol --json show job -d`` (data_parser v0.0.39 to v0.0.45) or ``squeue --json`` (22.05).

    Args:
        text: scontrol's standard output.

    Returns:
        One record per job in ``jobs``.

    Raises:
        ParseError: not JSON, no ``jobs`` list, or a job whose fields have the wrong types. Errors that
            scontrol put in ``errors`` are reported in the message.
    """
    try:
        doc = json.loads(text)
    except (ValueError, TypeError, RecursionError) as exc:
        raise ParseError(f"scontrol --json: not JSON ({_short(str(exc))})") from None
    if not isinstance(doc, Mapping):
        raise ParseError("scontrol --json: the document is not an object")
    if not doc:
        return []  # squeue --json of Slurm 22.05 with no job at all prints {}
    jobs = doc.get("jobs")
    if not isinstance(jobs, list):
        errors = doc.get("errors") or []
        said = "; ".join(
            str(e.get("description") or e.get("error")) for e in errors if isinstance(e, Mapping)
        )
        raise ParseError(f"scontrol --json: no jobs list{': ' + _short(said) if said else ''}")
    try:
        return [_json_record(job, None) for job in jobs]
    except (ValueError, OverflowError) as exc:
        if isinstance(exc, ParseError):
            raise
        raise ParseError(f"scontrol --json: cannot read a job ({_short(str(exc))})") from None


def parse_show_job(text: str, tz: tzinfo | None = None) -> list[JobRecord]:
    """Parse ``scontrol show job -d`` output in either format, deciding by its first character.

    Args:
        text: scontrol's standard output (text or JSON).
        tz: for the text format, the timezone its times are in (None: local).

    Returns:
        One record per job.

    Raises:
        ParseError: the text is neither format.
    """
    if isinstance(text, str) and text.lstrip().startswith("{"):
        return parse_show_job_json(text)
    return parse_show_job_text(text, tz)
