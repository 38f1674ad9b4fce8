"""The cyclic garbage collector's settings for the collector's heap, set once it is built."""
from __future__ import annotations

import gc

# Net allocations of container objects between two young-generation collections (CPython's default
# is 700): the collector makes many small objects a batch, which reference counting frees at once.
GC_YOUNG_THRESHOLD = 50_000


def tune_gc() -> None:
    """Make the cyclic garbage collector cheap for the collector's heap, once it is built.

    The collector keeps a large heap for hours (history, rule state, jobs) and makes many small
    objects a batch that reference counting frees at once; with CPython's defaults the cyclic
    collector scans the young objects every few batches and, every so often, the whole heap:
    about a tenth of ingest CPU (bench/bench_ingest.py). Scans 70 times rarer leave the few
    cycles the collector makes (asyncio and gRPC internals) bounded, and what exists at start-up
    (modules, the restored store) is frozen out of every scan.
    """
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 20, 20)  # the older generations half as often as by default
