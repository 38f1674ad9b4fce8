"""The C stand-in for libnvidia-ml.so.1 (libnvml.c): building it, and running the real pynvml on it.

pynvml opens `libnvidia-ml.so.1` once per process, so every case runs the NVML source in a
child process (`drive.py`) whose LD_LIBRARY_PATH holds the stand-in and whose
NVML_STUB_STATE names the state file; the child writes each step's state, polls, and prints
what the source returned as one JSON document. The state file's format is in libnvml.c.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["build", "child_env", "drive", "write_state", "LIBRARY"]

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "libnvml.c"
LIBRARY = "libnvidia-ml.so.1"
REPO = HERE.parents[2]


def build(dest: Path, *, v3: bool = True) -> Path:
    """Compile the stand-in with the system C compiler into `dest`; return that folder.

    Args:
        dest: an empty folder of its own (the library's file name is the driver's).
        v3: with the `_v3` process functions; without them it stands for a driver before R510.

    Returns:
        The folder to put on LD_LIBRARY_PATH.
    """
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc) on PATH: run scripts/setup.sh, which installs gcc")
    dest.mkdir(parents=True, exist_ok=True)
    args = [cc, "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-o", str(dest / LIBRARY),
            str(SOURCE), "-lpthread"]
    if not v3:
        args.insert(1, "-DNVML_STUB_NO_V3")
    subprocess.run(args, check=True, capture_output=True, text=True)
    return dest


def write_state(path: Path, text: str) -> None:
    """Replace the state file at once (a new inode, so the stand-in sees the change at any speed)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def child_env(lib_dir: Path, state: Path, calls: Path | None = None) -> dict[str, str]:
    """The environment of a process that loads the stand-in: no CLUSTERWATCH_* of the caller's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLUSTERWATCH_", "NVML_STUB_"))}
    env["LD_LIBRARY_PATH"] = str(lib_dir) + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env["NVML_STUB_STATE"] = str(state)
    env["PYTHONPATH"] = str(REPO) + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if calls is not None:
        env["NVML_STUB_CALLS"] = str(calls)
    return env


def drive(lib_dir: Path, workdir: Path, steps: list[dict[str, Any]], *, source: dict[str, Any] | None = None,
          calls: bool = False, timeout: float = 60.0) -> dict[str, Any]:
    """Run the NVML source over the real pynvml and the stand-in in a child process.

    Args:
        lib_dir: the folder `build` returned.
        workdir: where the state file (and the call log) go.
        steps: each {"state": text (optional: the state for this step), "now": Unix seconds,
            "mono": the source's monotonic clock (optional), "pause": seconds to wait first}.
            The first step's state is in place before the source opens.
        source: keyword arguments for NvmlGpuSource (JSON values).
        calls: record every NVML call (function, UUID) into the result's "calls".
        timeout: seconds the child may take.

    Returns:
        {"inventory": [...], "polls": [...], "log": [...], "open_error": str | None,
         "pids_hidden": bool, "calls": [[function, uuid], ...]}; each poll is {"readings",
         "processes" (pid as text → GpuUse lists), "energy" (UUID → the energy counter in mJ, None unread),
         "errors", "stale", "seconds", "inventory",
         "pid_visibility" (why NVML's pids are not processes here, "" when they are), "activity" (UUID → the
         GpuActivity fields read since the last poll)}.
    """
    state = workdir / "nvml-state.txt"
    calls_path = workdir / "nvml-calls.txt" if calls else None
    if calls_path is not None and calls_path.exists():
        calls_path.unlink()
    write_state(state, steps[0].get("state", "") if steps else "")
    spec = {"state": str(state), "steps": steps, "source": source or {}}
    proc = subprocess.run([sys.executable, str(HERE / "drive.py")], input=json.dumps(spec), text=True,
                          capture_output=True, env=child_env(lib_dir, state, calls_path), timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"drive.py failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    result = json.loads(proc.stdout)
    result["calls"] = [line.split(" ", 1) for line in calls_path.read_text().splitlines()] if calls_path else []
    return result
