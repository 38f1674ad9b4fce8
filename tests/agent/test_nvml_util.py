"""Which utilisation samples a poll takes (pure functions), across driver sample periods and clock steps."""
from __future__ import annotations

from clusterwatch.agent.backends.nvml_util import newest_by_pid, process_util, query_since

T0 = 1_700_000_000.0


def sample(pid: int, t: float, sm: int) -> tuple[int, int, int]:
    return (pid, int(t * 1e6), sm)  # (pid, timeStamp µs, smUtil %), as the source hands them over


def run(polls: list[float], visible, interval: float, hold: float = 10.0) -> list[float | None]:
    """Poll at the given wall times; `visible(t)` is the driver's buffer at t."""
    last, seen, out = 0, {}, []
    for now in polls:
        since = query_since(last, now, interval, slack_s=interval)
        buffer = [s for s in visible(now) if s[1] > since]
        fresh, last = newest_by_pid(buffer, {7}, since, now, slack_s=interval, oldest_s=hold)
        out.append(process_util({7}, fresh, seen, now, hold, answered=True)[7])
    return out


def test_a_driver_slower_than_the_poll_still_gives_every_poll_a_value() -> None:
    # One sample a second, published 0.9 s after its stamp; the agent polls twice a second.
    def visible(t: float) -> list:
        return [sample(7, T0 + k, 80) for k in range(-300, 400) if T0 + k + 0.9 <= t]

    values = run([T0 + 0.5 * i for i in range(40)], visible, interval=0.5)
    assert values[4:] == [80.0] * 36  # after the first second, never 0 (no false gpu_stall)


def test_a_first_query_skips_old_samples_and_a_later_one_reads_new_ones() -> None:
    def visible(t: float) -> list:
        return [sample(7, T0 - 120, 95)] + ([sample(7, T0 + 4.5, 30)] if t >= T0 + 5 else [])

    assert run([T0, T0 + 5], visible, interval=5.0) == [0.0, 30.0]


def test_a_clock_step_back_does_not_freeze_the_stamp() -> None:
    step = -3600.0

    def visible(t: float) -> list:
        before = [sample(7, T0 - 0.5, 40)]
        after = [sample(7, T0 + step + k - 0.5, 50 + k) for k in range(1, 6) if t >= T0 + step + k]
        return before + after

    polls = [T0] + [T0 + step + k for k in range(1, 6)]
    assert run(polls, visible, interval=1.0) == [40.0, 51.0, 52.0, 53.0, 54.0, 55.0]


def test_query_since() -> None:
    now_us = int(T0 * 1e6)
    assert query_since(0, T0, 5.0) == now_us - 5_000_000          # first: one window back
    assert query_since(0, T0, 0.2) == now_us - 1_000_000          # at least the longest sample period
    assert query_since(now_us - 30_000_000, T0, 5.0) == now_us - 30_000_000  # the last stamp taken
    assert query_since(now_us + 3600_000_000, T0, 5.0) == now_us - 5_000_000  # from the future: reset
