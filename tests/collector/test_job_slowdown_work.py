"""job_slowdown in tokens or samples per second, where the job counts its work (tests/support/slowdown_traces.py):
a slowdown in tokens/s, a batch that doubles (steps/s halves, tokens/s holds) and is none, sequences that halve
(steps/s holds, tokens/s falls), a rank that counts and one that does not, and counts that are hostile: NaN,
negative, huge, going backwards, stopping."""
from __future__ import annotations

import math

import pytest
from clusterwatch.collector.rules import load_rules
from clusterwatch.collector.rules.model import ProcessObservation
from clusterwatch.collector.state.cluster import ClusterState, ProcessSeries, process_history
from clusterwatch.collector.state.observations import node_observations
from clusterwatch.collector.state.work_counts import work_counts

from clusterwatch.model import ProcessKey, ProcessSample, TrainingReport
from tests.support.slowdown_traces import TOKENS_PER_STEP, Scenario, Trace, generate

RULES = load_rules()


def _fired(trace: Trace) -> list:
    return [e for e in trace.run(RULES) if e.rule == "job_slowdown" and e.state == "firing"]


def _counts(trace: Trace, change) -> Trace:
    """The trace with each process line's token count `change(t, count)`d."""
    trace.observations = [o._replace(tokens=change(o.t, o.tokens))
                          if isinstance(o, ProcessObservation) and o.tokens is not None else o
                          for o in trace.observations]
    return trace


@pytest.mark.parametrize("every", [5.0, 300.0, 900.0])  # every poll; a framework's log every 5 or 15 minutes
def test_a_slowdown_in_tokens_fires_in_tokens_per_second(every: float) -> None:
    sc = Scenario("tokens", culprit="gpu_clocks", drop=0.3, work="tokens", work_every_s=every, culprit_rank=1)
    fired = _fired(generate(sc))
    assert len(fired) == 1, fired
    e = fired[0]
    assert sc.start_s < e.t <= sc.start_s + 900
    f = e.figures
    assert f["unit"] == "tokens" and f["cause"] == "gpu_clocks" and f["cause_rank"] == 1
    assert f["baseline_per_s"] == pytest.approx(2.0 * TOKENS_PER_STEP, rel=0.05)
    assert f["drop_percent"] == pytest.approx(30, abs=6)
    assert sc.start_s - 300 <= f["since"] <= sc.start_s + 120
    # "... 30 % slower than it did in tokens/s: 45.9k tokens/s for 10 min, against a steady 65.5k tokens/s"
    assert " % slower than it did in tokens/s: " in e.description, e.description
    assert f"{f['rate_per_s'] / 1000:.3g}k tokens/s for " in e.description, e.description
    assert f"against a steady {f['baseline_per_s'] / 1000:.3g}k tokens/s" in e.description, e.description


@pytest.mark.parametrize("every", [5.0, 300.0, 900.0])
def test_a_batch_that_doubles_is_no_slowdown_where_tokens_are_counted(every: float) -> None:
    for seed in range(2):
        sc = Scenario("batch", lookalike="batch_doubles", work="tokens", work_every_s=every, seed=seed)
        assert _fired(generate(sc)) == []


def test_judged_in_steps_the_same_batch_change_reads_as_a_slowdown() -> None:
    """What the tokens spare the job: its steps/s halves where the batch doubles."""
    fired = _fired(generate(Scenario("batch", lookalike="batch_doubles")))
    assert len(fired) == 1 and fired[0].figures["unit"] == "steps"
    assert "slower than it did: " in fired[0].description and "steps/s" in fired[0].description


def test_sequences_that_halve_are_a_fall_in_tokens_that_steps_do_not_see() -> None:
    assert _fired(generate(Scenario("shorter", lookalike="shorter"))) == []
    fired = _fired(generate(Scenario("shorter", lookalike="shorter", work="tokens", work_every_s=60.0)))
    assert len(fired) == 1 and fired[0].figures["unit"] == "tokens"
    assert fired[0].figures["drop_percent"] == pytest.approx(50, abs=6)


def test_samples_where_no_tokens_are_counted() -> None:
    assert _fired(generate(Scenario("batch", lookalike="batch_doubles", work="samples", work_every_s=60.0))) == []
    fired = _fired(generate(Scenario("slow", culprit="none", drop=0.35, work="samples", work_every_s=60.0)))
    assert len(fired) == 1 and fired[0].figures["unit"] == "samples"
    assert fired[0].figures["baseline_per_s"] == pytest.approx(16.0, rel=0.05)  # 2 steps/s of 8 samples
    assert "samples/s" in fired[0].description


def test_a_rank_that_counts_takes_the_lead_from_one_that_does_not() -> None:
    """Rank 0 steps first and counts nothing; rank 1 counts tokens: the job is judged in rank 1's tokens."""
    assert _fired(generate(Scenario("batch", lookalike="batch_doubles", work="tokens", work_ranks=(1,)))) == []
    fired = _fired(generate(Scenario("slow", culprit="gpu_clocks", drop=0.3, work="tokens", work_ranks=(1,))))
    assert len(fired) == 1 and fired[0].figures["unit"] == "tokens"


@pytest.mark.parametrize("bad", [math.nan, -5.0, math.inf, 1e300, "many", True])
def test_hostile_counts_are_passed_over(bad) -> None:
    """A count that is no count (NaN, negative, infinite, past any run, not a number) on one line in seven changes
    nothing: the batch change stays quiet, the slowdown fires in tokens."""
    def spoil(t: float, count: float) -> object:
        return bad if int(t / 5) % 7 == 3 else count

    batch = _counts(generate(Scenario("batch", lookalike="batch_doubles", work="tokens", work_every_s=60.0)), spoil)
    assert _fired(batch) == []
    slow = _counts(generate(Scenario("slow", culprit="gpu_clocks", drop=0.3, work="tokens")), spoil)
    fired = _fired(slow)
    assert len(fired) == 1 and fired[0].figures["unit"] == "tokens"


@pytest.mark.parametrize("every", [5.0, 900.0])
def test_a_count_that_goes_backwards_begins_again(every: float) -> None:
    """A restart from a checkpoint saved before the count (or a framework that counts from 0 again): the span
    across the fall measures nothing, the counts after it go on."""
    def restarted(trace: Trace) -> Trace:
        before = max(o.tokens for o in trace.observations if isinstance(o, ProcessObservation) and o.t < 3000.0)
        # the counts reported after 3000 s count from about 0 again (1.7e8 tokens by then)
        return _counts(trace, lambda t, count: count - 1.5e8 if count > before else count)

    batch = Scenario("batch", lookalike="batch_doubles", work="tokens", work_every_s=every)
    assert _fired(restarted(generate(batch))) == []
    slow = restarted(generate(Scenario("slow", culprit="gpu_clocks", drop=0.3, work="tokens", work_every_s=every)))
    fired = _fired(slow)
    assert len(fired) == 1 and fired[0].figures["unit"] == "tokens"


def test_counts_that_stop_while_the_steps_go_on_are_judged_in_steps_again() -> None:
    def stop(t: float, count: float) -> float | None:
        return None if t >= 3000.0 else count

    fired = _fired(_counts(generate(Scenario("slow", culprit="gpu_clocks", drop=0.3, work="tokens")), stop))
    assert len(fired) == 1 and fired[0].figures["unit"] == "steps"


def test_the_names_a_report_counts_its_work_by() -> None:
    assert work_counts({"tokens": 5e6, "loss": 1.0}, None, None) == (5e6, None)
    assert work_counts({"num_input_tokens_seen": 4096}, None, 7.0) == (4096.0, 7.0)  # the Hugging Face Trainer's
    assert work_counts({"samples": 64}, 10.0, None) == (10.0, 64.0)
    for bad in (math.nan, -1.0, math.inf, 1e19, True):
        assert work_counts({"tokens": bad, "samples": bad}, 3.0, 4.0) == (3.0, 4.0), bad
    assert work_counts({"tokens_per_s": 4e4}, None, None) == (None, None)  # a rate is not a count


def test_a_reported_count_reaches_the_observation_and_leaves_the_sample_count_alone() -> None:
    """From a training report's metrics to the process's observation (collector/state): the count of polls the
    series holds (`samples`) is another thing than the samples a job trained on."""
    state = ClusterState()
    key = ProcessKey("n1", 11, 100.0)
    series = state.processes[key] = ProcessSeries(key, ProcessSample(200.0, "n1", 11, 100.0, job_id="7"),
                                                  process_history(720), samples=5)
    state.add_training("n1", TrainingReport(200.0, 11, 100.0, step=40, metrics={"tokens": 1.5e6, "samples": 320,
                                                                               "loss": 2.0}))
    state.add_training("n1", TrainingReport(201.0, 11, 100.0, step=41, metrics={"tokens": math.nan}))
    assert series.samples == 5
    obs = node_observations(state, "n1", [series], {}, 201.0, 0.0).processes[0]
    assert (obs.step, obs.tokens, obs.samples) == (41, 1.5e6, 320.0)
