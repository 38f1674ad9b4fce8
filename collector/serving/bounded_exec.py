"""Run a short-lived child (scontrol, unmunge) from the collector's event loop, never letting it outlive the call.

A child that hangs is killed at the timeout; one still running when the awaiting task is cancelled (the
collector stopping, a query abandoned) is killed too, by its PID: without that, a `scontrol` stuck on a
missing slurm.conf was left behind, re-parented to init, after every collector restart.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence

PIPE = asyncio.subprocess.PIPE
DEVNULL = asyncio.subprocess.DEVNULL


async def run_bounded(args: Sequence[str], timeout_s: float, input: bytes | None = None,
                      env: Mapping[str, str] | None = None, stdout: int = PIPE,
                      stderr: int = PIPE) -> tuple[int, bytes, bytes]:
    """Run `args` to its end and return (exit status, stdout, stderr).

    Raises:
        OSError: the program cannot be started (FileNotFoundError when it is not installed).
        asyncio.TimeoutError: it did not end within timeout_s; it has been killed and reaped.
    """
    proc = await asyncio.create_subprocess_exec(
        *args, stdin=PIPE if input is not None else DEVNULL, stdout=stdout, stderr=stderr,
        env=dict(env) if env is not None else None)
    try:
        out, err = await asyncio.wait_for(proc.communicate(input), timeout_s)
    except asyncio.TimeoutError:
        _kill(proc)
        await proc.wait()
        raise
    except BaseException:  # cancelled: the child is killed all the same, and reaped unless cancelled again
        _kill(proc)
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(proc.wait(), 5.0)
        raise
    return proc.returncode or 0, out or b"", err or b""


def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        try:
            proc.kill()
        except ProcessLookupError:  # it ended meanwhile
            pass
