"""`run` whose embedded agent cannot start (here `--gpu-source nvml` without the library) says the agent's own
line at the end, not only "no samples" and the path of a log that went with the run's folder."""
from __future__ import annotations

import subprocess
from pathlib import Path

from tests.fakes.no_nvml import unloadable_library
from tests.helpers import CLI, clean_environ


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = clean_environ()
    env["LD_LIBRARY_PATH"] = str(unloadable_library(tmp_path / "no-nvml"))
    return subprocess.run([*CLI, "run", "--gpu-source", "nvml", *args, "--", "sleep", "1"], env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_agent_s_reason_is_said_and_where_its_log_is_only_when_kept(tmp_path: Path) -> None:
    out = _run(tmp_path)
    assert out.returncode == 0, out.stderr  # the command's own exit status
    [line] = [x for x in out.stderr.splitlines() if "no samples" in x]
    assert "the agent stopped: clusterwatch: --gpu-source nvml cannot be used: NVML library not found" in line, line
    assert line.endswith("(--keep DIR keeps its log)"), line

    kept = tmp_path / "kept"
    out = _run(tmp_path, "--keep", str(kept))
    [line] = [x for x in out.stderr.splitlines() if "no samples" in x]
    log = line.rsplit("(its log: ", 1)[1].rstrip(")")
    assert "cannot be used" in Path(log).read_text(), log
