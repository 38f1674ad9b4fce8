"""The endpoint's parser against allocator figures of any shape: a ValueError or a report that converts."""
from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from .test_train_fuzz import FUZZ, JSON_VALUES, check

COUNTS = st.integers(min_value=-2, max_value=2**64) | st.booleans() | st.floats() | st.none() | JSON_VALUES
ENTRIES = st.fixed_dictionaries({}, optional={
    "index": COUNTS, "uuid": st.text(st.characters(blacklist_categories=()), max_size=70) | JSON_VALUES,
    "allocated": COUNTS, "reserved": COUNTS, "alloc_retries": COUNTS, "inactive_split": COUNTS,
}) | JSON_VALUES


@FUZZ
@given(st.lists(ENTRIES, max_size=18) | JSON_VALUES)
def test_any_gpu_field(gpu: object) -> None:
    check(json.dumps({"v": 1, "step": 1, "gpu": gpu}, allow_nan=True).encode())
