"""deploy/prometheus/alerts.yml is valid and its promtool unit tests pass (run for real)."""
import re
import shutil
import subprocess

import pytest

from tests.support.helpers import ROOT

DIR = ROOT / "deploy" / "prometheus"


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: install Debian's `prometheus` package (apt-get install -y prometheus)")
    return path


def test_rules_check():
    p = subprocess.run([_promtool(), "check", "rules", str(DIR / "alerts.yml")], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "14 rules found" in p.stdout


def test_rules_unit_tests():
    p = subprocess.run([_promtool(), "test", "rules", "alerts_test.yml"], cwd=DIR, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS" in p.stdout + p.stderr


def test_every_rule_name_present():
    text = (DIR / "alerts.yml").read_text()
    for name in ("gpu_memory_leak", "host_memory_leak", "gpu_stall", "training_stall", "idle_gpu",
                 "agent_down", "handle_leak", "gpu_xid", "gpu_lost", "gpu_memory_errors", "gpu_throttle",
                 "gpu_link_errors"):
        assert f"alert: {name}" in text
    assert "job=" not in text.replace("job_id", "")


def test_the_critical_xids_are_the_catalogs() -> None:
    # gpu_xid's two rules split the XIDs as the shipped catalog does; XID 79 is gpu_lost's alone
    from clusterwatch.collector.health.decisions import LOST_XIDS
    from clusterwatch.collector.health.xid_catalog import load_catalog

    catalog = load_catalog()
    critical = {x for x, e in catalog.entries.items() if e.severity == "critical"} - LOST_XIDS
    text = (DIR / "alerts.yml").read_text()
    lists = set(re.findall(r'xid(=~|!~)"([0-9|]+)"', text))
    assert {op for op, _ in lists} == {"=~", "!~"}
    for op, alternatives in lists:
        got = {int(x) for x in alternatives.split("|")}
        assert got == (critical if op == "=~" else critical | LOST_XIDS), (op, sorted(got))
