"""The `--json` documents of `status`, `jobs`, `alerts`, `run`, `health` and `diagnose`, and the other JSON
clusterwatch writes for scripts (`agent --once --json`, the job summaries): protobuf messages as plain JSON.

One place decides how a view looks to a script (docs/json.md; the schema: docs/json/clusterwatch.schema.json).
Most fields are mapped by their protobuf type, so a field added to query.proto appears with the right JSON
type without code here:

- integers (int32, uint64, …) are JSON integers, never strings; a float32 is written with the fewest
  digits that read back as the same float32 (45.3, not 45.29999923706055); a double as it is; a
  non-finite number is null;
- a field with presence (`optional`, a sub-message) that is not set is null;
- a string is never empty: "" (proto3 cannot tell it from unset) is null;
- a repeated field is a list, a map an object.

What the type cannot say is listed here: the numbers whose 0 means "unknown" or "not yet"
(`ZERO_IS_UNSET`, checked against the .proto comments by tests/common/test_json_view.py), the trends in
bytes carried as floats (`BYTE_TRENDS`), and the objects with a shape of their own (`_SHAPES`): the
provenance records as objects, one alert object everywhere, the job's GPU count as its header shows it.
"""
from __future__ import annotations

import base64
import functools
import json
import math
import re
import struct
from collections.abc import Callable
from typing import Any

from google.protobuf.descriptor import FieldDescriptor as F

STATUS_SCHEMA = "clusterwatch.status/1"
JOBS_SCHEMA = "clusterwatch.jobs/1"
ALERTS_SCHEMA = "clusterwatch.alerts/1"

# Numbers whose 0 means unknown, unset or "not yet": null. Times are Unix seconds, so 0 is never a real one.
ZERO_IS_UNSET: dict[str, frozenset[str]] = {
    # cpus: every job has one at least, 0 is Slurm not saying
    "JobInfo": frozenset({"submit_time", "start_time", "end_time", "time_limit_s", "memory_bytes",
                          "ranks_expected", "cpus"}),
    # a process only `scontrol listpids` names has no sample: no start time, never seen
    "ProcessView": frozenset({"start_time", "last_seen", "first_seen"}),
    "GpuView": frozenset({"memory_total_bytes"}),
    # pid 0: a node-wide alert (agent_down) names no process
    "AlertView": frozenset({"pid", "fired_at", "resolved_at"}),
    "NodeView": frozenset({"last_seen", "memory_total_bytes"}),
}

# Byte counts the view carries as float32 trends: whole bytes in JSON.
BYTE_TRENDS: dict[str, frozenset[str]] = {
    "ProcessView": frozenset({"gpu_memory_trend", "rss_trend"}),
}

# Where a job's GPU count is not known when Slurm and the prolog did not give it (0 is "none" otherwise).
_SOURCES_WITHOUT_GPU_COUNT = frozenset({"agent", "local"})

_INTEGERS = frozenset({F.TYPE_INT32, F.TYPE_INT64, F.TYPE_UINT32, F.TYPE_UINT64, F.TYPE_SINT32, F.TYPE_SINT64,
                       F.TYPE_FIXED32, F.TYPE_FIXED64, F.TYPE_SFIXED32, F.TYPE_SFIXED64})


_FLOAT32 = struct.Struct("<f")


@functools.lru_cache(maxsize=4096)  # trends repeat their values (resampling, flat lines)
def shortest_float32(value: float) -> float | None:
    """The float32 `value` with the fewest significant digits that read back as the same float32."""
    if not math.isfinite(value):
        return None
    exact = _FLOAT32.unpack(_FLOAT32.pack(value))[0]
    for fmt in ("%.6g", "%.7g", "%.8g"):
        short = float(fmt % exact)
        if _FLOAT32.unpack(_FLOAT32.pack(short))[0] == exact:
            return short
    return exact  # 9 digits always read back


def _whole(value: float) -> int | None:
    return round(value) if math.isfinite(value) else None


def _double(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _converter(field, byte_trend: bool = False) -> Callable[[Any], Any]:
    """What turns one value of `field` into JSON, chosen once per field."""
    t = field.type
    if t in _INTEGERS:
        return int
    if t == F.TYPE_FLOAT:
        return _whole if byte_trend else shortest_float32
    if t == F.TYPE_DOUBLE:
        return _double
    if t == F.TYPE_BOOL:
        return bool
    if t == F.TYPE_ENUM:
        names = {v.number: v.name for v in field.enum_type.values}
        return lambda v: names.get(v, int(v))
    if t == F.TYPE_BYTES:
        return lambda v: base64.b64encode(v).decode("ascii")
    if t == F.TYPE_MESSAGE:
        return message_to_json
    return str


_MAP, _REPEATED, _PRESENCE, _SINGULAR = range(4)


@functools.lru_cache(maxsize=None)
def _plan(descriptor) -> tuple[tuple[str, int, bool, Callable[[Any], Any]], ...]:
    """Per field of a message type: its name, how it is held, whether 0 or "" is null, its converter."""
    zero_is_unset = ZERO_IS_UNSET.get(descriptor.name, frozenset())
    byte_trends = BYTE_TRENDS.get(descriptor.name, frozenset())
    plan = []
    for field in descriptor.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            plan.append((field.name, _MAP, False, _converter(field.message_type.fields_by_name["value"])))
        elif field.is_repeated:
            plan.append((field.name, _REPEATED, False, _converter(field, field.name in byte_trends)))
        elif field.has_presence:
            plan.append((field.name, _PRESENCE, False, _converter(field)))
        else:
            unset_at_zero = field.name in zero_is_unset or field.type == F.TYPE_STRING
            plan.append((field.name, _SINGULAR, unset_at_zero, _converter(field)))
    return tuple(plan)


def message_to_json(message) -> dict[str, Any]:
    """Any query message as a JSON object: every field of its descriptor, typed as the module says."""
    out: dict[str, Any] = {}
    for name, held, unset_at_zero, convert in _plan(message.DESCRIPTOR):
        value = getattr(message, name)
        if held == _REPEATED:
            out[name] = [convert(v) for v in value]
        elif held == _MAP:
            out[name] = {k: convert(v) for k, v in value.items()}
        elif held == _PRESENCE:
            out[name] = convert(value) if message.HasField(name) else None
        elif unset_at_zero and not value:
            out[name] = None
        else:
            out[name] = convert(value)
    shape = _SHAPES.get(message.DESCRIPTOR.name)
    return shape(message, out) if shape else out


# -- the objects with a shape of their own -------------------------------------------------------------


def job_gpus(info) -> int | None:
    """A job's GPU count, None where nobody gave one and none of its processes was seen on a GPU (`jobs` writes
    "-"): 0 is "none" only where Slurm or the prolog said so."""
    return None if not info.gpus and info.source in _SOURCES_WITHOUT_GPU_COUNT else info.gpus


def _job_info(info, out: dict) -> dict:
    out["gpus"] = job_gpus(info)
    return out


def _process_view(process, out: dict) -> dict:
    if not process.samples_held:  # known from `scontrol listpids` only: no history, so no peaks
        out["rss_peak_bytes"] = out["gpu_memory_peak_bytes"] = None
    # a peak of 0 beside a figure never read (no GPU memory: a CPU process) is no reading either
    for figure, peak in (("rss_bytes", "rss_peak_bytes"), ("gpu_memory_bytes", "gpu_memory_peak_bytes")):
        if out[figure] is None and not out[peak]:
            out[peak] = None
    return out


def _gpu_view(gpu, out: dict) -> dict:
    if not gpu.node:  # allocated, but no agent has reported it: its index and peak are not known
        out["index"] = out["memory_peak_bytes"] = None
    return out


def _alert_entry(entry, out: dict) -> dict:
    """`alerts`' entry (job id + alert) as the one alert object: the alert's fields and its job_id."""
    alert = out.pop("alert") or {}
    return {"job_id": out.pop("job_id"), **alert, **out}


def _job_view(view, out: dict) -> dict:
    raw = out.pop("provenance_json")
    out["provenance"] = provenance_records(raw) if raw else []
    job_id = view.job.job_id or None
    out["alerts"] = [{"job_id": job_id, **a} for a in out["alerts"]]
    job = out["job"]
    if job is not None and not job["gpus"] and view.gpus:  # as the report's header counts them
        job["gpus"] = len(view.gpus)
    if view.job.end_time:  # whether an agent reports says nothing of a job that ended (the report: "ended")
        for node in out["nodes"]:
            node["agent_up"] = None
    return out


_SHAPES: dict[str, Callable[[Any, dict], dict]] = {
    "JobInfo": _job_info,
    "ProcessView": _process_view,
    "GpuView": _gpu_view,
    "AlertEntry": _alert_entry,
    "JobView": _job_view,
}


# -- provenance records (the agent's JSON, version 1) -----------------------------------------------------

_UNKNOWN = "unknown"


def _known(value: Any) -> Any:
    return None if value == _UNKNOWN else value


def _git_state(git: Any) -> Any:
    if not isinstance(git, dict):
        return git
    out = {k: _known(v) for k, v in git.items()}
    out["error"] = git.get("error") or None
    if isinstance(git.get("submodules"), list):
        out["submodules"] = [{k: _known(v) for k, v in s.items()} if isinstance(s, dict) else s
                             for s in git["submodules"]]
    return out


def provenance_record(record: Any) -> Any:
    """One provenance record with null, not "unknown", where git could not say (`dirty` true, false or null)."""
    if not isinstance(record, dict):
        return record
    out = dict(record)
    out["code_id"] = _known(record.get("code_id"))
    out["git"] = _git_state(record.get("git"))
    out["error"] = record.get("error") or None
    out["executable"] = record.get("executable") or None
    out["start_time"] = record.get("start_time") or None  # 0.0 for a directory
    return out


def provenance_records(raw: str) -> list | None:
    """The view's provenance_json as a list of objects; null when it is not a JSON list (unreadable)."""
    try:
        records = json.loads(raw)
    except ValueError:
        return None
    return [provenance_record(r) for r in records] if isinstance(records, list) else None


# -- the documents ---------------------------------------------------------------------------------------


def status_document(view) -> dict[str, Any]:
    """`status --json` and `run --json`: the job's view (schema: $defs/status_document)."""
    return {"schema": STATUS_SCHEMA, **message_to_json(view)}


def jobs_document(response) -> dict[str, Any]:
    """`jobs --json`: the job list and the alerts firing per job (schema: $defs/jobs_document)."""
    return {"schema": JOBS_SCHEMA, **message_to_json(response)}


def alerts_document(response) -> dict[str, Any]:
    """`alerts --json`: the alerts, each the same object as in status (schema: $defs/alerts_document)."""
    return {"schema": ALERTS_SCHEMA, **message_to_json(response)}


_NON_ASCII = re.compile("[^\x00-\x7f]")


def dumps(document: dict[str, Any], one_line: bool = False) -> str:
    """The document as JSON text, keys sorted, indented unless `one_line`.

    orjson writes it (a 512-process job's document in a twentieth of the stdlib's indented time); every
    character past ASCII is then written as its \\u escape, as json.dumps does by default, so that a bidi
    mark or a C1 control in a job name cannot act on the terminal that shows the document. A non-finite
    number is null (never NaN, which is not JSON).
    """
    import orjson

    option = orjson.OPT_SORT_KEYS | (0 if one_line else orjson.OPT_INDENT_2)
    text = orjson.dumps(document, option=option).decode()
    return _NON_ASCII.sub(lambda m: json.dumps(m.group())[1:-1], text) + "\n"
