"""The training endpoint's parser against any input: it refuses with ValueError or returns a report that converts.

One report the protobuf message could not carry (a lone surrogate in a tag) made every agent poll that
drained it fail; these properties say no datagram can do that again.
"""
from __future__ import annotations

import json
import math

from clusterwatch.agent.train_endpoint import parse_datagram
from clusterwatch.v1 import agent_pb2
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from clusterwatch.train import MAX_DATAGRAM, MAX_METRICS, MAX_NAME, MAX_TAG_VALUE
from clusterwatch.wire import training_from_proto, training_to_proto

# every code point, lone surrogates included (hypothesis leaves them out of text() by default)
ANY_CHAR = st.characters(blacklist_categories=())
ANY_TEXT = st.text(ANY_CHAR, max_size=80)
SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(min_value=-2**64, max_value=2**64)
           | st.floats(allow_nan=True, allow_infinity=True) | ANY_TEXT)
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(ANY_TEXT, inner, max_size=4), max_leaves=12)
# near-valid reports, so that the accepting paths are explored too, not only the refusals
NAMES = st.text(ANY_CHAR, min_size=0, max_size=MAX_NAME + 2) | st.sampled_from(["loss", "acc", "café", "\ud800"])
REPORTS = st.fixed_dictionaries(
    {"v": st.sampled_from([1, 1, 1, 1.0, True, 2, "1"])},
    optional={
        "step": st.integers(min_value=-2, max_value=2**64) | st.booleans() | st.floats() | st.none(),
        "loss": SCALARS, "lr": SCALARS, "epoch": SCALARS,
        "m": st.dictionaries(NAMES, st.floats() | st.integers(min_value=-2**64, max_value=2**64) | JSON_VALUES,
                             max_size=MAX_METRICS + 1),
        "tags": st.dictionaries(NAMES, st.text(ANY_CHAR, max_size=MAX_TAG_VALUE + 1) | JSON_VALUES,
                                max_size=MAX_METRICS + 1),
        "pid": JSON_VALUES,
    })


def check(data: bytes) -> None:
    """parse_datagram refuses with ValueError only; what it returns converts to the message and back."""
    try:
        report = parse_datagram(data, 4242, 1_795_989_241.37, 1_795_999_999.5)
    except ValueError:
        return
    msg = agent_pb2.TrainingSample()
    training_to_proto(report, msg)  # the conversion that failed inside the agent's poll
    back = training_from_proto(agent_pb2.TrainingSample.FromString(msg.SerializeToString()))
    assert back == report
    assert (report.pid, report.start_time) == (4242, 1_795_989_241.37)  # identity from the kernel only
    assert len(report.metrics) <= MAX_METRICS and len(report.tags) <= MAX_METRICS
    assert all(0 < len(k) <= MAX_NAME for k in [*report.metrics, *report.tags])
    assert all(len(v) <= MAX_TAG_VALUE for v in report.tags.values())
    assert all(math.isfinite(v) for v in [*report.metrics.values(), report.loss or 0, report.lr or 0,
                                          report.epoch or 0])


def encoded(obj: object) -> bytes:
    # json.dumps writes a lone surrogate as the escape "\ud800", as a hostile sender would
    return json.dumps(obj, allow_nan=True).encode()


FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.binary(max_size=MAX_DATAGRAM + 8))
@example(b'{"v":1,"tags":{"x":"\\ud800"}}')
@example(b"[" * 3000 + b"]" * 3000)
@example(b'{"v":1,"step":' + b"9" * 5000 + b"}")
def test_any_bytes(data: bytes) -> None:
    check(data)


@FUZZ
@given(JSON_VALUES)
def test_any_json_value(value: object) -> None:
    check(encoded(value))


@FUZZ
@given(REPORTS)
def test_any_report_shaped_object(obj: dict) -> None:
    check(encoded(obj))


def test_the_datagram_of_the_issue_and_its_kin_are_refused() -> None:
    for bad in (b'{"v":1,"tags":{"x":"\\ud800"}}', b'{"v":1,"tags":{"\\udfff":"x"}}',
                b'{"v":1,"m":{"\\ud800":1}}', b'{"v":1,"m":{"":1}}', b'{"v":true,"step":1}',
                b"[" * 3000 + b"]" * 3000):
        try:
            parse_datagram(bad, 1, 0.0, 0.0)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad[:40]!r}")
    ok = parse_datagram('{"v":1,"tags":{"café":"naïve ☃"},"m":{"µ":1}}'.encode(), 1, 0.0, 0.0)
    assert ok.tags == {"café": "naïve ☃"} and ok.metrics == {"µ": 1.0}  # valid Unicode stays welcome
