"""`run` whose embedded agent cannot start (here `--gpu-source nvml` without the library) does not run the command
unwatched: it says the agent's own line, and the path of its log only when the log is kept."""
from __future__ import annotations

import subprocess
from pathlib import Path

from tests.fakes.no_nvml import unloadable_library
from tests.support.helpers import CLI, clean_environ


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = clean_environ()
    env["LD_LIBRARY_PATH"] = str(unloadable_library(tmp_path / "no-nvml"))
    # the command would leave a mark: it must not run
    return subprocess.run([*CLI, "run", "--gpu-source", "nvml", *args, "--", "touch", str(tmp_path / "ran")],
                          env=env, capture_output=True, text=True, timeout=120)


def test_the_agent_s_reason_is_said_and_where_its_log_is_only_when_kept(tmp_path: Path) -> None:
    out = _run(tmp_path)
    assert out.returncode == 2, out.stderr
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("clusterwatch: the embedded agent stopped: clusterwatch: --gpu-source nvml cannot be "
                           "used: NVML library not found"), line
    assert line.endswith("; the command was not run (--keep DIR keeps its log)"), line
    assert not (tmp_path / "ran").exists()

    kept = tmp_path / "kept"
    out = _run(tmp_path, "--keep", str(kept))
    [line] = out.stderr.strip().splitlines()
    log = line.rsplit("(the agent's log: ", 1)[1].rstrip(")")
    assert "cannot be used" in Path(log).read_text(), log
    assert not (tmp_path / "ran").exists()
