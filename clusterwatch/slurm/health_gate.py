"""The health gate: the node's health file, written by its agent, and the prolog's verdict on it.

The agent keeps what it knows of its GPUs' fitness in ``<spool>/health.json`` (root's, 0600, replaced
whole by a rename, rewritten at least every few seconds while the agent runs). ``clusterwatch prolog
--gate`` reads it and refuses the job (exits non-zero, so slurmd drains the node and Slurm requeues the
job) when it names a finding that gates. Reading a small file keeps the prolog within its time budget:
it never starts NVML.

The gate refuses only on evidence. A missing, unreadable, malformed or stale file, or one whose agent
is no longer running, lets the job run, with one line that says why.
"""
from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

__all__ = ["FILE_NAME", "GATING_KINDS", "Finding", "HealthFile", "Verdict", "decide", "read_health_file", "check"]

FILE_NAME = "health.json"
VERSION = 1
#: Findings that gate on every site. An XID gates when the caller's catalog says it needs a reset, a
#: reboot or a drain; anything else gates only where the site names it (``gate_also``).
GATING_KINDS = frozenset({"gpu_lost", "row_remap_pending", "row_remap_failure", "ecc_uncorrected",
                          "recovery_action", "nvlink_down"})
#: Longest reason kept: slurmd logs it, and a drain reason is one line.
MAX_REASON = 200

_WHAT = {
    "gpu_lost": "lost (fell off the bus or stopped answering)",
    "row_remap_pending": "a row remap waits for a GPU reset",
    "row_remap_failure": "a row could not be remapped",
    "ecc_uncorrected": "uncorrectable ECC errors since the last reset",
    "recovery_action": "the driver asks for a recovery action",
    "nvlink_down": "an NVLink is down",
    "retired_pages_pending": "a page retirement waits for a GPU reset",
    "xid": "XID",
}


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing the agent knows is wrong: its kind, the GPU (UUID; "" for the node), a number where the
    kind has one (the XID, the ECC count, the recovery action), and when it was first seen."""

    kind: str
    gpu: str = ""
    code: int | None = None
    since: float = 0.0

    @property
    def name(self) -> str:
        """What a site writes in ``gate_also``: the kind, or ``kind:code`` (``xid:13``)."""
        return self.kind if self.code is None else f"{self.kind}:{self.code}"

    def describe(self) -> str:
        what = _WHAT.get(self.kind, self.kind)
        if self.kind == "xid":
            what = f"XID {self.code}"
        elif self.kind == "nvlink_down" and self.code is not None:
            what = f"NVLink {self.code} is down"
        elif self.code is not None and self.kind != "gpu_lost":
            what = f"{what} ({self.code})"
        return f"{self.gpu or 'node'}: {what}"


@dataclass(frozen=True, slots=True)
class HealthFile:
    """The file's content: when it was written, for how long it holds, by which agent, and the findings."""

    written_at: float
    valid_for_s: float
    agent_pid: int
    findings: tuple[Finding, ...] = ()
    counters_read_at: float | None = None   # the last health-counter reading; None: none yet

    def to_json(self) -> str:
        doc = asdict(self)
        doc["version"] = VERSION
        return json.dumps(doc, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> HealthFile:
        """Parse the file; ValueError (or TypeError, KeyError) on anything malformed."""
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("version") != VERSION:
            raise ValueError(f"not a version {VERSION} health file")
        findings = tuple(Finding(kind=str(f["kind"]), gpu=str(f.get("gpu", "")),
                                 code=None if f.get("code") is None else int(f["code"]),
                                 since=float(f.get("since", 0.0))) for f in doc.get("findings", ()))
        read_at = doc.get("counters_read_at")
        return cls(written_at=float(doc["written_at"]), valid_for_s=float(doc["valid_for_s"]),
                   agent_pid=int(doc["agent_pid"]), findings=findings,
                   counters_read_at=None if read_at is None else float(read_at))


@dataclass(frozen=True, slots=True)
class Verdict:
    """Refuse the job or let it run, and why (for the prolog's log; when refusing, the node's reason)."""

    refuse: bool
    reason: str


def gates(finding: Finding, needs_reset: Callable[[int], bool], also: Iterable[str]) -> bool:
    """Whether `finding` keeps jobs off the node: a kind that always gates, an XID that needs a reset, or a
    finding the site names (by kind or ``kind:code``)."""
    if finding.kind in GATING_KINDS:
        return True
    if finding.kind == "xid" and finding.code is not None and needs_reset(finding.code):
        return True
    also = set(also)
    return finding.kind in also or finding.name in also


def decide(health: HealthFile, now: float, *, agent_running: bool, needs_reset: Callable[[int], bool],
           also: Iterable[str] = ()) -> Verdict:
    """The verdict on a health file read at `now`; pure. Refuses only on a fresh file of a running agent."""
    age = now - health.written_at
    if age > health.valid_for_s:
        return Verdict(False, f"the health file is stale ({age:.0f} s old, good for {health.valid_for_s:.0f} s); "
                              "is the agent stuck? the job runs")
    if not agent_running:
        return Verdict(False, f"the agent that wrote the health file (pid {health.agent_pid}) is not running; "
                              "the job runs")
    bad = [f for f in health.findings if gates(f, needs_reset, also)]
    if bad:
        reason = "clusterwatch gate: " + "; ".join(f.describe() for f in bad)
        return Verdict(True, reason[:MAX_REASON])
    if health.counters_read_at is None and not health.findings:
        return Verdict(False, "the agent has no health reading yet; the job runs")
    return Verdict(False, "")


def read_health_file(spool_dir: str) -> HealthFile:
    """Read ``<spool_dir>/health.json``; OSError or ValueError (with what is wrong) when it cannot be used.

    Only a file of root's or of this user's that no one else may write counts: the gate drains nodes.
    """
    path = os.path.join(spool_dir, FILE_NAME)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
            raise ValueError(f"{path} is not a regular file of root's that only root may write")
        text = f.read(256 * 1024)
    try:
        return HealthFile.from_json(text.decode())
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"{path} is malformed ({exc.__class__.__name__}: {exc})") from None


def process_running(pid: int) -> bool:
    """Whether a process of that pid exists (a zombie counts as gone)."""
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rpartition(b")")[2].split()[:1]
    except OSError:
        return False
    return state != [b"Z"]


def check(spool_dir: str, now: float, *, needs_reset: Callable[[int], bool], also: Iterable[str] = ()) -> Verdict:
    """The gate for the node whose spool folder is `spool_dir`; never raises, lets the job run when it cannot tell."""
    try:
        health = read_health_file(spool_dir)
    except FileNotFoundError:
        return Verdict(False, f"no health file in {spool_dir} (agent not running, or without health sources); "
                              "the job runs")
    except (OSError, ValueError) as exc:
        return Verdict(False, f"cannot use the health file: {getattr(exc, 'strerror', None) or exc}; the job runs")
    return decide(health, now, agent_running=process_running(health.agent_pid), needs_reset=needs_reset, also=also)
