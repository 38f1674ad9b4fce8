"""Issue 17 item 13: `agent --gpu-source nvml` where NVML cannot be used is one line and exit 2, not a
warning and a run like `auto`; where it can, the agent runs on NVML. A real agent process each time,
the library unloadable (tests/fakes/no_nvml.py) or the C stand-in for it."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.fakes.no_nvml import unloadable_library
from tests.fakes.nvml_stub import child_env, fixtures, write_state
from tests.support.helpers import CLI, clean_environ

stub_lib = fixtures.stub_lib  # the stand-in's fixture, used by name
GiB = 1024**3


def _agent(tmp_path: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "agent", "--node", "n1", "--spool-dir", str(tmp_path / "spool"), "--kmsg", "none",
                           "--no-provenance", "--train-socket", str(tmp_path / "train.sock"), *args],
                          env=env, capture_output=True, text=True, timeout=120)


def _without_nvml(tmp_path: Path) -> dict:
    env = clean_environ()
    env["LD_LIBRARY_PATH"] = str(unloadable_library(tmp_path / "no-nvml"))
    return env


def _one_line(out: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in out.stderr, out.stderr
    [line] = out.stderr.splitlines()
    return line


def test_nvml_asked_for_without_the_library_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = _without_nvml(tmp_path)
    once = _agent(tmp_path, env, "--gpu-source", "nvml", "--once", "--json")
    assert once.returncode == 2 and once.stdout == ""
    line = _one_line(once)
    assert line.startswith("clusterwatch: --gpu-source nvml cannot be used: NVML library not found"), line
    assert "running without GPU data" not in line and "--gpu-source auto" in line
    # the live agent too, before it dials anything (the collector here answers nowhere)
    live = _agent(tmp_path, env, "--gpu-source", "nvml", "--collector", "127.0.0.1:9")
    assert live.returncode == 2 and _one_line(live) == line


def test_auto_without_the_library_still_runs_without_gpu_data(tmp_path: Path) -> None:
    out = _agent(tmp_path, _without_nvml(tmp_path), "--gpu-source", "auto", "--once", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["hello"]["gpu_source"] == "none"
    assert "NVML library not found" in out.stderr and "running without GPU data" in out.stderr


def test_nvml_asked_for_with_the_driver_not_loaded_is_one_line(stub_lib: Path, tmp_path: Path) -> None:
    state = tmp_path / "nvml-state.txt"
    write_state(state, f"gpu GPU-aaaa total={80 * GiB} used={GiB} util=0 power=1000 name=H100\ninit_error 9\n")
    out = _agent(tmp_path, child_env(stub_lib, state), "--gpu-source", "nvml", "--once", "--json")
    assert out.returncode == 2
    assert _one_line(out).startswith("clusterwatch: --gpu-source nvml cannot be used: NVIDIA driver not loaded")


def test_nvml_asked_for_with_the_library_present_runs_on_nvml(stub_lib: Path, tmp_path: Path) -> None:
    state = tmp_path / "nvml-state.txt"
    write_state(state, f"gpu GPU-aaaa total={80 * GiB} used={GiB} util=7 power=1000 name=NVIDIA H100\n"
                       f"proc GPU-aaaa {os.getpid()} {GiB}\n")
    out = _agent(tmp_path, child_env(stub_lib, state), "--gpu-source", "nvml", "--once", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["hello"]["gpu_source"] == "nvml"
    assert [g["uuid"] for g in doc["hello"]["gpus"]] == ["GPU-aaaa"]
