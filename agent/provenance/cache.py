"""The git states shared by the ranks that start together in one checkout."""
from __future__ import annotations

import time
from collections.abc import Callable

from clusterwatch.agent.gitrun import RunAs
from clusterwatch.agent.provenance.record import GitState


class GitStateCache:
    """git states taken in the last few seconds, by directory and identity.

    The ranks of a job on one node start together, in the same checkout, as the same user: each would run
    the same git calls seconds apart (in a large repository `git status` alone takes a second or more), and
    each would read the same tree. A state taken within `ttl_s` serves them all; a failure (a timeout
    included) is kept as well, so a repository git cannot read costs its budget once, not once a rank.

    Args:
        ttl_s: how long a state serves later processes.
        max_entries: states kept at most (the oldest go first).
        clock: seconds (tests pass their own).
    """

    def __init__(self, ttl_s: float = 10.0, max_entries: int = 64,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.clock = clock
        self.hits = 0
        self._states: dict[tuple[str, RunAs], tuple[float, GitState]] = {}

    def get(self, path: str, run_as: RunAs, take: Callable[[], GitState]) -> GitState:
        """The state of `path` for `run_as`: kept from less than ttl_s ago, else taken now by `take()`."""
        key = (path, run_as)
        now = self.clock()
        kept = self._states.get(key)
        if kept is not None and 0.0 <= now - kept[0] < self.ttl_s:
            self.hits += 1
            return kept[1]
        state = take()
        self._states.pop(key, None)
        self._states[key] = (now, state)
        while len(self._states) > self.max_entries:
            del self._states[next(iter(self._states))]
        return state
