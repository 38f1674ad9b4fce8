"""History kept as columns of machine numbers in a ring, not as a Python object a point.

A collector holds an hour of points for every process and GPU it watches (720 at the defaults): as a deque
of named tuples a process point took 254 bytes (the tuple, a float or int object a field, the deque's
slot; bench/bench_history_memory.py), 11.7 GiB for a 1,000-node shard. Here each field is one
``array`` column (8 bytes a value: ``d`` for times and ratios, ``q`` for counts and bytes), filled by
append until ``maxlen`` and then overwritten oldest first, so a process point takes 56 bytes and a GPU
point 24.

Appends are written out field by field for each of the three shapes (a process point, a GPU reading, a
GPU's power): a loop over the columns cost three times the named tuple it replaces, on every reading.

Readers see what a deque of tuples gave them: iteration oldest first yields the row type (``Point`` for a
process, a plain tuple for a GPU), ``len``, ``maxlen``, ``ring[-1]``. An unknown value (None) is stored as
NaN in a float column and -1 in an integer one (the wire's own "unknown" for those fields, never a real
reading), and read back as None. Every value fits a ``q``: collector/ingest/checks.py refuses a batch with
bytes over 2**52 or counts over 2**24 before it reaches the state; a process's GPU memory, a sum over as
many GPU uses as a message holds, is kept as unknown past 2**63.
"""
from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Sequence
from typing import Any

_NAN = float("nan")
_INT64_MAX = (1 << 63) - 1


class ColumnRing:
    """The last `maxlen` rows of fixed-type fields, oldest first: what the rings share, reading.

    A subclass holds the columns (``_cols``, one ``array`` a field, ``d`` float or ``q`` int), says which
    are floats (``_floats``), how a row is built from its fields (``_row``), and appends.
    """

    __slots__ = ("maxlen", "_cols", "_head", "last_t")
    _floats: tuple[bool, ...] = ()

    def __init__(self, maxlen: int, typecodes: str) -> None:
        self.maxlen = maxlen
        self._cols = tuple(array(c) for c in typecodes)
        self._head = 0  # once full: where the oldest row is, and the next one goes
        #: the newest row's time, read on every ingest without building the row
        self.last_t = float("-inf")

    @staticmethod
    def _row(fields: Sequence) -> Any:
        return tuple(fields)

    def __len__(self) -> int:
        return len(self._cols[0])

    def _fields(self, i: int) -> list:
        out = []
        for col, is_float in zip(self._cols, self._floats, strict=True):
            v = col[i]
            out.append(None if (v != v if is_float else v == -1) else v)
        return out

    def __getitem__(self, k: int):
        n = len(self)
        if not isinstance(k, int):
            raise TypeError("a ring is indexed by row number, as a deque")
        if k < 0:
            k += n
        if not 0 <= k < n:
            raise IndexError("ring index out of range")
        return self._row(self._fields((self._head + k) % n))

    def times_after(self, t: float) -> list[float]:
        """The times of the rows newer than `t`, oldest first: only the newest rows' times are read (the rules ask
        for the few points a batch wrote, at every batch); row `i` of them is `self[i - len(found)]`."""
        n, times, h = len(self), self._cols[0], self._head
        k = n
        while k and times[(h + k - 1) % n] > t:
            k -= 1
        return [times[(h + i) % n] for i in range(k, n)]

    def column(self, field: int) -> list:
        """One field of every row, oldest first (None for unknown), without building the rows."""
        col, h = self._cols[field], self._head
        values = (col[h:] + col[:h]).tolist() if h else col.tolist()
        if self._floats[field]:
            return [None if v != v else v for v in values]
        return [None if v == -1 else v for v in values]

    def __iter__(self) -> Iterator:
        if not len(self):
            return iter(())
        columns = [self.column(f) for f in range(len(self._cols))]
        return map(self._row, zip(*columns, strict=True))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)!r}, maxlen={self.maxlen})"


class ProcessRing(ColumnRing):
    """A process's points: (t, CPU percent, RSS, GPU memory, GPU utilisation, threads, open descriptors).

    Args:
        maxlen: points kept (0 keeps none, as deque(maxlen=0)).
        row: builds a point from its seven fields (state.Point._make); a tuple by default.
    """

    __slots__ = ("_make",)
    _floats = (True, True, False, False, True, False, False)

    def __init__(self, maxlen: int, row: Callable[[Sequence], Any] = tuple) -> None:
        super().__init__(maxlen, "ddqqdqq")
        self._make = row

    def _row(self, fields: Sequence) -> Any:
        return self._make(fields)

    def append(self, point: Sequence) -> None:
        """Add a point (its seven fields in order; None for unknown)."""
        t, cpu, rss, gmem, gutil, threads, fds = point
        # a sum over the process's GPUs: each use is bounded, their number only by the message's size
        self.append_raw(t, _NAN if cpu is None else cpu, -1 if rss is None else rss,
                        -1 if gmem is None or gmem > _INT64_MAX else gmem, _NAN if gutil is None else gutil,
                        -1 if threads is None else threads, -1 if fds is None else fds)

    def append_raw(self, t: float, cpu: float, rss: int, gmem: int, gutil: float, threads: int, fds: int) -> None:
        """Add a point whose fields are in the ring's own encoding already (NaN, -1: unknown), as a batch's
        columns carry them: ingest writes a point straight from those, with no None in between."""
        if not self.maxlen:
            return
        c_t, c_cpu, c_rss, c_gmem, c_gutil, c_thr, c_fds = self._cols
        n = len(c_t)
        if n < self.maxlen:
            c_t.append(t)
            c_cpu.append(cpu)
            c_rss.append(rss)
            c_gmem.append(gmem)
            c_gutil.append(gutil)
            c_thr.append(threads)
            c_fds.append(fds)
        else:  # _slot(), written out: this runs for every process every history step
            i = self._head
            self._head = i + 1 if i + 1 < n else 0
            c_t[i] = t
            c_cpu[i] = cpu
            c_rss[i] = rss
            c_gmem[i] = gmem
            c_gutil[i] = gutil
            c_thr[i] = threads
            c_fds[i] = fds
        self.last_t = t


class GpuRing(ColumnRing):
    """A GPU's readings: (t, utilisation, memory used)."""

    __slots__ = ()
    _floats = (True, True, False)

    def __init__(self, maxlen: int) -> None:
        super().__init__(maxlen, "ddq")

    def append(self, reading: Sequence) -> None:
        """Add a reading (t, utilisation, memory used; None for unknown)."""
        if not self.maxlen:
            return
        t, util, mem = reading
        c_t, c_util, c_mem = self._cols
        util = _NAN if util is None else util
        mem = -1 if mem is None else mem
        n = len(c_t)
        if n < self.maxlen:
            c_t.append(t)
            c_util.append(util)
            c_mem.append(mem)
        else:  # _slot(), written out: this runs for every GPU reading
            i = self._head
            self._head = i + 1 if i + 1 < n else 0
            c_t[i] = t
            c_util[i] = util
            c_mem[i] = mem
        self.last_t = t


class PowerRing(ColumnRing):
    """A GPU's power draw: (t, watts)."""

    __slots__ = ()
    _floats = (True, True)

    def __init__(self, maxlen: int) -> None:
        super().__init__(maxlen, "dd")

    def append(self, reading: Sequence) -> None:
        """Add a reading (t, watts; None for unknown)."""
        if not self.maxlen:
            return
        t, watts = reading
        c_t, c_w = self._cols
        watts = _NAN if watts is None else watts
        n = len(c_t)
        if n < self.maxlen:
            c_t.append(t)
            c_w.append(watts)
        else:
            i = self._head
            self._head = i + 1 if i + 1 < n else 0
            c_t[i] = t
            c_w[i] = watts
        self.last_t = t
