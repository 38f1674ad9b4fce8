"""Parse ``scontrol listpids`` (text, and the ``--json`` of Slurm 24.11+) into :class:`PidEntry` rows.

Text: a header ``PID JOBID STEPID LOCALID GLOBALID`` then one row per process; STEPID is printed without
the job id (``0``, ``batch``, ``extern``) and LOCALID/GLOBALID are ``-`` for processes that are not tasks
(children that slurmstepd found in the job's container).
JSON: ``{"pids": [{"job_id", "step_id", "pid", "local_task_id", "global_task_id"}], ...}`` where the task
ids are ``{"set", "infinite", "number"}`` and unset for non-task processes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from clusterwatch.errors import ParseError

_HEADER = ["PID", "JOBID", "STEPID", "LOCALID", "GLOBALID"]


@dataclass(frozen=True)
class PidEntry:
    """One process of a job on one node, as slurmstepd reports it.

    Attributes:
        pid: the process id on that node.
        job_id: the job it belongs to.
        step_id: ``0``, ``1``..., ``batch``, ``extern``, ``interactive``.
        local_id: task rank on the node (SLURM_LOCALID), None for a non-task process.
        global_id: task rank in the step (SLURM_PROCID), None for a non-task process.
    """

    pid: int
    job_id: int
    step_id: str
    local_id: int | None
    global_id: int | None


def _short(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


def _num(value: str, what: str, line: str) -> int:
    if not value.isdigit():
        raise ParseError(f"scontrol listpids: {what} {_short(value)!r} is not a number in {_short(line)!r}")
    return int(value)


def parse_listpids_text(text: str) -> list[PidEntry]:
    """Parse the text output of ``scontrol listpids [JOB[.STEP]] [NODE]``.

    Args:
        text: standard output; an empty text (no processes) gives an empty list.

    Returns:
        The rows in the order printed, without tasks not started yet (PID ``-1``).

    Raises:
        ParseError: a missing or wrong header, or a row that is not five fields of the right kinds.
    """
    if not isinstance(text, str):
        raise ParseError(f"scontrol listpids output must be text, not {type(text).__name__}")
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    if lines[0].split() != _HEADER:
        raise ParseError(
            f"scontrol listpids: expected header 'PID JOBID STEPID LOCALID GLOBALID', "
            f"got {_short(lines[0])!r}"
        )
    entries = []
    for line in lines[1:]:
        fields = line.split()
        if len(fields) != 5:
            raise ParseError(f"scontrol listpids: row {_short(line)!r} does not have 5 fields")
        pid, job, step, local, global_ = fields
        if pid == "-1":
            # slurmstepd prints -1 for a task it has not started yet (seen on 22.05 right after srun):
            # there is no process to label.
            continue
        entries.append(
            PidEntry(
                pid=_num(pid, "PID", line),
                job_id=_num(job, "JOBID", line),
                step_id=step,
                local_id=None if local == "-" else _num(local, "LOCALID", line),
                global_id=None if global_ == "-" else _num(global_, "GLOBALID", line),
            )
        )
    return entries


def _json_int(value: Any, key: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise ParseError(f"scontrol listpids --json: {key} is a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, Mapping):
        if not value.get("set", False) or value.get("infinite", False):
            return None
        number = value.get("number")
        if isinstance(number, int) and not isinstance(number, bool):
            return number
    raise ParseError(f"scontrol listpids --json: {key} is {_short(repr(value))}, expected a number")


def parse_listpids_json(text: str | bytes) -> list[PidEntry]:
    """Parse ``scontrol --json listpids`` (Slurm 24.11 and later).

    Args:
        text: standard output.

    Returns:
        The entries of ``pids``.

    Raises:
        ParseError: not JSON, no ``pids`` list, or a row with wrong types.
    """
    try:
        doc = json.loads(text)
    except (ValueError, TypeError, RecursionError) as exc:
        raise ParseError(f"scontrol listpids --json: not JSON ({_short(str(exc))})") from None
    rows = doc.get("pids") if isinstance(doc, Mapping) else None
    if not isinstance(rows, list):
        raise ParseError("scontrol listpids --json: no 'pids' list")
    entries = []
    for row in rows:
        if not isinstance(row, Mapping):
            raise ParseError("scontrol listpids --json: a row is not an object")
        pid, job = _json_int(row.get("pid"), "pid"), _json_int(row.get("job_id"), "job_id")
        step = row.get("step_id")
        if pid is None or job is None or not isinstance(step, (str, int)) or isinstance(step, bool):
            raise ParseError(
                f"scontrol listpids --json: row {_short(repr(row))} lacks pid, job_id or step_id"
            )
        entries.append(
            PidEntry(
                pid=pid,
                job_id=job,
                step_id=str(step),
                local_id=_json_int(row.get("local_task_id"), "local_task_id"),
                global_id=_json_int(row.get("global_task_id"), "global_task_id"),
            )
        )
    return entries


def parse_listpids(text: str) -> list[PidEntry]:
    """Parse listpids output in either format, deciding by its first character."""
    if isinstance(text, str) and text.lstrip().startswith("{"):
        return parse_listpids_json(text)
    return parse_listpids_text(text)
