"""A PyTorch Lightning callback that reports training progress to clusterwatch.

    from clusterwatch.integrations.lightning import ClusterwatchCallback
    trainer = L.Trainer(..., callbacks=[ClusterwatchCallback()])

Works with the `lightning` package and with the older `pytorch_lightning`.
"""
from __future__ import annotations

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:
    try:
        from pytorch_lightning.callbacks import Callback
    except ImportError as exc:  # pragma: no cover - exercised only where Lightning is missing
        raise ImportError(
            "clusterwatch.integrations.lightning needs PyTorch Lightning (`lightning` or "
            "`pytorch_lightning`), which is not installed here; install it or call "
            "clusterwatch.train.report() yourself"
        ) from exc

from clusterwatch.integrations._progress import LightningReporter

__all__ = ["ClusterwatchCallback"]


class ClusterwatchCallback(LightningReporter, Callback):
    """Reports the step after every training batch and the logged metrics every log interval."""
