"""`clusterwatch agent --collector a,b`: the agent keeps one stream, so a shard list is one clear error."""
from __future__ import annotations

import pytest

from tests.helpers import cli

pytestmark = pytest.mark.e2e


def test_a_collector_list_is_refused_in_one_line(tmp_path):
    r = cli("agent", "--collector", "127.0.0.1:50051,127.0.0.1:50052", "--gpu-source", "none", "--node", "n",
            "--spool-dir", str(tmp_path / "s"), "--interval", "0.2", timeout=30)
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "streams to one collector" in lines[0], r.stderr
    assert "Traceback" not in r.stderr
