"""The command of `clusterwatch run`, started held: its process exists (so its pid names the job and the agent
can be told to watch it) but runs nothing of the user's until released.

The agent must listen for the command's training reports before the command's first line runs, or those
reports are lost; and it must first see the process as the command, not as a stand-in, since the command
line it reads then is the one its git provenance records. So the process starts as a small Python program
that waits on a pipe, then replaces itself (exec, same pid and start time) with the command. A second pipe,
closed by the exec itself, says when the command runs, or why it could not start (its errno), as
subprocess.Popen says it.
"""
from __future__ import annotations

import errno
import os
import subprocess
import sys

# argv: GO_FD DONE_FD COMMAND... ; waits for a byte on GO_FD (none: the caller is gone, exit 125 running
# nothing), then execs COMMAND; DONE_FD is closed by the exec, or carries the errno when it fails
_HOLD = """
import os, signal, sys
# what the command gets is what subprocess gives a child: SIGPIPE and SIGXFSZ as by default (Python ignores
# them), SIGINT as the caller had it (Python's handler, which an exec would reset, or ignored)
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
go, done = int(sys.argv[1]), int(sys.argv[2])
if os.read(go, 1) != b"g":
    os._exit(125)
os.close(go)
os.set_inheritable(done, False)
try:
    os.execvp(sys.argv[3], sys.argv[3:])
except OSError as exc:
    os.write(done, str(exc.errno or 0).encode())
    os._exit(127)
"""


class HeldCommand:
    """The command's process, held before its first instruction.

    Args:
        command: the command and its arguments.
        env: its environment (its PATH finds the command).
    """

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        go_read, self._go = os.pipe()
        self._done, done_write = os.pipe()
        try:
            # -I -S: no PYTHON* variable, site or user folder of the caller's changes what the stand-in does
            self.process = subprocess.Popen([sys.executable, "-I", "-S", "-c", _HOLD, str(go_read), str(done_write),
                                             *command], env=env, pass_fds=(go_read, done_write))
        except BaseException:
            for fd in (self._go, self._done):
                os.close(fd)
            raise
        finally:
            os.close(go_read)
            os.close(done_write)

    @property
    def pid(self) -> int:
        return self.process.pid

    def release(self) -> None:
        """Run the command; once it runs, return.

        Raises:
            FileNotFoundError: no such command.
            PermissionError: not executable.
            OSError: another reason the exec failed.
        """
        try:
            os.write(self._go, b"g")
        finally:
            os.close(self._go)
            self._go = -1
        said = b""
        try:
            while chunk := os.read(self._done, 16):
                said += chunk
        finally:
            os.close(self._done)
            self._done = -1
        if said:
            self.process.wait()
            code = int(said) if said.isdigit() else 0
            raise OSError(code, os.strerror(code) if code else "the command could not start")

    def cancel(self) -> None:
        """Let the held process go without running the command (it exits 125); reaped."""
        for fd in (self._go, self._done):
            if fd >= 0:
                os.close(fd)
        self._go = self._done = -1
        self.process.wait()


def start_failure(exc: OSError) -> tuple[str, int]:
    """What a shell says when a command cannot start: the line's reason and its exit code (127, 126)."""
    if exc.errno == errno.ENOENT:
        return "command not found", 127
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "command not executable", 126
    return f"command could not start ({exc.strerror})", 126
