"""Synthetic traces of every behaviour the leak and stall rules must tell apart.

`make(kind, rng)` draws one trace of a kind with random rates, sizes, noise,
periods and poll intervals (1–60 s, jittered, with missing polls) and returns
its samples (dicts in the trace format, time order) and the alerts it must raise:
(rules, node, pid, after, before). Benign kinds expect nothing.

A linear leak's window is what its noise allows (`noise_bound_h`, derived in docs/rules.md,
"How fast a leak can be told"), with margin: `WINDOW_MARGIN` times the bound and `WINDOW_GRACE`.
`grid_leak` draws the whole grid: 60–3,000 MiB/h under 0–500 MiB of noise a sample.
"""
from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass

MB = 1024 * 1024
GB = 1024 * MB
H = 3600.0
#: The slope test's significance the bound is taken at (the rule's `min_t_stat`).
BOUND_Z = 4.0
#: The least growth that is a leak (the rule's `min_growth_mb`): on a quiet series it, not the noise,
#: decides how soon a slow leak can be told.
LEAST_GROWTH = 32 * MB
#: A linear leak's window: this many times its bound, and WINDOW_GRACE more (the rule analyses a
#: window at its points' ends and asks a little more of shorter windows than the bound's z).
WINDOW_MARGIN = 2.0
#: The least growth of a thread or fd count that is a leak (handle_leak's `min_growth`).
LEAST_HANDLES = 50
WINDOW_GRACE = 0.5 * H


@dataclass
class Expect:
    """An alert that must fire for (node, pid) with one of `rules`, in [after, before]."""

    rules: tuple[str, ...]
    node: str
    pid: int
    after: float
    before: float


@dataclass
class Trace:
    """A generated trace: samples in time order and what must fire."""

    kind: str
    rows: list[dict]
    expect: list[Expect]
    params: dict


def _poll_times(rng: random.Random, duration: float, interval: float) -> list[float]:
    """Poll times with ±30 % jitter and ~2 % missing polls (sometimes a run of them)."""
    out, t = [], 0.0
    while t <= duration:
        if rng.random() > 0.02:
            out.append(round(t, 3))
        t += interval * rng.uniform(0.7, 1.3)
    return out


def _series(rng: random.Random, kind: str, p: dict) -> tuple[Callable[[float], float],
                                                               Callable[[float], float],
                                                               Callable[[float], float],
                                                               Callable[[float], int | None]]:
    base = p["base"]
    noise = p["noise"]
    rss0 = 6 * GB

    def warm(t: float) -> float:
        # The caching allocator grows in steps during the first minutes, then stops.
        w_end, w_size, steps = p["warm_s"], p["warm_bytes"], p["warm_steps"]
        return w_size * min(steps, math.floor(t / (w_end / steps))) / steps if t < w_end else w_size

    def leak(t: float) -> float:
        start, rate = p.get("leak_start", math.inf), p.get("rate", 0.0)
        if t < start:
            return 0.0
        if kind in ("staircase_leak", "long_tread_staircase"):
            per = p["period"]
            return math.floor((t - start) / per + 1) * rate * per / H
        return rate * (t - start) / H

    def tail(t: float) -> float:
        # A warm-up that does not stop at once: after its steps the reserve creeps up a little
        # more, ever slower (an exponential approach to its final size).
        if "tail_bytes" not in p or t < p["warm_s"]:
            return 0.0
        return p["tail_bytes"] * (1.0 - math.exp(-(t - p["warm_s"]) / p["tail_tau"]))

    def gpu_mem(t: float) -> float:
        v = base + warm(t) + tail(t) + rng.gauss(0, noise)
        if kind in ("linear_leak", "noisy_leak", "staircase_leak", "fast_leak", "oom_leak", "warmup_then_leak",
                    "rank_leak", "slow_noisy_leak", "long_tread_staircase", "grid_leak"):
            v += leak(t)
        if kind in ("one_step", "small_step") and t >= p["step_at"]:
            v += p["step_bytes"]
        if kind == "two_steps":
            v += p["step_bytes"] * (t >= p["step_at"]) + p["step2_bytes"] * (t >= p["step2_at"])
        if kind == "eval_sawtooth" and (t % p["period"]) >= p["period"] - p["eval_s"]:
            v += p["eval_bytes"]
        if kind == "cache_levels_off":
            v += sum(b for a, b in zip(p["cache_at"], p["cache_bytes"], strict=True) if t >= a)
        if kind == "ckpt_spikes" and (t % p["period"]) < p["ckpt_s"] and rng.random() < 0.3:
            v += p["spike_bytes"]
        return max(0.0, v)

    def rss(t: float) -> float:
        v = rss0 + rng.gauss(0, 10 * MB)
        if kind == "host_leak":
            v += leak(t)
        return v

    def util(t: float) -> float:
        if kind == "util_stall" and t >= p["stall_at"]:
            return 0.0
        if kind == "nccl_hang" and t >= p["stall_at"]:
            return min(100.0, rng.uniform(97, 101))
        if kind == "ckpt_spikes" and (t % p["period"]) < p["ckpt_s"]:
            return 0.0
        if kind == "eval_sawtooth" and (t % p["period"]) >= p["period"] - p["eval_s"]:
            return rng.uniform(50, 65)
        return min(100.0, rng.uniform(88, 99))

    speed = rng.uniform(0.5, 2.0)

    def step(t: float) -> int | None:
        if kind in ("util_stall", "nccl_hang") and t >= p["stall_at"]:
            return int(p["stall_at"] * speed)
        return int(t * speed)

    return gpu_mem, rss, util, step


def bucket_noise(rows: list[dict], node: str, pid: int, field: str, bucket_s: float = 60.0) -> float:
    """Trend-free noise of a series' bucket minima, as the rule measures it (MAD of consecutive ones / sqrt 2);
    nan with too few buckets."""
    lows: dict[int, float] = {}
    for r in rows:
        if r["node"] == node and r["pid"] == pid and field in r:
            k = int(r["t"] // bucket_s)
            v = r[field]
            if v < lows.get(k, math.inf):
                lows[k] = v
    ks = sorted(lows)
    d = [lows[b] - lows[a] for a, b in zip(ks, ks[1:], strict=False) if b == a + 1]
    if len(d) < 10:
        return float("nan")
    m = statistics.median(d)
    return 1.4826 * statistics.median([abs(v - m) for v in d]) / math.sqrt(2.0)


def noise_bound_h(rate: float, noise: float, z: float = BOUND_Z, least_growth: float = LEAST_GROWTH) -> float:
    """The least delay, in hours, at which a leak of `rate` (bytes/h) can be told under bucket-minimum noise `noise`.

    A slope r under noise s, one bucket minimum a minute, is z standard errors above zero after
    D = (z s sqrt(12 / 60) / r) ** (2 / 3) hours of growth (least squares on 60 D points: se =
    s sqrt(12 / (60 D^3))); no slope test at that z can fire sooner. Nor before the leak has grown
    `least_growth`, the least growth that is a leak, which bounds slow leaks on quiet series.
    """
    return max((z * noise * math.sqrt(12 / 60) / rate) ** (2 / 3), least_growth / rate)


KINDS_BENIGN = ("flat", "warmup_plateau", "eval_sawtooth", "one_step", "noisy_flat", "ckpt_spikes",
                "small_step", "warmup_long_tail", "two_steps", "cache_levels_off", "handle_churn")
KINDS_LEAK = ("linear_leak", "noisy_leak", "staircase_leak", "fast_leak", "oom_leak", "warmup_then_leak",
              "host_leak", "rank_leak", "handle_leak", "slow_noisy_leak", "long_tread_staircase", "grid_leak")
#: Leaks of one rate whose window is what their noise allows (WINDOW_MARGIN times noise_bound_h, and WINDOW_GRACE).
KINDS_BOUND = ("linear_leak", "noisy_leak", "slow_noisy_leak", "grid_leak", "fast_leak", "warmup_then_leak",
               "host_leak", "rank_leak")
KINDS_STALL = ("util_stall", "nccl_hang")
KINDS = KINDS_BENIGN + KINDS_LEAK + KINDS_STALL


def make(kind: str, rng: random.Random, interval: float | None = None, hours: float | None = None) -> Trace:
    """Draw one trace of `kind`.

    Args:
        kind: One of KINDS.
        rng: Random source (seed it for a reproducible trace).
        interval: Mean poll interval in seconds; drawn from 1–60 s when None.
        hours: Length of a benign trace (a soak's process-day is 24); the kind's own when None.

    Returns:
        The trace and the alerts it must raise.
    """
    if interval is not None:
        iv = interval
    elif kind == "slow_noisy_leak":  # the hard case: few samples a bucket, so little to average the noise over
        iv = rng.choice([30, 45, 60])
    else:
        iv = rng.choice([1, 5, 10, 15, 20, 30, 45, 60])
    p: dict = {
        "interval": iv,
        "base": rng.uniform(15, 60) * GB,
        "noise": rng.uniform(5, 40) * MB,
        "warm_s": rng.uniform(8, 25) * 60,
        "warm_bytes": rng.uniform(1, 6) * GB,
        "warm_steps": rng.randint(3, 7),
    }
    duration = 8 * H
    if kind == "flat":
        p["warm_bytes"] = 0.0
    elif kind == "warmup_plateau":
        pass
    elif kind == "noisy_flat":
        p["noise"] = rng.uniform(150, 400) * MB
    elif kind == "eval_sawtooth":
        p.update(period=rng.uniform(25, 120) * 60, eval_s=rng.uniform(3, 20) * 60, eval_bytes=rng.uniform(1, 5) * GB)
    elif kind == "one_step":
        p.update(step_at=rng.uniform(1.5, 5) * H, step_bytes=rng.uniform(1, 8) * GB)
    elif kind == "small_step":
        # One step of the size of a staircase's steps (below): one step, then flat, is no leak.
        p.update(step_at=rng.uniform(1.5, 5) * H, step_bytes=rng.uniform(150, 600) * MB)
    elif kind == "two_steps":
        # Two unrelated steps hours apart (a larger batch, later a larger eval set): two is not a
        # staircase; the staircase's treads (below) are at most 2 h, these gaps at least 3 h.
        p.update(step_at=rng.uniform(1, 2) * H, step_bytes=rng.uniform(150, 2000) * MB,
                 step2_bytes=rng.uniform(150, 2000) * MB)
        p["step2_at"] = p["step_at"] + rng.uniform(3, 6) * H
        duration = 10 * H
    elif kind == "warmup_long_tail":
        # After the warm-up's steps the reserve creeps on, ever slower (time constant 6-15 min), for
        # up to an hour: still growing at up to a few GB/h when the rule's 30 min warm-up ends, but
        # bending over, visibly, within any window.
        p.update(tail_bytes=rng.uniform(0.3, 1.5) * GB, tail_tau=rng.uniform(6, 15) * 60)
    elif kind == "cache_levels_off":
        # The allocator's cache grows as ever larger shapes turn up, ever more rarely, and levels off: steps
        # of 100-500 MB, each gap 1.6-2.5x the last and each step 0.5-0.8x, from 30-90 min on.
        first, gap, size = rng.uniform(0.5, 1.5) * H, rng.uniform(0.5, 1.5) * H, rng.uniform(100, 500) * MB
        growth, shrink, at, sizes = rng.uniform(1.6, 2.5), rng.uniform(0.5, 0.8), [], []
        t = first
        while t < 48 * H:
            at.append(t)
            sizes.append(size)
            t, gap, size = t + gap, gap * growth, size * shrink
        p.update(cache_at=at, cache_bytes=sizes)
    elif kind == "ckpt_spikes":
        p.update(period=rng.uniform(30, 90) * 60, ckpt_s=rng.uniform(60, 300), spike_bytes=rng.uniform(0.5, 5) * GB)
    elif kind in ("linear_leak", "rank_leak"):
        p.update(leak_start=rng.uniform(0.75, 1.5) * H, rate=rng.uniform(100, 600) * MB)
    elif kind == "noisy_leak":
        p.update(leak_start=rng.uniform(0.75, 1.5) * H, rate=rng.uniform(200, 500) * MB,
                 noise=rng.uniform(100, 250) * MB)
    elif kind == "staircase_leak":
        p.update(leak_start=rng.uniform(0.75, 1.5) * H, rate=rng.uniform(120, 400) * MB,
                 period=rng.uniform(20, 60) * 60)
        duration = 10 * H
    elif kind == "slow_noisy_leak":
        # A slow leak under heavy noise (drawn above at 30-60 s polls): 60-300 MB/h under 80-500 MB.
        p.update(leak_start=rng.uniform(0.75, 1.5) * H, rate=rng.uniform(60, 300) * MB,
                 noise=rng.uniform(80, 500) * MB)
    elif kind == "grid_leak":
        # The whole grid: 60-3,000 MB/h (even on a log scale) under 0-500 MB of noise a sample.
        p.update(leak_start=rng.uniform(0.75, 1.5) * H, rate=math.exp(rng.uniform(math.log(60), math.log(3000))) * MB,
                 noise=rng.uniform(0, 500) * MB)
    elif kind == "long_tread_staircase":
        # Steps of 150-600 MB every 45-120 min, flat in between; the first at leak_start.
        period = rng.uniform(45, 120) * 60
        p.update(leak_start=rng.uniform(0.75, 1.5) * H, period=period,
                 rate=rng.uniform(150, 600) * MB * H / period)
        duration = p["leak_start"] + 2 * period + 2 * H
    elif kind == "fast_leak":
        p.update(leak_start=rng.uniform(0.75, 1.5) * H, rate=rng.uniform(2, 6) * GB)
        duration = p["leak_start"] + 2 * H
    elif kind == "oom_leak":
        p.update(leak_start=rng.uniform(0.75, 1.5) * H, rate=rng.uniform(1.5, 4) * GB)
        p["base"] = 60 * GB
        duration = p["leak_start"] + (80 * GB - 60 * GB - p["warm_bytes"]) / p["rate"] * H
    elif kind == "warmup_then_leak":
        p.update(leak_start=rng.uniform(1.25, 2) * H, rate=rng.uniform(100, 400) * MB)
    elif kind == "host_leak":
        p.update(leak_start=rng.uniform(0.75, 1.5) * H, rate=rng.uniform(150, 800) * MB)
    elif kind in KINDS_STALL:
        p.update(stall_at=rng.uniform(1, 4) * H)
        duration = p["stall_at"] + 1 * H
    elif kind == "handle_leak":
        # Threads or open fds, 60-600 an hour, from half an hour on.
        p.update(leak_start=0.5 * H, handle=rng.choice(["threads", "open_fds"]), rate=rng.uniform(60, 600))
    elif kind == "handle_churn":
        # A thread pool that spins up (20-200 threads over 1-10 min, sometime in the first 3 h) and data-loader
        # workers that each epoch (20-90 min) open 50-300 files and close them at its end.
        p.update(pool_at=rng.uniform(0.5, 3) * H, pool_s=rng.uniform(60, 600), pool_size=rng.randint(20, 200),
                 epoch=rng.uniform(20, 90) * 60, epoch_fds=rng.randint(50, 300), epoch_open=rng.uniform(0.5, 0.9))
    else:
        raise ValueError(f"unknown kind {kind!r}")
    if iv <= 5:  # keep the test suite quick: fine polls, shorter traces
        duration = min(duration, 6 * H if kind not in ("staircase_leak", "long_tread_staircase", "two_steps")
                       else 8 * H)
    if hours is not None and kind in KINDS_BENIGN:
        duration = hours * H
    if kind in KINDS_BOUND:
        # Long enough for the window its noise allows: a sample's noise bounds its bucket minimum's.
        noise = 10 * MB if kind == "host_leak" else p["noise"]
        need = p["leak_start"] + WINDOW_MARGIN * noise_bound_h(p["rate"], noise) * H + WINDOW_GRACE + 0.25 * H
        duration = need if kind in ("slow_noisy_leak", "grid_leak", "fast_leak") else max(duration, need)

    nranks = 4 if kind == "rank_leak" else 1
    leaker = rng.randrange(nranks)
    rows: list[dict] = []
    expect: list[Expect] = []
    per_rank = []
    for r in range(nranks):
        node = f"gpu{101 + r // 2:03d}"
        pid = 50000 + r
        rk = kind if (kind != "rank_leak" or r == leaker) else "flat_after_warm"
        fns = _series(rng, "rank_leak" if rk == "rank_leak" else ("flat" if rk == "flat_after_warm" else kind), p)
        times = _poll_times(rng, duration, iv)
        per_rank.append((node, pid, r, fns, times))
    for node, pid, r, (gm, rs, ut, st), times in per_rank:
        for t in times:
            row = {"t": t, "node": node, "job_id": "7001", "pid": pid, "gpu": r % 2, "rank": r,
                   "gpu_mem_bytes": int(gm(t)), "gpu_util": round(ut(t), 1), "cpu_percent": 100.0,
                   "rss_bytes": int(rs(t)), "step": st(t)}
            if kind == "oom_leak":
                row["gpu_mem_total_bytes"] = 80 * GB
            if kind == "handle_leak":
                grown = int((t - p["leak_start"]) / H * p["rate"]) if t > p["leak_start"] else 0
                row["threads"] = 40 + (grown if p["handle"] == "threads" else 0)
                row["open_fds"] = 120 + (grown if p["handle"] == "open_fds" else 0)
            if kind == "handle_churn":
                ramp = min(1.0, max(0.0, (t - p["pool_at"]) / p["pool_s"]))
                row["threads"] = 40 + int(ramp * p["pool_size"])
                row["open_fds"] = 120 + (p["epoch_fds"] if (t % p["epoch"]) < p["epoch_open"] * p["epoch"] else 0)
            rows.append(row)
    rows.sort(key=lambda r: r["t"])
    node0, pid0 = per_rank[leaker][0], per_rank[leaker][1]
    ls = p.get("leak_start", 0.0)
    if kind in KINDS_BOUND:
        # What the noise allows, as the rule measures the noise (on this trace's own bucket minima), with margin.
        rule, field = (("host_memory_leak",), "rss_bytes") if kind == "host_leak" else (("gpu_memory_leak",),
                                                                                      "gpu_mem_bytes")
        s = bucket_noise(rows, node0, pid0, field)
        p["bound_h"] = noise_bound_h(p["rate"], s)
        expect.append(Expect(rule, node0, pid0, ls, ls + WINDOW_MARGIN * p["bound_h"] * H + WINDOW_GRACE))
    elif kind == "staircase_leak":
        expect.append(Expect(("gpu_memory_leak",), node0, pid0, ls, ls + 6 * H))
    elif kind == "long_tread_staircase":
        # A careful reader calls a staircase at its third step (two steps could be two unrelated
        # events, as in two_steps): the third comes 2 periods after the first; an hour's grace.
        expect.append(Expect(("gpu_memory_leak",), node0, pid0, ls, ls + 2 * p["period"] + 1 * H))
    elif kind == "oom_leak":
        expect.append(Expect(("gpu_memory_leak",), node0, pid0, ls, ls + 1 * H))
    elif kind == "util_stall":
        expect.append(Expect(("gpu_stall", "training_stall"), node0, pid0, p["stall_at"], p["stall_at"] + 600))
    elif kind == "nccl_hang":
        expect.append(Expect(("training_stall",), node0, pid0, p["stall_at"], p["stall_at"] + 600))
    elif kind == "handle_leak":
        # A count has no noise to wait out: the least it can be told at is when it has grown LEAST_HANDLES.
        p["bound_h"] = LEAST_HANDLES / p["rate"]
        expect.append(Expect(("handle_leak",), node0, pid0, ls, ls + WINDOW_MARGIN * p["bound_h"] * H + WINDOW_GRACE))
    return Trace(kind, rows, expect, p)


def check(events: list[dict], expect: list[Expect]) -> tuple[list[Expect], list[tuple]]:
    """Score events the way score.py does.

    Args:
        events: Alert events as dicts.
        expect: What must fire.

    Returns:
        (expected alerts not caught in their window, false alarms as (rule, node, pid, t)).
    """
    firing = [e for e in events if e["state"] == "firing"]
    missed = [x for x in expect if not any(
        e["rule"] in x.rules and e["node"] == x.node and e["pid"] == x.pid and x.after <= e["t"] <= x.before
        for e in firing)]
    false = [(e["rule"], e["node"], e["pid"], e["t"]) for e in firing if not any(
        e["rule"] in x.rules and e["node"] == x.node and e["pid"] == x.pid and e["t"] >= x.after for x in expect)]
    return missed, false
