"""bench/load.py --collectors 3 --quick: the same load against one collector and three shards, nothing dropped,
every shard ingesting, the total the shards' sum, nodes whose own collector is another keeping two streams."""
from __future__ import annotations

import subprocess
import sys
import uuid

from tests.support.helpers import ROOT, clean_environ, left_behind


def test_load_against_three_shards_drops_nothing_and_adds_up():
    marker = uuid.uuid4().hex
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "load.py"), "--quick", "--collectors", "3"],
                         capture_output=True, text=True, timeout=240, env={**clean_environ(), "CW_BENCH_SMOKE": marker},
                         cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert left_behind("CW_BENCH_SMOKE", marker) == []
    lines = {ln.split("  ")[0]: ln.split() for ln in out.stdout.splitlines()
             if ln.startswith(("one collector", "shard ", "all 3 shards"))}
    one, every = lines["one collector"], lines["all 3 shards"]
    shards = [v for k, v in lines.items() if k.startswith("shard ")]
    assert len(shards) == 3
    stored = lambda row: int(row[-2].replace(",", ""))  # noqa: E731  (ingest_samples_total)
    # the two runs' totals differ by the batches that fall after the end (timing), not compared
    assert stored(every) == sum(stored(r) for r in shards) > 0 and stored(one) > 0
    assert all(stored(r) > 0 for r in shards)  # every shard got jobs
    assert one[-1] == every[-1] == "0" and all(r[-1] == "0" for r in shards)  # dropped
    assert int(every[3]) > int(one[2])  # streams: more than one a node (node streams beside job streams)
    assert "stream errors: 0" in out.stdout
