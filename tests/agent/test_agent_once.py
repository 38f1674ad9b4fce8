"""`clusterwatch agent --once` without --json, on a node with no job process: it says what it saw."""
from __future__ import annotations

import pytest

from tests.support.helpers import cli

pytestmark = pytest.mark.e2e


def test_agent_once_without_json_says_what_one_poll_saw(tmp_path):
    r = cli("agent", "--once", "--gpu-source", "none", "--node", "once-node", "--spool-dir", str(tmp_path / "s"),
            timeout=60)
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("one poll of once-node (GPU source none): ") and "0 GPU(s)" in first
