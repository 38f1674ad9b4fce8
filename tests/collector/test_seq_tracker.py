"""collector/state/core.py SeqTracker: the batch numbers a collector has applied, each once."""
from __future__ import annotations

from clusterwatch.collector.state.core import SeqTracker
from hypothesis import given
from hypothesis import strategies as st


@given(st.lists(st.integers(min_value=1, max_value=200), max_size=300))
def test_seq_tracker_stores_each_number_once(seqs):
    t = SeqTracker()
    fresh = [s for s in seqs if t.add(s)]
    assert sorted(fresh) == sorted(set(seqs))
    assert all(n > t.low for n in t.above)
