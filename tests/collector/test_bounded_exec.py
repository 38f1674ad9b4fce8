"""run_bounded: a child's output and status, and a child that never outlives the call (timeout, cancellation)."""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from clusterwatch.collector.serving.bounded_exec import run_bounded


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed child waits as a zombie until asyncio's watcher reaps it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False


def test_status_output_and_input() -> None:
    code, out, err = asyncio.run(run_bounded(["sh", "-c", "cat; echo oops >&2; exit 3"], 10, input=b"hello"))
    assert (code, out, err) == (3, b"hello", b"oops\n")


def test_a_missing_program_is_file_not_found() -> None:
    with pytest.raises(FileNotFoundError):
        asyncio.run(run_bounded(["/nonexistent/scontrol"], 10))


def _sleeper(pid_file: Path) -> list[str]:
    return ["sh", "-c", f"echo $$ > {pid_file}; exec sleep 60"]


def test_a_child_past_its_timeout_is_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    with pytest.raises(asyncio.TimeoutError):
        asyncio.run(run_bounded(_sleeper(pid_file), 0.5))
    pid = int(pid_file.read_text())
    assert not _running(pid)


def test_a_cancelled_call_kills_its_child(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"

    async def cancel_midway() -> None:
        task = asyncio.ensure_future(run_bounded(_sleeper(pid_file), 60))
        while not pid_file.exists() or not pid_file.read_text().strip():
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_midway())
    pid = int(pid_file.read_text())
    left = _running(pid)
    if left:
        os.kill(pid, 9)  # ours: the test's own child, by its pid
    assert not left, f"the cancelled call left its child {pid} running"
