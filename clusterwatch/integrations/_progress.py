"""Framework-free logic of the ready callbacks: what to report from a framework's state.

Kept apart from `hf.py` and `lightning.py` so that it imports no framework and can be
tested with plain objects shaped like the frameworks' state.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from clusterwatch import train

Report = Callable[..., bool]

# Hugging Face log keys that have their own report() argument.
_HF_MAPPED = {"loss": "loss", "learning_rate": "lr", "epoch": "epoch"}
_MAX_EXTRA = 16


def _plain_number(value: Any) -> float | None:
    """A Python int or float that is finite; anything else (tensors included) is None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


class HFReporter:
    """The body of the transformers callback: reports steps and logged values.

    Args:
        report: the function to call (clusterwatch.train.report; tests pass another).
    """

    def __init__(self, report: Report | None = None) -> None:
        self._report = report or train.report

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        """After each optimizer step: the step and epoch, no GPU sync."""
        self._report(step=int(state.global_step), epoch=state.epoch)
        return control

    def on_log(self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None,
               **kwargs: Any) -> Any:
        """When the Trainer logs: loss, learning rate, epoch and other plain numbers."""
        if not logs:
            return control
        fields: dict[str, Any] = {}
        extra: dict[str, float] = {}
        for key, value in logs.items():
            number = _plain_number(value)
            if number is None:
                continue
            if key in _HF_MAPPED:
                fields[_HF_MAPPED[key]] = number
            elif len(extra) < _MAX_EXTRA and key.isidentifier() and key not in ("step",):
                extra[key] = number
        fields.setdefault("epoch", state.epoch)
        self._report(step=int(state.global_step), **fields, **extra)
        return control


class LightningReporter:
    """The body of the Lightning callback.

    Every training batch reports the step and epoch (no GPU sync); every
    `log_every_n_steps` steps it also reports the loss and the metrics Lightning
    logged (`trainer.callback_metrics`, which may wait for the GPU) and the first
    optimizer's learning rate.

    Args:
        report: the function to call (clusterwatch.train.report; tests pass another).
    """

    def __init__(self, report: Report | None = None) -> None:
        self._report = report or train.report

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """After each training batch."""
        step = int(trainer.global_step)
        every = int(getattr(trainer, "log_every_n_steps", 50) or 50)
        if step % every:
            self._report(step=step, epoch=trainer.current_epoch)
            return
        fields: dict[str, Any] = {}
        extra: dict[str, float] = {}
        for key, value in dict(getattr(trainer, "callback_metrics", {}) or {}).items():
            number = _to_float(value)
            if number is None:
                continue
            if key in ("loss", "train_loss"):
                fields["loss"] = number
            elif len(extra) < _MAX_EXTRA and key.isidentifier():
                extra[key] = number
        lr = _first_lr(trainer)
        if lr is not None:
            fields["lr"] = lr
        self._report(step=step, epoch=trainer.current_epoch, **fields, **extra)


def _to_float(value: Any) -> float | None:
    """A finite float from a number or a one-element tensor (`.item()`)."""
    if hasattr(value, "item"):
        try:
            value = value.item()
        except (TypeError, ValueError, RuntimeError):
            return None
    return _plain_number(value)


def _first_lr(trainer: Any) -> float | None:
    try:
        return _plain_number(trainer.optimizers[0].param_groups[0]["lr"])
    except (AttributeError, IndexError, KeyError, TypeError):
        return None
