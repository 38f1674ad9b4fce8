"""An agent started by `clusterwatch agent --ensure` or by the prolog gets the deployment's --collectors-before,
not only the collectors list: without it the jobs numbered below the new list's first job would stream to the
new list's collector, where `status` with both lists does not look for them."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from clusterwatch.agent.ensure import read_pid

from tests.services.procs import free_port, stop_pid
from tests.support.helpers import CLI, clean_environ, wait_for


def _argv(pid: int) -> list[str]:
    return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]


def _started_agent(spool: Path) -> int:
    pid = wait_for(lambda: read_pid(str(spool / "agent.pid")), 10.0, what="the agent's pid file")
    assert pid, "no agent pid file"
    return pid


def _listed(pid: int) -> tuple[str, str]:
    argv = _argv(pid)
    assert "--collectors-before" in argv, argv
    return argv[argv.index("--collector") + 1], argv[argv.index("--collectors-before") + 1]


def test_agent_ensure_passes_collectors_before(tmp_path: Path) -> None:
    new = f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    old = f"127.0.0.1:{free_port()}"
    spool = tmp_path / "spool"
    r = subprocess.run([*CLI, "agent", "--ensure", "--collector", new, "--collectors-before", f"9000={old}",
                        "--node", "eb1", "--gpu-source", "none", "--spool-dir", str(spool)],
                       env=clean_environ(), capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    pid = _started_agent(spool)
    try:
        assert _listed(pid) == (new, f"9000={old}")
    finally:
        stop_pid(pid, grace=15.0)


def test_the_prolog_passes_the_config_files_collectors_before(tmp_path: Path) -> None:
    a, b, c = (f"127.0.0.1:{free_port()}" for _ in range(3))
    config = tmp_path / "config.toml"
    config.write_text(f'collectors = ["{a}", "{b}"]\ncollectors_before = {{ job = 4000, collectors = ["{c}"] }}\n'
                      '[agent]\ngpu_source = "none"\n')
    spool = tmp_path / "spool"
    # what slurmd gives a prolog (no PATH), the deployment in the config file alone
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_UID": str(os.getuid()), "SLURM_JOB_USER": "alice",
           "SLURMD_NODENAME": "eb2", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd", "CLUSTERWATCH_CONFIG": str(config),
           "CLUSTERWATCH_SPOOL": f"{spool}/{{node}}"}
    r = subprocess.run([*CLI, "prolog"], env=env, capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stdout + r.stderr
    pid = _started_agent(spool / "eb2")
    try:
        assert _listed(pid) == (f"{a},{b}", f"4000={c}")
    finally:
        stop_pid(pid, grace=15.0)
