"""collector/ingest/service.py TokenBucket: a stream's rate limit."""
from __future__ import annotations

from clusterwatch.collector.ingest.service import TokenBucket


def test_token_bucket_allows_the_rate_and_delays_beyond():
    b = TokenBucket(100.0, burst_s=1.0)
    now = b.last
    assert b.take(100, now) == 0.0       # the burst
    assert b.take(50, now) == 0.5        # 50 samples over: half a second at 100/s
    assert b.take(0, now + 1.5) == 0.0   # refilled
