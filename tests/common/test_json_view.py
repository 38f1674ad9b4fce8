"""The --json conversion (clusterwatch/json_view.py) against its schema (docs/json/clusterwatch.schema.json),
the query messages and docs/json.md: a field added to query.proto, the schema or the docs alone fails here."""
from __future__ import annotations

import json
import math
import re

import jsonschema
import pytest
from clusterwatch.v1 import actions_pb2, agent_pb2, query_pb2
from google.protobuf.descriptor import FieldDescriptor as F

from clusterwatch import json_view
from tests.support.helpers import ROOT

SCHEMA = json.loads((ROOT / "docs" / "json" / "clusterwatch.schema.json").read_text())
DOC = (ROOT / "docs" / "json.md").read_text()

# the schema's object for each query message the documents hold
OBJECT_OF = {
    "JobInfo": "job", "NodeView": "node", "ProcessView": "process", "GpuView": "gpu", "AlertView": "alert",
    "HealthView": "health", "JobView": "status_document", "ListJobsResponse": "jobs_document",
    "ListAlertsResponse": "alerts_document", "ListHealthResponse": "health_document", "GpuHealthRow": "gpu_health",
    "XidCount": "xid_count", "TrainAnswerView": "train_answer", "GpuActivity": "gpu_activity",
    "NodeHealthRow": "node_health", "FabricPortView": "fabric_port", "ActionView": "action",
    "OffenderView": "offender",
}

PROVENANCE = {  # a record as the agent sends it (Provenance.to_dict) and the collector stores it, node added
    "version": 1, "time": 1796000000.5, "path": "/home/u/proj", "source": "script", "pid": 4242,
    "start_time": 1795999990.25, "uid": 1000, "code_id": "0123456789abcdef",
    "git": {"root": "/home/u/proj", "commit": "a" * 40, "branch": "main", "dirty": True, "untracked": 2,
            "diff_sha256": "b" * 64, "remote_url": "https://example.org/u/proj.git",
            "submodules": [{"path": "third_party/x", "commit": "c" * 40, "recorded": "c" * 40,
                            "dirty": "unknown", "diff_sha256": ""}],
            "ran_as_uid": 1000, "error": ""},
    "cmdline": ["python", "train.py"], "executable": "/usr/bin/python3.11", "env": {"SLURM_JOB_ID": "9001"},
    "error": "", "node": "gpu01",
}
UNKNOWN_GIT = {"root": "unknown", "commit": "unknown", "branch": "unknown", "dirty": "unknown",
               "untracked": "unknown", "diff_sha256": "unknown", "remote_url": "unknown", "submodules": [],
               "ran_as_uid": None, "error": "not inside a git repository"}


def validator(name: str) -> jsonschema.Draft202012Validator:
    """A validator of one of the schema's objects (its $refs resolved in the whole file)."""
    return jsonschema.Draft202012Validator({"$ref": f"#/$defs/{name}", "$defs": SCHEMA["$defs"]})


def errors(document: dict, name: str) -> list[str]:
    return [f"{e.json_path}: {e.message}" for e in validator(name).iter_errors(document)]


def _value(field, enum_values: list | None):
    """A set, non-zero value for one scalar field, valid where the schema enumerates values."""
    if field.type == F.TYPE_STRING:
        return enum_values[0] if enum_values else f"{field.name}-x"
    if field.type == F.TYPE_BOOL:
        return True
    if field.type in (F.TYPE_FLOAT, F.TYPE_DOUBLE):
        return 45.3
    if field.type == F.TYPE_ENUM:
        return field.enum_type.values[-1].number
    return 7


def filled(message, depth: int = 0):
    """`message` with every field set (two of each repeated one), as a collector that knows everything sends."""
    props = SCHEMA["$defs"].get(OBJECT_OF.get(message.DESCRIPTOR.name, ""), {}).get("properties", {})
    for field in message.DESCRIPTOR.fields:
        enum_values = props.get(field.name, {}).get("enum")
        if field.name == "provenance_json":
            message.provenance_json = json.dumps([PROVENANCE, dict(PROVENANCE, pid=4243, git=UNKNOWN_GIT)])
        elif field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            getattr(message, field.name)["k"] = _value(value_field, None)
        elif field.type == F.TYPE_MESSAGE:
            if field.is_repeated:
                for _ in range(2):
                    filled(getattr(message, field.name).add(), depth + 1)
            else:
                filled(getattr(message, field.name), depth + 1)
        elif field.is_repeated:
            getattr(message, field.name).extend([_value(field, enum_values)] * 2)
        else:
            setattr(message, field.name, _value(field, enum_values))
    return message


@pytest.mark.parametrize("message", sorted(OBJECT_OF))
def test_every_field_of_a_query_message_is_in_the_schema_and_the_schema_has_no_other(message):
    # GpuActivity: agent.proto's; ActionView, OffenderView: actions.proto's
    cls = getattr(query_pb2, message, None) or getattr(agent_pb2, message, None) or getattr(actions_pb2, message)
    props = SCHEMA["$defs"][OBJECT_OF[message]]["properties"]
    document = json_view.message_to_json(cls())
    if message in ("JobView", "ListJobsResponse", "ListAlertsResponse", "ListHealthResponse"):
        document["schema"] = ""
    if message == "AlertView":  # the alert object carries its job's id, in status as in alerts
        document["job_id"] = None
    assert sorted(document) == sorted(props), (
        f"{message} and $defs/{OBJECT_OF[message]} of docs/json/clusterwatch.schema.json differ: add the field "
        "to the schema and to docs/json.md (its unit, what null means)")


def test_alert_entry_is_the_alert_object_with_its_job():
    entry = query_pb2.AlertEntry(job_id="9001", alert=filled(query_pb2.AlertView()))
    alert = json_view.message_to_json(entry)
    assert alert["job_id"] == "9001" and alert["rule"] == "rule-x"
    assert errors(alert, "alert") == []
    node_wide = json_view.message_to_json(query_pb2.AlertEntry(alert=query_pb2.AlertView(
        rule="agent_down", state="firing", severity="critical", node="n1", since=1796000000.0, description="d")))
    assert node_wide["job_id"] is None and node_wide["pid"] is None and node_wide["gpu"] is None
    assert errors(node_wide, "alert") == []


def test_a_view_with_every_field_set_is_valid_and_typed():
    view = filled(query_pb2.JobView())
    doc = json_view.status_document(view)
    assert errors(doc, "status_document") == []
    assert list(jsonschema.Draft202012Validator(SCHEMA).iter_errors(doc)) == []  # the file's own dispatch
    p = doc["processes"][0]
    assert p["step"] == 7 and type(p["step"]) is int and type(p["rss_bytes"]) is int
    assert p["cpu_percent"] == 45.3  # float32: the shortest digits, not 45.29999923706055
    assert p["rss_trend"] == [45, 45] and all(type(v) is int for v in p["rss_trend"])
    assert doc["gpus"][0]["utilization_trend"] == [45.3, 45.3]
    assert doc["tags"] == {"k": "value-x"}
    [dirty, unknown] = doc["provenance"]
    assert dirty["git"]["dirty"] is True and dirty["git"]["error"] is None and dirty["error"] is None
    assert dirty["git"]["submodules"][0]["dirty"] is None and dirty["git"]["submodules"][0]["diff_sha256"] == ""
    assert unknown["git"]["dirty"] is None and unknown["git"]["untracked"] is None
    assert unknown["git"]["commit"] is None and unknown["code_id"] == "0123456789abcdef"
    assert all(a["job_id"] == "job_id-x" for a in doc["alerts"])
    assert doc["job"]["gpus"] == 7  # Slurm's count where it gave one
    # `"step": "265"` was MessageToDict's int64; json_view's text holds numbers as numbers
    assert '"step": 7' in json_view.dumps(doc)


def test_unset_means_null_not_zero():
    view = query_pb2.JobView(job=query_pb2.JobInfo(job_id="local-1", source="local", state="RUNNING",
                                                   start_time=1796000000.0), now=1796000010.0)
    view.processes.add(node="n", pid=12, mapped_by="listpids", alive=True)  # a listpids-only process
    view.gpus.add(uuid="GPU-1")  # allocated, never reported
    view.nodes.add(node="n")
    view.alerts.add(rule="training_stall", state="pending", severity="critical", node="n", pid=12,
                    since=1796000005.0, description="d")
    doc = json_view.status_document(view)
    assert errors(doc, "status_document") == []
    job = doc["job"]
    assert (job["end_time"], job["submit_time"], job["exit_code"], job["cpus"], job["account"]) == (None,) * 5
    p = doc["processes"][0]
    assert (p["start_time"], p["last_seen"], p["rank"], p["step"], p["rss_peak_bytes"], p["command"]) == (None,) * 6
    g = doc["gpus"][0]
    assert (g["node"], g["index"], g["memory_total_bytes"], g["memory_peak_bytes"]) == (None,) * 4
    assert doc["nodes"][0]["last_seen"] is None
    a = doc["alerts"][0]
    assert (a["fired_at"], a["resolved_at"], a["gpu"], a["rank"]) == (None,) * 4 and a["pid"] == 12
    assert doc["provenance"] == []


def test_the_job_counts_the_gpus_as_the_reports_header_does():
    view = query_pb2.JobView(job=query_pb2.JobInfo(job_id="local-1", source="local"))
    assert json_view.status_document(view)["job"]["gpus"] is None  # a run job without GPUs: not known
    view.gpus.add(uuid="GPU-1", node="n")
    view.gpus.add(uuid="GPU-2", node="n")
    assert json_view.status_document(view)["job"]["gpus"] == 2
    slurm = query_pb2.JobInfo(job_id="9", source="slurm")
    assert json_view.message_to_json(slurm)["gpus"] == 0  # Slurm allocated none
    assert json_view.message_to_json(query_pb2.JobInfo(job_id="9", source="local"))["gpus"] is None


def test_unreadable_provenance_is_null_and_nan_is_never_written():
    view = query_pb2.JobView(job=query_pb2.JobInfo(job_id="1"), provenance_json="{not json")
    view.processes.add(node="n", pid=1, loss=math.nan, cpu_percent=math.inf)
    doc = json_view.status_document(view)
    assert doc["provenance"] is None
    assert doc["processes"][0]["loss"] is None and doc["processes"][0]["cpu_percent"] is None
    json.loads(json_view.dumps(doc))  # allow_nan=False: it raises rather than write NaN


@pytest.mark.parametrize("value", [0.1, 45.3, 99.99, 1e-7, 3.4028234663852886e38, 123456.789, 2.5])
def test_shortest_float32_reads_back_as_the_same_float32(value):
    stored = query_pb2.GpuView(utilization=value).utilization  # what the wire holds
    short = json_view.shortest_float32(stored)
    assert query_pb2.GpuView(utilization=short).utilization == stored
    assert len(repr(short)) <= len(repr(stored))


def _commented_zero_fields() -> dict[str, set[str]]:
    """Fields of query.proto whose comment says 0 means unknown, unset or not yet (`0 if …`, `0 while …`)."""
    found: dict[str, set[str]] = {}
    message = None
    for line in (ROOT / "proto" / "clusterwatch" / "v1" / "query.proto").read_text().splitlines():
        if m := re.match(r"\s*message (\w+)", line):
            message = m.group(1)
        m = re.match(r"\s*(?:optional\s+)?\w+ (\w+) = \d+;\s*//(.*)", line)
        if m and message and re.search(r"\b0 (if|while)\b", m.group(2)):
            found.setdefault(message, set()).add(m.group(1))
    return found


def test_every_field_whose_proto_comment_says_0_is_unset_is_null_at_0():
    commented = {k: v for k, v in _commented_zero_fields().items() if k in OBJECT_OF}
    assert commented, "the .proto comments were not read"
    for message, fields in commented.items():
        missing = fields - json_view.ZERO_IS_UNSET.get(message, frozenset())
        assert not missing, f"{message}: {sorted(missing)} say 0 is unset in query.proto: list them in ZERO_IS_UNSET"


def test_documents_carry_their_schema_version():
    assert json_view.jobs_document(query_pb2.ListJobsResponse())["schema"] == "clusterwatch.jobs/1"
    assert json_view.alerts_document(query_pb2.ListAlertsResponse())["schema"] == "clusterwatch.alerts/1"
    assert json_view.status_document(query_pb2.JobView())["schema"] == "clusterwatch.status/1"
    jobs = query_pb2.ListJobsResponse()
    filled(jobs)
    assert errors(json_view.jobs_document(jobs), "jobs_document") == []
    alerts = filled(query_pb2.ListAlertsResponse())
    assert errors(json_view.alerts_document(alerts), "alerts_document") == []


# -- docs/json.md and the schema -------------------------------------------------------------------------


def type_text(d: dict) -> str:
    """A schema property's type as docs/json.md writes it: `integer or null`, array of `alert`, …"""
    if "$ref" in d:
        return f"`{d['$ref'].rsplit('/', 1)[1]}`"
    if "anyOf" in d:
        return " or ".join(type_text(x) for x in d["anyOf"])
    kind = d["type"]
    if isinstance(kind, list):
        return " or ".join(type_text({**d, "type": k}) for k in kind)
    if kind == "array":
        return f"array of {type_text(d['items'])}"
    if kind == "object" and isinstance(d.get("additionalProperties"), dict):
        return f"object of {type_text(d['additionalProperties'])}"
    return kind


def expected_table(definition: dict) -> list[str]:
    """The table docs/json.md has for one of the schema's objects: one row a field, as the schema says it."""
    rows = ["| field | type | meaning, unit; null when |", "|---|---|---|"]
    for name, prop in definition["properties"].items():
        rows.append(f"| `{name}` | {type_text(prop)} | {prop['description']} |")
    return rows


def doc_table(name: str) -> list[str]:
    """The table under docs/json.md's heading "### `name`"."""
    _, heading, rest = DOC.partition(f"\n### `{name}`\n")
    assert heading, f"docs/json.md has no section ### `{name}`"
    lines = rest.split("\n### ")[0].split("\n## ")[0].splitlines()
    return [line for line in lines if line.startswith("|")]


@pytest.mark.parametrize("name", sorted(SCHEMA["$defs"]))
def test_docs_json_md_documents_every_field_as_the_schema_does(name):
    expected = expected_table(SCHEMA["$defs"][name])
    assert doc_table(name) == expected, "docs/json.md's table differs from the schema; it should read:\n" + (
        "\n".join(expected))


def test_the_schema_is_a_valid_draft_2020_12_schema_and_strict():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    for name, definition in SCHEMA["$defs"].items():
        assert definition["additionalProperties"] is False, name
        assert definition["required"] == list(definition["properties"]), name  # every field, null or not


def test_the_text_escapes_what_could_act_on_a_terminal_and_reads_back():
    doc = json_view.status_document(filled(query_pb2.JobView()))
    doc["job"]["name"] = "run\u202eexe\x1b[2J\u0085 é 😀"  # a bidi override, ESC, a C1 control, non-ASCII
    text = json_view.dumps(doc)
    assert text.isascii() and "\x1b" not in text and json.loads(text) == doc
    assert text == json.dumps(doc, indent=2, sort_keys=True) + "\n"  # what json.dumps wrote before
    line = json_view.dumps(doc, one_line=True)
    assert line.count("\n") == 1 and json.loads(line) == doc
