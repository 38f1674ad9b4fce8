"""bench_agent.py --nvml-only --quick: the NVML rows alone (the agent over the real pynvml and the C stand-in,
beside psutil + pyNVML), their parts, and no process left behind. No timing is asserted."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid

from tests.support.helpers import ROOT, left_behind


def test_the_nvml_rows_alone() -> None:
    marker = uuid.uuid4().hex
    env = dict(os.environ, CW_BENCH_SMOKE=marker)
    env.pop("CLUSTERWATCH_COLLECTOR", None)
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_agent.py"), "--nvml-only", "--quick"],
                         capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert left_behind("CW_BENCH_SMOKE", marker) == []
    text = out.stdout
    for label in ("clusterwatch Agent.poll + serialise (NVML: real pynvml, C stand-in)",
                  "seed: psutil ×64 + pyNVML per GPU (real pynvml, C stand-in)",
                  "64 processes, 64 listed on 8 GPUs", "target ≥ 10×", "GPU source (NVML, its read thread too)",
                  "/proc: the watched trees", "process table + serialise", "pynvml calls"):
        assert label in text, label
