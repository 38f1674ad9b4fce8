"""deploy/prometheus/alerts.yml is valid and its promtool unit tests pass (run for real)."""
import shutil
import subprocess

import pytest

from tests.helpers import ROOT

DIR = ROOT / "deploy" / "prometheus"


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: install Debian's `prometheus` package (apt-get install -y prometheus)")
    return path


def test_rules_check():
    p = subprocess.run([_promtool(), "check", "rules", str(DIR / "alerts.yml")], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "7 rules found" in p.stdout


def test_rules_unit_tests():
    p = subprocess.run([_promtool(), "test", "rules", "alerts_test.yml"], cwd=DIR, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS" in p.stdout + p.stderr


def test_every_rule_name_present():
    text = (DIR / "alerts.yml").read_text()
    for name in ("gpu_memory_leak", "host_memory_leak", "gpu_stall", "training_stall", "idle_gpu",
                 "agent_down", "handle_leak"):
        assert f"alert: {name}" in text
    assert "job=" not in text.replace("job_id", "")
