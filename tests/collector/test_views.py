"""collector/queries/views.py: resampled history for the views."""
from __future__ import annotations

from clusterwatch.collector.queries.views import resample
from hypothesis import given
from hypothesis import strategies as st


@given(st.lists(st.floats(allow_nan=False), max_size=200), st.integers(min_value=2, max_value=50))
def test_resample_keeps_the_ends_and_the_bound(values, points):
    out = resample(values, points)
    assert len(out) == min(len(values), points)
    if values:
        assert out[0] == values[0] and out[-1] == values[-1]
