"""The end of a job's output file, read as it grows, within fixed bounds.

Only the latest progress matters, so the reader starts near the end, and when more was written since the last
read than one read takes (a chatty job), it skips to the end rather than fall behind. Lines end at "\\n" or at
tqdm's "\\r"; a line longer than the limit (binary garbage, a progress bar with no end) is dropped up to its
end. A file truncated under the reader (`> out.log`, a log rotated by copy-and-truncate) is read again from its
start. The file is an open descriptor: a path replaced meanwhile does not change what is read.
"""
from __future__ import annotations

import os
import re

_ENDS = re.compile(rb"[\r\n]")


class OutputTail:
    """Reads what is appended to an open regular file.

    Args:
        fd: the file, open for reading (not closed here).
        max_read: bytes read at most per call; more written since the last call is skipped, the newest kept.
        max_line: longest line kept, in bytes.
        max_lines: lines given at most per call (the newest).

    Attributes:
        skipped_bytes: bytes never read because more came than one read takes.
        truncations: times the file was found shorter than what had been read.
    """

    def __init__(self, fd: int, max_read: int = 64 << 10, max_line: int = 4096, max_lines: int = 1000) -> None:
        self.fd = fd
        self.max_read = max_read
        self.max_line = max_line
        self.max_lines = max_lines
        self.skipped_bytes = 0
        self.truncations = 0
        size = os.fstat(fd).st_size
        self.offset = max(0, size - max_read)
        self._pending = b""  # the unterminated last line
        self._dropping = self.offset > 0  # started inside a line: drop up to its end

    def read(self) -> tuple[list[str], str]:
        """The lines ended since the last call (the newest max_lines) and the line being written (tqdm's bar
        between two updates), "" when none."""
        size = os.fstat(self.fd).st_size
        if size < self.offset:
            self.truncations += 1
            self.offset, self._pending, self._dropping = 0, b"", False
        if size - self.offset > self.max_read:
            self.skipped_bytes += size - self.max_read - self.offset
            self.offset, self._pending, self._dropping = size - self.max_read, b"", True
        data = os.pread(self.fd, min(self.max_read, size - self.offset), self.offset) if size > self.offset else b""
        self.offset += len(data)
        parts = _ENDS.split(self._pending + data)
        self._pending = parts.pop()
        lines = []
        for part in parts:
            if self._dropping:
                self._dropping = False  # the dropped line ended here
                continue
            if part and len(part) <= self.max_line:
                lines.append(part)
        if self._dropping or len(self._pending) > self.max_line:
            self._pending, self._dropping = b"", True
        lines = lines[-self.max_lines:]
        return [line.decode("utf-8", "replace") for line in lines], self._pending.decode("utf-8", "replace")
