"""The site's own progress pattern (`--job-output-regex`), run where a job's output cannot hold the agent.

The regex is the operator's, the text it runs on a job's, and Python's `re` has no time limit: a line made to
backtrack through a careless pattern (`(\\d+)+x`) would hold the agent's thread for hours with the GIL. So the
pattern runs in a child process of its own (as nobody when the agent is root: it needs no rights), fed a round's
lines at once; a round that takes longer than the limit kills the child (counted; the round's lines go unread),
the next round starts a new one, and after a few such rounds the pattern is switched off with one line.
"""
from __future__ import annotations

import json
import logging
import os
import re
import selectors
import subprocess
import sys
import time

from clusterwatch.errors import ConfigError

from .job_output_parse import Progress, number, step_number

log = logging.getLogger("clusterwatch.agent")

GROUPS = ("step", "loss", "lr")
MAX_TIMEOUTS = 3

# Reads a JSON list of lines per input line; writes a JSON list of each line's groups (or null) per output line.
_CHILD = r"""
import json, os, re, sys
if os.geteuid() == 0:  # started as root (nobody may not be able to run the agent's interpreter): drop it first
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
rx = re.compile(sys.argv[1])
for batch in sys.stdin:
    out = []
    for line in json.loads(batch):
        m = rx.search(line)
        out.append(None if m is None else {k: v for k, v in m.groupdict().items() if v is not None})
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
"""


def check_pattern(pattern: str) -> re.Pattern:
    """The compiled pattern, or ConfigError saying what is wrong with it."""
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"--job-output-regex {pattern!r} is not a regular expression: {exc}") from None
    if not set(rx.groupindex) & set(GROUPS):
        raise ConfigError(f"--job-output-regex {pattern!r} names none of the groups step, loss, lr: "
                          "write them as (?P<step>\\d+), (?P<loss>[0-9.e-]+), (?P<lr>[0-9.e-]+)")
    return rx


def progress_of(groups: dict | None) -> Progress | None:
    """A matched line's groups as progress; None when none of them reads as a number."""
    if not isinstance(groups, dict):
        return None
    step = step_number(str(groups["step"])) if "step" in groups else None
    loss = number(str(groups["loss"])) if "loss" in groups else None
    lr = number(str(groups["lr"])) if "lr" in groups else None
    if step is None and loss is None and lr is None:
        return None
    return Progress(step=step, loss=loss, lr=lr, explicit=step is not None)


class SiteRegex:
    """Matches lines against the site's pattern in a child process, each round within `timeout_s`.

    Attributes:
        timeouts: rounds the child did not finish in time (it was killed).
        off: the pattern is switched off (MAX_TIMEOUTS rounds timed out).
    """

    def __init__(self, pattern: str, timeout_s: float = 1.0) -> None:
        check_pattern(pattern)
        self.pattern = pattern
        self.timeout_s = timeout_s
        self.timeouts = 0
        self.off = False
        self._child: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-I", "-S", "-c", _CHILD, self.pattern], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={}, cwd="/",
                                start_new_session=True)

    def __call__(self, lines: list[str]) -> list[Progress | None]:
        """Each line's progress by the pattern (None where it does not match); all None when the round timed out
        or the pattern is off."""
        if self.off or not lines:
            return [None] * len(lines)
        if self._child is None or self._child.poll() is not None:
            self._child = self._start()
        child = self._child
        try:
            child.stdin.write(json.dumps(lines).encode() + b"\n")  # type: ignore[union-attr]
            child.stdin.flush()  # type: ignore[union-attr]
            answer = self._answer(child)
        except OSError:
            answer = None
        if answer is None:
            self._kill()
            return [None] * len(lines)
        try:
            groups = json.loads(answer)
        except ValueError:
            groups = []
        if not isinstance(groups, list) or len(groups) != len(lines):
            return [None] * len(lines)
        return [progress_of(g) for g in groups]

    def _answer(self, child: subprocess.Popen) -> bytes | None:
        out = child.stdout
        assert out is not None
        data = b""
        deadline = time.monotonic() + self.timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(out, selectors.EVENT_READ)
            while not data.endswith(b"\n"):
                if not sel.select(max(0.0, deadline - time.monotonic())):
                    self.timeouts += 1
                    if self.timeouts >= MAX_TIMEOUTS:
                        self.off = True
                        log.warning("the site's job-output regex %r took over %.1f s on a job's output %d times: "
                                    "switched off; write one that cannot backtrack (no repeat inside a repeat)",
                                    self.pattern, self.timeout_s, self.timeouts)
                    return None
                chunk = os.read(out.fileno(), 1 << 20)
                if not chunk:
                    return None
                data += chunk
        return data

    def _kill(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            child.kill()
            child.wait()
            for pipe in (child.stdin, child.stdout):
                if pipe is not None:
                    pipe.close()

    def close(self) -> None:
        self._kill()
