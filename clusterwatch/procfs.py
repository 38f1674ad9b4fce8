"""Linux /proc: parsers of its texts (a process's stat line, its environ, /proc/stat's btime), pure functions
over bytes, and the thin readers that several parts of the agent share (a process's environ and start time, the
boot time, a whole file).

The one place their layout is known. Reading a file kept open, and racing with a process that exits, is the
caller's business (the process source keeps its own descriptors). Field numbers are those of proc(5).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from clusterwatch.errors import ParseError

_CLK_TCK = os.sysconf("SC_CLK_TCK")

# Fields of /proc/<pid>/stat, numbered as proc(5) numbers them (1: pid, 2: comm).
STATE, PPID, UTIME, STIME, NUM_THREADS, STARTTIME, RSS, EXIT_SIGNAL, ENV_END = 3, 4, 14, 15, 20, 22, 24, 38, 51
# Where field n lies in the list split_stat returns.
FIRST_AFTER_COMM = 3
STAT_MAX = 4096  # enough for any stat text: a stat line is well under 1 KiB (comm is at most 64 bytes)


def split_stat(text: bytes, upto: int = RSS) -> tuple[int, list[bytes]]:
    """(where the command name ends, the fields after it, split up to field `upto`): field n is rest[n - 3].

    The command name may hold spaces and parentheses: the split is at the last ')'. ValueError when there
    is none; a list too short for a field raises IndexError where it is read.
    """
    close = text.rindex(b")")
    return close, text[close + 2:].split(None, upto - FIRST_AFTER_COMM + 1)


def stat_comm(text: bytes, close: int) -> str:
    """The command name of a stat text whose name ends at `close` (from split_stat)."""
    return text[text.index(b"(") + 1: close].decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class StatFields:
    """The fields of /proc/<pid>/stat the agent uses."""

    comm: str
    state: str
    ppid: int
    cpu_ticks: int  # utime + stime, in clock ticks
    threads: int
    start_ticks: int  # start time after boot, in clock ticks
    rss_pages: int


def parse_stat(text: bytes) -> StatFields:
    """Parse a /proc/<pid>/stat text; ParseError (a ValueError) when it is not one."""
    try:
        close, rest = split_stat(text)
        return StatFields(
            comm=stat_comm(text, close),
            state=rest[STATE - 3].decode("ascii", "replace"),
            ppid=int(rest[PPID - 3]),
            cpu_ticks=int(rest[UTIME - 3]) + int(rest[STIME - 3]),
            threads=int(rest[NUM_THREADS - 3]),
            start_ticks=int(rest[STARTTIME - 3]),
            rss_pages=int(rest[RSS - 3]),
        )
    except (ValueError, IndexError) as exc:
        raise ParseError(f"not a /proc/<pid>/stat line: {bytes(text[:60])!r}") from exc


def stat_state(text: bytes) -> str | None:
    """The state letter of a stat text (R, S, Z, ...), None for bad text."""
    try:
        return split_stat(text, STATE)[1][0].decode("ascii", "replace")
    except (ValueError, IndexError):
        return None


def stat_parent(text: bytes) -> int | None:
    """The parent pid in a stat text, None for bad text."""
    try:
        return int(split_stat(text, PPID)[1][PPID - 3])
    except (ValueError, IndexError):
        return None


def probe(text: bytes) -> tuple[int, int] | None:
    """(parent pid, start ticks) of a process's stat text; None for a thread (exit_signal -1) or bad text."""
    try:
        rest = split_stat(text, EXIT_SIGNAL)[1]
        if rest[EXIT_SIGNAL - 3] == b"-1":
            return None  # a thread: /proc/<tid> is there too, but a thread is not a process
        return int(rest[PPID - 3]), int(rest[STARTTIME - 3])
    except (ValueError, IndexError):
        return None


def environ_laid_out(text: bytes) -> bool:
    """Whether the process of a stat text has its environment in place (its env_end is set).

    execve switches a process to its new memory before it copies the environment there: in between (often
    just when fork+exec has returned to the parent) /proc/<pid>/environ reads empty, as it does for a
    process whose environment is empty. A kernel before 3.5 has no such field: True, it cannot tell.
    """
    try:
        return split_stat(text, ENV_END)[1][ENV_END - FIRST_AFTER_COMM] != b"0"
    except (ValueError, IndexError):
        return True


def parse_btime(text: bytes) -> float | None:
    """Boot time in Unix seconds from the text of /proc/stat (its `btime` line); None without one."""
    for line in text.splitlines():
        if line.startswith(b"btime "):
            try:
                return float(line.split()[1])
            except (ValueError, IndexError):
                return None
    return None


def parse_environ(data: bytes) -> dict[str, str]:
    """Split the bytes of ``/proc/<pid>/environ`` into a dict.

    Entries without ``=`` (a process may scribble over its environment) are skipped; bytes that are not
    UTF-8 are replaced rather than failing, since a label is better than no label.

    Args:
        data: the file's content, NUL-separated ``NAME=value`` entries.

    Returns:
        Variable name → value (the last one wins when a name repeats).

    Raises:
        ParseError: ``data`` is not bytes.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ParseError(f"environ must be bytes, not {type(data).__name__}")
    env: dict[str, str] = {}
    for entry in bytes(data).split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name:
            env[name.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


class ExecInProgress(Exception):
    """A process is inside execve: its environment reads empty until the new program's is laid out.

    Whoever reads it reads it again later (the agent: at its next poll) rather than keep "no variables" for it.
    """


def read_environ(proc: str, pid: int, limit: int = 1 << 20) -> bytes | None:
    """The bytes of /proc/<pid>/environ (up to `limit`); None when it cannot be read (gone, another user's).

    Raises:
        ExecInProgress: it read empty and the process's stat says its environment is not in place yet.
    """
    path = f"{proc}/{pid}/environ"
    try:
        with open(path, "rb") as f:
            data = f.read(limit)
        if data:
            return data
        # Empty: inside execve, or an empty environment. The stat read after it tells; when it says laid out,
        # the execve may have got there meanwhile: the environment is read once more.
        with open(f"{proc}/{pid}/stat", "rb", buffering=0) as f:
            if not environ_laid_out(f.read(STAT_MAX)):
                raise ExecInProgress(pid)
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return None


def read_boot_time(proc: str = "/proc") -> float:
    """Boot time in Unix seconds, from the `btime` line of /proc/stat."""
    with open(f"{proc}/stat", "rb") as f:
        boot = parse_btime(f.read())
    if boot is None:
        raise OSError(f"{proc}/stat has no btime line")
    return boot


def read_bytes(path: str) -> bytes:
    """A whole file's bytes (a /proc file, read in one go).

    Raises:
        OSError: it cannot be read.
    """
    with open(path, "rb") as f:
        return f.read()


def process_start_time(pid: int, proc: str = "/proc", boot_time: float | None = None) -> float:
    """A process's start time in Unix seconds, rounded to 0.01 s as the process source does.

    Args:
        pid: the process.
        proc: the /proc mount point.
        boot_time: the boot time, when the caller already read it.

    Returns:
        The start time; with the node and pid, the process's identity.

    Raises:
        OSError: the process is gone or /proc is unreadable.
        ValueError: the stat line is malformed.
    """
    boot = read_boot_time(proc) if boot_time is None else boot_time
    try:
        ticks = parse_stat(read_bytes(f"{proc}/{pid}/stat")).start_ticks
    except IndexError as exc:
        raise ValueError(f"malformed {proc}/{pid}/stat") from exc
    return round(boot + ticks / _CLK_TCK, 2)
