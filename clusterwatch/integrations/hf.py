"""A Hugging Face `transformers` callback that reports training progress to clusterwatch.

    from clusterwatch.integrations.hf import ClusterwatchCallback
    trainer = Trainer(..., callbacks=[ClusterwatchCallback()])

Every rank reports its own progress (the collector names the slowest rank).
"""
from __future__ import annotations

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - exercised only where transformers is missing
    raise ImportError(
        "clusterwatch.integrations.hf needs the `transformers` package, which is not installed "
        "here; install it (pip install transformers) or call clusterwatch.train.report() yourself"
    ) from exc

from clusterwatch.integrations._progress import HFReporter

__all__ = ["ClusterwatchCallback"]


class ClusterwatchCallback(HFReporter, TrainerCallback):
    """Reports the step after every optimizer step and the logged values on every log."""
