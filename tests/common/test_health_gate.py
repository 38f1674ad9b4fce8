"""The gate's verdict on a node's health file (clusterwatch/slurm/health_gate.py): refuse on evidence only."""
from __future__ import annotations

import os

import pytest

from clusterwatch.slurm.health_gate import FILE_NAME, Finding, HealthFile, check, decide

NOW = 1_000_000.0


def _needs_reset(xid: int) -> bool:
    return xid in (48, 79)


def _file(*findings: Finding, age_s: float = 1.0, read: bool = True) -> HealthFile:
    return HealthFile(written_at=NOW - age_s, valid_for_s=60.0, agent_pid=4242, findings=findings,
                      counters_read_at=NOW - 5 if read else None)


@pytest.mark.parametrize("finding", [
    Finding("gpu_lost", "GPU-a"), Finding("row_remap_pending", "GPU-a"), Finding("row_remap_failure", "GPU-a"),
    Finding("ecc_uncorrected", "GPU-a", code=3), Finding("xid", "GPU-a", code=79),
    Finding("recovery_action", "GPU-a", code=1), Finding("nvlink_down", "GPU-a"),
], ids=lambda f: f.name)
def test_what_gates_refuses_with_the_gpu_and_the_cause(finding: Finding) -> None:
    verdict = decide(_file(finding), NOW, agent_running=True, needs_reset=_needs_reset)
    assert verdict.refuse and verdict.reason.startswith("clusterwatch gate: GPU-a: ")


def test_an_nvlink_down_refuses_naming_the_gpu_and_the_link() -> None:
    health = _file(Finding("nvlink_down", "GPU-a", code=5), Finding("retired_pages_pending", "GPU-b"))
    verdict = decide(health, NOW, agent_running=True, needs_reset=_needs_reset)
    assert verdict.refuse and verdict.reason == "clusterwatch gate: GPU-a: NVLink 5 is down"


def test_an_xid_that_needs_no_reset_gates_only_where_the_site_says() -> None:
    health = _file(Finding("xid", "GPU-a", code=13), Finding("retired_pages_pending", "GPU-b"))
    assert not decide(health, NOW, agent_running=True, needs_reset=_needs_reset).refuse
    assert decide(health, NOW, agent_running=True, needs_reset=_needs_reset, also=["xid:13"]).refuse
    assert decide(health, NOW, agent_running=True, needs_reset=_needs_reset, also=["retired_pages_pending"]).refuse


@pytest.mark.parametrize("health, running, why", [
    (_file(Finding("gpu_lost", "GPU-a"), age_s=61.0), True, "stale"),
    (_file(Finding("gpu_lost", "GPU-a")), False, "not running"),
    (_file(read=False), True, "no health reading"),
], ids=["stale", "agent down", "no reading"])
def test_it_lets_the_job_run_when_it_cannot_tell_and_says_why(health: HealthFile, running: bool, why: str) -> None:
    verdict = decide(health, NOW, agent_running=running, needs_reset=_needs_reset)
    assert not verdict.refuse and why in verdict.reason


def test_a_healthy_node_runs_the_job_quietly() -> None:
    assert decide(_file(), NOW, agent_running=True, needs_reset=_needs_reset).reason == ""


def test_the_file_round_trips_and_check_reads_it(tmp_path) -> None:
    health = HealthFile(written_at=NOW, valid_for_s=60.0, agent_pid=os.getpid(),
                        findings=(Finding("xid", "GPU-a", code=48, since=NOW - 3),), counters_read_at=None)
    assert HealthFile.from_json(health.to_json()) == health
    path = tmp_path / FILE_NAME
    path.write_text(health.to_json())
    path.chmod(0o600)
    assert check(str(tmp_path), NOW + 1, needs_reset=_needs_reset).refuse


@pytest.mark.parametrize("content, mode, why", [
    (None, 0o600, "no health file"),
    ("{not json", 0o600, "malformed"),
    ('{"version": 1, "written_at": 1}', 0o600, "malformed"),
    ("x", 0o666, "only root may write"),
], ids=["missing", "garbled", "incomplete", "writable by others"])
def test_a_file_it_cannot_use_lets_the_job_run(tmp_path, content, mode: int, why: str) -> None:
    if content is not None:
        path = tmp_path / FILE_NAME
        path.write_text(content)
        path.chmod(mode)
    verdict = check(str(tmp_path), NOW, needs_reset=_needs_reset)
    assert not verdict.refuse and why in verdict.reason
