"""git's answers parsed (pure): `git status --porcelain=v2` and `git config --list -z`."""
from __future__ import annotations

from clusterwatch.agent.provenance.record import UNKNOWN


class StatusParser:
    """Streams `git status --porcelain=v2 --branch -z` output into counts.

    Output is fed chunk by chunk, so a work tree with a million untracked files is
    counted without being held in memory.
    """

    def __init__(self) -> None:
        self.commit = UNKNOWN
        self.branch = UNKNOWN
        self.changed = 0
        self.untracked = 0
        self._rest = b""
        self._skip = 0

    def feed(self, chunk: bytes) -> None:
        """Take the next piece of output."""
        records = (self._rest + chunk).split(b"\0")
        self._rest = records.pop()
        for rec in records:
            self._record(rec)

    def _record(self, rec: bytes) -> None:
        if self._skip:  # the original path of a rename ("2" entry) is its own record
            self._skip -= 1
            return
        if rec.startswith(b"# branch.oid "):
            self.commit = rec[13:].decode("ascii", "replace")
        elif rec.startswith(b"# branch.head "):
            self.branch = rec[14:].decode("utf-8", "replace")
        elif rec[:2] in (b"1 ", b"u "):
            self.changed += 1
        elif rec[:2] == b"2 ":
            self.changed += 1
            self._skip = 1
        elif rec[:2] == b"? ":
            self.untracked += 1

    def close(self) -> None:
        """Take a last record not followed by NUL, if any."""
        if self._rest:
            self._record(self._rest)
            self._rest = b""


def parse_status(data: bytes) -> StatusParser:
    """Parse a whole `git status --porcelain=v2 --branch -z` output.

    Args:
        data: the output.

    Returns:
        The parser, with commit, branch, changed and untracked filled.
    """
    p = StatusParser()
    p.feed(data)
    p.close()
    return p


def parse_config_list(data: bytes) -> tuple[list[str], dict[str, str]]:
    """Names and the remote URLs from `git config --list -z` (name NL value NUL).

    Args:
        data: the output.

    Returns:
        Every setting's name, in order, and each remote's URL by remote name (the first one given).
    """
    names: list[str] = []
    remotes: dict[str, str] = {}
    for item in data.split(b"\0"):
        if not item:
            continue
        name, _nl, value = item.decode("utf-8", "replace").partition("\n")
        names.append(name)
        low = name.lower()
        if low.startswith("remote.") and low.endswith(".url"):
            remotes.setdefault(name[7:-4], value)
    return names, remotes
