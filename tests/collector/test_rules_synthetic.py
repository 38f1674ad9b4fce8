"""The engine catches every generated leak and stall in its window and stays quiet on benign runs.

Twenty seeded random draws per kind (the kinds of tests/synth_traces.py, among them the whole grid of
60-3,000 MiB/h under 0-500 MiB of noise, slow leaks under heavy noise at 30-60 s polls, staircases with
45-120 min treads, and the look-alikes: one step, two steps hours apart, a warm-up with a long tail, an
allocator cache that levels off, thread pools and fd churn), each linear leak in the window its noise
allows: rates, sizes, noise, periods and poll intervals 1–60 s
with jitter and missing polls (tests/synth_traces.py). On a failure the message lists each
failing draw (seed, poll interval, what was missed, the first false alarms).
"""
import random

import pytest
from clusterwatch.collector.rules import Engine, ProcessObservation, load_rules
from clusterwatch.collector.rules.config import MB
from clusterwatch.collector.rules.leak import LeakSeries
from clusterwatch.collector.rules.staircase import STEP_HOLD
from clusterwatch.collector.state.observations import process_from_record

from tests.synth_traces import KINDS, KINDS_BENIGN, KINDS_LEAK, check, make

RULES = load_rules()
DRAWS = 20
GB = 1024 * MB


def _run(tr):
    eng = Engine(RULES)
    out = []
    for row in tr.rows:
        out += [e.to_dict() for e in eng.observe(process_from_record(row))]
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_kind(kind):
    failures = []
    for seed in range(DRAWS):
        tr = make(kind, random.Random(f"{kind}-{seed}"))
        missed, false = check(_run(tr), tr.expect)
        if missed or false:
            failures.append((seed, tr.params["interval"], missed, false[:3]))
    assert not failures, f"{kind}: {len(failures)} of {DRAWS} draws fail: {failures}"


@pytest.mark.parametrize("kind", ["linear_leak", "noisy_flat", "util_stall", "nccl_hang", "flat"])
@pytest.mark.parametrize("interval", [1, 2, 30, 60])
def test_extreme_poll_intervals(kind, interval):
    tr = make(kind, random.Random(f"iv-{kind}-{interval}"), interval=interval)
    missed, false = check(_run(tr), tr.expect)
    assert not missed and not false, (missed, false)


def test_oom_leak_caught_well_before_the_crash():
    # The trace ends where the GPU is full (the crash). The alert must leave most of the
    # time between the leak's start and the crash, and project the crash about right.
    for seed in range(DRAWS):
        tr = make("oom_leak", random.Random(f"oom-{seed}"))
        p = tr.params
        start = p["leak_start"]
        crash = start + (80 * GB - p["base"] - p["warm_bytes"]) / p["rate"] * 3600  # GPU full
        fired = [e for e in _run(tr) if e["state"] == "firing" and e["rule"] == "gpu_memory_leak"]
        assert fired, seed
        e = fired[0]
        assert crash - e["t"] >= 0.8 * (crash - start), (seed, e["t"], start, crash)
        assert 0.5 <= e["time_to_full_s"] / (crash - e["t"]) <= 2.0, (seed, e["time_to_full_s"], crash - e["t"])
        assert e["rate_bytes_per_h"] > 0.5 * tr.params["rate"]


def test_both_entry_points_agree():
    # a row as live builds it (ProcessObservation) and as replay reads it back from a line
    # (process_from_record: the fields left out take their defaults, an index for a GPU becomes its text):
    # the same trace must give the same events.
    fields = set(ProcessObservation._fields)
    for kind in (*KINDS_LEAK, "util_stall", "nccl_hang", "ckpt_spikes", "eval_sawtooth"):
        tr = make(kind, random.Random(f"agree-{kind}"), interval=20)
        a, b = Engine(RULES), Engine(RULES)
        ev_a, ev_b = [], []
        for row in tr.rows:
            obs = {k: v for k, v in row.items() if k in fields}
            obs["gpu"] = str(obs["gpu"])
            ev_a += [e.to_dict() for e in a.observe(ProcessObservation(**obs))]
            ev_b += [e.to_dict() for e in b.observe(process_from_record(row))]
        assert ev_a == ev_b, kind
        assert any(e["state"] == "firing" for e in ev_a) == bool(tr.expect), kind


def test_series_state_is_bounded_by_the_windows_not_the_run():
    # Two days of a noisy, slowly leaking series at a 1 s poll: the lists a series keeps stay
    # within what its longest window needs, however long the process runs.
    rule = RULES.gpu_memory_leak
    s = LeakSeries(rule, 0.0)
    rng = random.Random(5)
    t = 0.0
    sizes = []
    while t < 48 * 3600:
        s.add(t, 30 * GB + rng.gauss(0, 50e6) + 20e6 * t / 3600, 80 * GB)
        t += rng.uniform(0.7, 1.3)
        if int(t) % 3600 == 0:
            sizes.append((len(s.bb), max(len(w.ks) for w in s.windows), max(len(w.diffs) for w in s.windows),
                          len(s.stairs.steps), len(s.pre_b)))
    longest = max(w.window_s for w in rule.windows) / rule.bucket_s
    assert sizes and max(x[0] for x in sizes) <= longest + 1
    assert max(x[1] for x in sizes) <= max(w.n for w in s.windows)
    assert max(x[2] for x in sizes) <= 8 * max(w.n for w in s.windows)
    # steps are STEP_HOLD buckets apart at least, kept over twice the span; the warm-up's end, once
    assert max(x[3] for x in sizes) <= 2 * (longest + 1) / STEP_HOLD + 1
    assert max(x[4] for x in sizes) <= rule.warmup_s / rule.bucket_s / 3 + 1


def test_staircase_with_long_treads_fires_at_its_third_step_and_two_steps_do_not():
    # Steps of 300 MB every 100 min on a quiet series, polled every 20 s: the staircase detector
    # fires after the third step (not the second: two steps may be unrelated, as in two_steps),
    # long before the slope windows would (each holds one step and a tread).
    rule = RULES.gpu_memory_leak
    rng = random.Random(3)

    def run(n_steps):
        s = LeakSeries(rule, 0.0)
        t, fired = 0.0, None
        while t < 12 * 3600 and fired is None:
            k = min(n_steps, max(0, int((t - 3600) // 6000) + 1)) if t >= 3600 else 0
            f = s.add(t, 30 * GB + k * 300 * MB + rng.gauss(0, 10 * MB), 80 * GB)
            if f is not None and f.firing:
                fired = f
            t += rng.uniform(14, 26)
        return fired

    f = run(3)
    assert f is not None and 3600 + 2 * 6000 <= f.t <= 3600 + 2 * 6000 + 1800, f
    assert 0.5 <= f.rate_per_h / (300 * MB / (6000 / 3600)) <= 2.0
    assert run(2) is None


def test_benign_kinds_really_are_benign():
    for kind in KINDS_BENIGN:
        assert make(kind, random.Random(0)).expect == []


@pytest.mark.parametrize("kind, seed, interval", [
    # a 174 MiB step under 40 MiB of noise, polled every 45 s: with the step 10 min old, the points
    # of a short window (medians of four minima, one straddling it) rose like a young leak
    ("small_step", 22, 45),
    # a 167 MiB step, its flat levels tilted by noise: no two point increments carried 60 % of the rise
    ("small_step", 30, 45),
    # 190 MiB of noise polled every 10 s: a 24 min window of six points rose 330 MiB by chance, t = 4.1
    # (a window that short comes round ten times as often as the 4 h one, so it must be surer)
    ("noisy_flat", 42, 10),
])
def test_lookalikes_that_once_passed_for_leaks(kind, seed, interval):
    tr = make(kind, random.Random(f"bench-{kind}-{seed}"), interval=interval)
    missed, false = check(_run(tr), tr.expect)
    assert not missed and not false, false
