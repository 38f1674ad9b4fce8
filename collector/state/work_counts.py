"""The work a training process counts beside its steps: tokens or samples, read from its reports' metrics.

A step rate misleads when a job changes its batch or sequence length (curriculum, packing, a larger batch after
warm-up): job_slowdown judges the job's throughput in tokens or samples per second where its process reports
them (collector/rules/job_slowdown.py). It reads counts, not rates: a cumulative count measures the rate over
any span the rule asks, and an evaluation phase or a checkpoint save between two reports costs nothing.

The names (clusterwatch.train.report(**metrics); docs/rules.md, job_slowdown):

- `tokens`: tokens this rank (or the job) has trained on since the run began; `num_input_tokens_seen`, the
  Hugging Face Trainer's own log key (`include_num_input_tokens_seen=True`), is read as the same.
- `samples`: samples (sequences, images) trained on since the run began; read where no tokens are.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

from ..rules.job_slowdown import MAX_COUNT

TOKENS = ("tokens", "num_input_tokens_seen")
SAMPLES = ("samples",)


def work_counts(metrics: Mapping[str, float], tokens: float | None, samples: float | None
                ) -> tuple[float | None, float | None]:
    """The (tokens, samples) a process holds after a report with `metrics`: each the report's count where it
    gives a valid one (finite, from 0 to MAX_COUNT), else the one held before."""
    return _count(metrics, TOKENS, tokens), _count(metrics, SAMPLES, samples)


def _count(metrics: Mapping[str, float], names: tuple[str, ...], held: float | None) -> float | None:
    for name in names:
        value = metrics.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
                and 0 <= value <= MAX_COUNT:
            return float(value)
    return held
