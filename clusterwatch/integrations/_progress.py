"""Framework-free logic of the ready callbacks: what to report from a framework's state.

Kept apart from `hf.py` and `lightning.py` so that it imports no framework and can be
tested with plain objects shaped like the frameworks' state.

Both callbacks honour clusterwatch's `checkpoint` and `stop` requests: the handler (run by
clusterwatch.train inside the callback's own report()) arms the request for a step, and the
callback asks the trainer at the end of that step (Hugging Face: `control.should_save` /
`should_training_stop`; Lightning: `trainer.save_checkpoint`, `trainer.should_stop`). A request
may name `args.at_step`: saving is collective in sharded training (FSDP, DeepSpeed), so every
rank must save at the same step; a rank already past that step refuses rather than save alone.
Without `at_step` the request is for the end of the current step. The allocator's figures come
with every report() by themselves (clusterwatch.train reads an imported torch).
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import Any

from clusterwatch import train

Report = Callable[..., bool]

# Hugging Face log keys that have their own report() argument.
_HF_MAPPED = {"loss": "loss", "learning_rate": "lr", "epoch": "epoch"}
_MAX_EXTRA = 16


class StepRequests:
    """`checkpoint` and `stop` requests armed for a step; the callback acts on them at that step's end.

    Args:
        register: install the handlers with clusterwatch.train.on_request (tests of the logic
            alone pass False).
    """

    def __init__(self, register: bool = True) -> None:
        self.step = 0          # the step the callback is reporting (set before each report)
        self.save_at: int | None = None
        self.stop_at: int | None = None
        if register:
            train.on_request("checkpoint", self.on_checkpoint)
            train.on_request("stop", self.on_stop)

    def _target(self, request: train.Request) -> int:
        at = request.args.get("at_step")
        if at is None:
            return self.step
        if isinstance(at, bool) or not isinstance(at, int) or at < 0:
            raise train.Refused(f"at_step must be a step number, not {at!r}")
        if at < self.step:
            raise train.Refused(f"this rank is at step {self.step}, past step {at}: saving alone "
                                "would leave the other ranks waiting in a collective save")
        return at

    def on_checkpoint(self, request: train.Request) -> str:
        """The `checkpoint` handler: arm a save."""
        self.save_at = self._target(request)
        return f"the trainer saves at the end of step {self.save_at}"

    def on_stop(self, request: train.Request) -> str:
        """The `stop` handler: arm a save and a stop."""
        self.stop_at = self.save_at = self._target(request)
        return f"the trainer saves and stops at the end of step {self.stop_at}"

    def due(self, step: int) -> tuple[bool, bool]:
        """(save, stop) for the end of `step`; each is cleared once due."""
        save = self.save_at is not None and step >= self.save_at
        stop = self.stop_at is not None and step >= self.stop_at
        if save:
            self.save_at = None
        if stop:
            self.stop_at = None
        return save, stop


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

    def __init__(self, report: Report | None = None, requests: StepRequests | None = None) -> None:
        self._report = report or train.report
        self.requests = requests if requests is not None else StepRequests(register=report is None)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        """After each optimizer step: the step and epoch (no GPU sync); a save or stop asked for."""
        step = int(state.global_step)
        self.requests.step = step
        self._report(step=step, epoch=state.epoch)  # runs the handlers of requests that came
        save, stop = self.requests.due(step)
        if save:
            control.should_save = True
        if stop:
            control.should_training_stop = True
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

    def __init__(self, report: Report | None = None, requests: StepRequests | None = None) -> None:
        self._report = report or train.report
        self.requests = requests if requests is not None else StepRequests(register=report is None)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """After each training batch: the report, then a save or stop asked for."""
        step = int(trainer.global_step)
        self.requests.step = step
        self._report_batch(trainer, step)  # runs the handlers of requests that came
        save, stop = self.requests.due(step)
        if save:
            # every rank calls it (the strategy writes from the ranks that must): a collective
            folder = os.path.join(str(getattr(trainer, "default_root_dir", None) or "."), "clusterwatch")
            trainer.save_checkpoint(os.path.join(folder, f"step-{step}.ckpt"))
        if stop:
            trainer.should_stop = True

    def _report_batch(self, trainer: Any, step: int) -> None:
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
