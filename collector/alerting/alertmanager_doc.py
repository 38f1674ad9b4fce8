"""An alert as Alertmanager's v2 API takes it (POST /api/v2/alerts): labels, annotations, times, a link.

Labels are what Alertmanager routes, groups, silences and inhibits on, and what tells two alerts apart. They
carry the names the site's Prometheus alerts from deploy/prometheus/alerts.yml carry (alertname, severity,
job_id, node, rank), and user, gpu and source="clusterwatch" besides, so one route or silence covers both.
Values come from outside (a node's name from its agent's hello, a user name, a GPU's UUID): control characters
become spaces and each value is bounded, a long one cut with a hash of the whole kept, so two long values stay
two alerts. Annotations (summary, description) are free text, cleaned and bounded the same way.
"""
from __future__ import annotations

import datetime
import hashlib
import re
import urllib.parse

from .alerts import Alert

SOURCE = "clusterwatch"  # the value of the `source` label on every alert clusterwatch sends
LABEL_MAX = 128  # characters of a label value
SUMMARY_MAX = 256
DESCRIPTION_MAX = 4096

_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f]+")


def clean(text: str, limit: int) -> str:
    """`text` on one line, valid UTF-8 and at most `limit` characters."""
    # a name read from /proc with surrogateescape holds lone surrogates, which UTF-8 cannot carry
    text = _UNPRINTABLE.sub(" ", text).strip().encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def label_value(text: str) -> str:
    """A label value: cleaned, and past LABEL_MAX cut with a short hash of the whole (labels identify alerts)."""
    text = clean(text, len(text) + 1)
    if len(text) <= LABEL_MAX:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return f"{text[:LABEL_MAX - 14]}…~{digest}"


def labels(a: Alert, user: str) -> dict[str, str]:
    """The alert's labels; empty ones are left out (Alertmanager reads an empty label as an absent one)."""
    rank = str(a.rank) if a.rank is not None else (f"pid{a.pid}" if a.pid >= 0 else "")  # as on /metrics
    raw = {"alertname": a.rule, "severity": a.severity, "job_id": a.job_id, "user": user, "node": a.node,
           "gpu": a.gpu, "rank": rank, "source": SOURCE}
    out = {name: label_value(value) for name, value in raw.items()}
    return {name: value for name, value in out.items() if value}


def rfc3339(t: float) -> str:
    """A Unix time as Alertmanager reads times (RFC 3339, UTC, milliseconds)."""
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="milliseconds") \
        .replace("+00:00", "Z")


def summary(a: Alert) -> str:
    parts = [f"{a.rule} ({a.severity})"]
    if a.job_id:
        parts.append(f"job {a.job_id}")
    if a.rank is not None:
        parts.append(f"rank {a.rank}")
    if a.node:
        parts.append(f"on {a.node}")
    if a.gpu:
        parts.append(f"GPU {a.gpu}")
    return clean(" ".join(parts), SUMMARY_MAX)


def document(a: Alert, alert_labels: dict[str, str], page_base: str | None, ends_at: float) -> dict:
    """The alert as one item of the POST's list.

    Args:
        a: the alert as stored.
        alert_labels: its labels (from `labels`, kept from its first firing: a resolution must carry the same).
        page_base: the web pages' base URL (http://host:port), for generatorURL; None: no link.
        ends_at: endsAt: when it resolved, or for a firing alert when Alertmanager is to take it as resolved
            if no resend comes (never before startsAt, which Alertmanager refuses).
    """
    starts_at = a.fired_at if a.fired_at is not None else a.started_at
    doc = {
        "labels": alert_labels,
        "annotations": {"summary": summary(a), "description": clean(a.description or a.rule, DESCRIPTION_MAX)},
        "startsAt": rfc3339(starts_at),
        "endsAt": rfc3339(max(ends_at, starts_at)),
    }
    if page_base:  # the job's page; a job id no page could have (hostile, too long), the list of jobs
        job_path = f"jobs/{urllib.parse.quote(a.job_id, safe='')}" if a.job_id and len(a.job_id) <= LABEL_MAX else ""
        doc["generatorURL"] = f"{page_base.rstrip('/')}/{job_path}"
    return doc
