"""Say a thing once: a warning the first time its key is seen, then quiet while a counter says how often.

A loop that polls every second must not write the same failure every second (a node without sshd, a peer
sending garbage, a GPU that hides its processes). A key is forgotten again when what it said is over (the
stream is up again, the store took the row), so that the next failure is said anew.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Hashable


class SaidOnce:
    """The keys said already, for one logger.

    `limit` bounds the memory where keys come from outside (peers, nodes): when it is full it is
    cleared, so a flood cannot grow it and an old key may be said once more.
    """

    def __init__(self, log: logging.Logger | None = None, limit: int | None = None) -> None:
        self._log = log or logging.getLogger("clusterwatch")
        self._limit = limit
        self._said: set[Hashable] = set()
        self._lock = threading.Lock()  # said from several threads (gRPC's, the poll's): once means once

    def first(self, key: Hashable) -> bool:
        """Whether `key` is new (and remember it): the caller says what it has to say when it is."""
        with self._lock:
            if key in self._said:
                return False
            if self._limit is not None and len(self._said) >= self._limit:
                self._said.clear()
            self._said.add(key)
            return True

    def warning(self, key: Hashable, message: str, *args: object) -> bool:
        """Log `message % args` as a warning the first time `key` is seen; whether it was logged."""
        if not self.first(key):
            return False
        self._log.warning(message, *args)
        return True

    def forget(self, key: Hashable) -> None:
        """What `key` said is over: the next time it is seen, it is said again."""
        with self._lock:
            self._said.discard(key)

    def clear(self) -> None:
        """Everything said is over (a stream came back): each key is said again when next seen."""
        with self._lock:
            self._said.clear()

    def __len__(self) -> int:
        return len(self._said)
