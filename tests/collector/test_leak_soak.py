"""A day of every benign behaviour, at a fine, a middle and a coarse poll, raises nothing.

The generated draws of test_rules_synthetic last 8-10 hours; a false alarm a few times a month per
process needs whole days to show, and the look-alikes that grow on (the allocator's cache as ever
larger shapes turn up, two unrelated steps hours apart) show their worst late. The full soak
(over 1,000 process-days) is `bench/bench_detection.py --soak`.
"""
import random

import pytest
from clusterwatch.collector.rules import Engine, load_rules
from clusterwatch.collector.state.observations import process_from_record

from tests.synth_traces import KINDS_BENIGN, make

RULES = load_rules()


@pytest.mark.parametrize("kind", KINDS_BENIGN)
def test_a_benign_day_raises_nothing(kind):
    fired = []
    for interval in (5, 20, 60):
        tr = make(kind, random.Random(f"soak-test-{kind}-{interval}"), interval=interval, hours=24)
        assert tr.rows[-1]["t"] > 23.5 * 3600 and not tr.expect
        eng = Engine(RULES)
        for row in tr.rows:
            fired += [(interval, e.rule, round(e.t)) for e in eng.observe(process_from_record(row))
                      if e.state == "firing"]
    assert not fired, fired
