"""The `--json` documents of `status`, `jobs`, `alerts` and `run`: query views turned into plain JSON objects.

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
(`ZERO_IS_UNSET`, checked against the .proto comments by tests/cli/test_json_view.py), the trends in
bytes carried as floats (`BYTE_TRENDS`), and the objects with a shape of their own (`_SHAPES`): the
provenance records as objects, one alert object everywhere, the job's GPU count as its header shows it.
"""
from __future__ import annotations

import base64
import json
import math
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


def shortest_float32(value: float) -> float | None:
    """The float32 `value` with the fewest significant digits that read back as the same float32."""
    if not math.isfinite(value):
        return None
    exact = struct.unpack("<f", struct.pack("<f", value))[0]
    for digits in range(6, 10):
        short = float(f"{exact:.{digits}g}")
        if struct.unpack("<f", struct.pack("<f", short))[0] == exact:
            return short
    return exact


def _scalar(field, value: Any, byte_trend: bool = False) -> Any:
    t = field.type
    if t in _INTEGERS:
        return int(value)
    if t == F.TYPE_FLOAT:
        if byte_trend:
            return round(value) if math.isfinite(value) else None
        return shortest_float32(value)
    if t == F.TYPE_DOUBLE:
        return float(value) if math.isfinite(value) else None
    if t == F.TYPE_BOOL:
        return bool(value)
    if t == F.TYPE_ENUM:
        named = field.enum_type.values_by_number.get(value)
        return named.name if named is not None else int(value)
    if t == F.TYPE_BYTES:
        return base64.b64encode(value).decode("ascii")
    if t == F.TYPE_MESSAGE:
        return message_to_json(value)
    return value  # a string


def message_to_json(message) -> dict[str, Any]:
    """Any query message as a JSON object: every field of its descriptor, typed as the module says."""
    name = message.DESCRIPTOR.name
    zero_is_unset = ZERO_IS_UNSET.get(name, frozenset())
    byte_trends = BYTE_TRENDS.get(name, frozenset())
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {k: _scalar(value_field, v) for k, v in value.items()}
        elif field.is_repeated:
            out[field.name] = [_scalar(field, v, field.name in byte_trends) for v in value]
        elif field.has_presence and not message.HasField(field.name):
            out[field.name] = None
        elif value in (0, "") and (field.name in zero_is_unset or isinstance(value, str)):
            out[field.name] = None
        else:
            out[field.name] = _scalar(field, value)
    shape = _SHAPES.get(name)
    return shape(message, out) if shape else out


# -- the objects with a shape of their own -------------------------------------------------------------


def _job_info(info, out: dict) -> dict:
    if not info.gpus and info.source in _SOURCES_WITHOUT_GPU_COUNT:
        out["gpus"] = None
    return out


def _process_view(process, out: dict) -> dict:
    if not process.samples_held:  # known from `scontrol listpids` only: no history, so no peaks
        out["rss_peak_bytes"] = out["gpu_memory_peak_bytes"] = None
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


def dumps(document: dict[str, Any], one_line: bool = False) -> str:
    """The document as JSON text (NaN never written: it is not JSON)."""
    if one_line:
        return json.dumps(document, sort_keys=True, allow_nan=False) + "\n"
    return json.dumps(document, indent=2, sort_keys=True, allow_nan=False) + "\n"
