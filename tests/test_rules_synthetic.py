"""The engine catches every generated leak and stall in its window and stays quiet on benign runs.

Many seeded random draws per kind: rates, sizes, noise, periods and poll intervals 1–60 s
with jitter and missing polls (tests/synth_traces.py).
"""
import random

import pytest
from clusterwatch.collector.rules import Engine, load_rules

from .synth_traces import KINDS, KINDS_BENIGN, check, make

RULES = load_rules()
DRAWS = 6


def _run(tr):
    eng = Engine(RULES)
    out = []
    for row in tr.rows:
        out += [e.to_dict() for e in eng.observe_mapping(row)]
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_kind(kind):
    failures = []
    for seed in range(DRAWS):
        tr = make(kind, random.Random(f"{kind}-{seed}"))
        missed, false = check(_run(tr), tr.expect)
        if missed or false:
            failures.append((seed, tr.params["interval"], missed, false[:3]))
    assert not failures, f"{kind}: {failures}"


@pytest.mark.parametrize("kind", ["linear_leak", "util_stall", "nccl_hang", "flat"])
@pytest.mark.parametrize("interval", [1, 60])
def test_extreme_poll_intervals(kind, interval):
    tr = make(kind, random.Random(f"iv-{kind}-{interval}"), interval=interval)
    missed, false = check(_run(tr), tr.expect)
    assert not missed and not false, (missed, false)


def test_benign_kinds_really_are_benign():
    for kind in KINDS_BENIGN:
        assert make(kind, random.Random(0)).expect == []
