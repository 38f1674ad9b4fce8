"""Training progress read from a job's own output: tqdm bars, the Hugging Face Trainer's log lines, Lightning's bar.

Parsing is pure: `parse_line` takes one line (a job's output split at "\\n" and at tqdm's "\\r") and gives what it
says of progress, and `ProgressTracker` turns a file's successive lines into one progress: the training bar's
step, kept rising across epochs, with the latest loss, learning rate and epoch.

A job's output is hostile text: every pattern here is linear (no repeat inside a repeat, every run bounded),
and the caller bounds the line's length (agent/job_output_tail.py).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

# tqdm's default layout: "{desc}: {pct}%|{bar}| {n}/{total} [{elapsed}<{remaining}, {rate}{postfix}]".
# The bar is Unicode blocks or ASCII ("#"); n and total are plain integers unless the job asked for unit scaling
# ("1.2k"), which is not read (a rounded step would stall and jump).
_BAR = re.compile(r"(?P<pct>\d{1,3})%\|[^|\n]{0,200}\|\s?(?P<n>\d{1,18})/(?P<total>\d{1,18})\s?"
                  r"\[(?P<rest>[^\]]{0,500})")
# A bar without a total ("450it [00:10, 44.1it/s]")
_COUNT = re.compile(r"(?:^|\s)(?P<n>\d{1,18})it \[(?P<rest>[^\]]{0,500})")
# Lightning's training bar: "Epoch 3:  45%|..."; its validation bar says "Validation" instead
_EPOCH_DESC = re.compile(r"^Epoch (?P<epoch>\d{1,9})(?:/\d{1,9})?$")
# a bar's postfix (tqdm's set_postfix, Lightning's metrics): ", v_num=0, loss=0.452"
_NUMBER = r"(?P<value>[-+]?[0-9][0-9.]{0,30}(?:e[-+]?\d{1,3})?)"
_POSTFIX = re.compile(r"(?:^|[ ,])(?P<key>loss|train_loss|lr|learning_rate)=" + _NUMBER)
# The Trainer's log line, a Python dict: "{'loss': 0.4521, 'grad_norm': 1.2, 'learning_rate': 4.5e-05, 'epoch': 0.3}"
_DICT_ITEM = re.compile(r"'(?P<key>loss|learning_rate|epoch|step)': " + _NUMBER)

_LOSS_KEYS = {"loss", "train_loss"}
_LR_KEYS = {"lr", "learning_rate"}
MAX_STEP = 2**63 - 1


@dataclass(frozen=True, slots=True)
class Progress:
    """What one line (or a file so far) says of training progress; None where it says nothing.

    Attributes:
        step: the step: a bar's count, a log line's or a site regex's step.
        total: the bar's total, when the line is a bar with one.
        loss, lr, epoch: as the line gives them.
        bar: which bar the line is (its description and total; "Epoch" for Lightning's training bar), so an
            evaluation bar is told from training's; "" for a line that is no bar.
        explicit: the step is a step the job printed as such (a log line's "step", a site regex's group), not a
            bar's count.
    """

    step: int | None = None
    total: int | None = None
    loss: float | None = None
    lr: float | None = None
    epoch: float | None = None
    bar: str = ""
    explicit: bool = False


def number(text: str) -> float | None:
    """A finite float, else None."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def step_number(text: str) -> int | None:
    """A step as the wire carries it (0 to 2**63-1), else None."""
    try:
        value = int(text)
    except ValueError:
        return None
    return value if 0 <= value <= MAX_STEP else None


def _postfix(rest: str) -> tuple[float | None, float | None]:
    loss = lr = None
    for m in _POSTFIX.finditer(rest):
        value = number(m["value"])
        if m["key"] in _LOSS_KEYS:
            loss = value
        else:
            lr = value
    return loss, lr


def _bar(line: str) -> Progress | None:
    m = _BAR.search(line)
    if m is not None:
        total = step_number(m["total"])
        n = step_number(m["n"])
        desc = line[:m.start()].strip().rstrip(":").strip()
    else:
        m = _COUNT.search(line)
        if m is None:
            return None
        n, total = step_number(m["n"]), None
        desc = line[:m.start()].strip().rstrip(":").strip()
    if n is None:
        return None
    loss, lr = _postfix(m["rest"])
    epoch = None
    lightning = _EPOCH_DESC.match(desc)
    if lightning is not None:
        epoch = float(lightning["epoch"])
        desc = "Epoch"  # one training bar across epochs
    else:  # a bar is its description and total: the Trainer's evaluation bar has no description either
        desc = f"{desc[-80:]}/{total if total is not None else '?'}"
    return Progress(step=n, total=total, loss=loss, lr=lr, epoch=epoch, bar=desc)


def _log_dict(line: str) -> Progress | None:
    text = line.strip()
    if not text.startswith("{") or "'" not in text:
        return None
    found: dict[str, str] = {}
    for m in _DICT_ITEM.finditer(text):
        found.setdefault(m["key"], m["value"])
    if not found:
        return None
    step = step_number(found["step"]) if "step" in found else None
    return Progress(step=step, loss=number(found["loss"]) if "loss" in found else None,
                    lr=number(found["learning_rate"]) if "learning_rate" in found else None,
                    epoch=number(found["epoch"]) if "epoch" in found else None, explicit=step is not None)


def parse_line(line: str) -> Progress | None:
    """What one line of a job's output says of progress: a tqdm bar (Lightning's and the Trainer's are tqdm's)
    or the Trainer's log line; None for any other line."""
    if "%|" in line or "it [" in line:
        return _bar(line)
    if line.lstrip().startswith("{"):
        return _log_dict(line)
    return None


class ProgressTracker:
    """One file's progress from its lines, in order.

    The training bar is the one with the largest total (an evaluation bar, shown while training waits, is shorter;
    Lightning's, named "Epoch N", always is). Its count starts again at each epoch; the step given is kept rising
    by adding the count each earlier pass reached (for Lightning, epoch × total + count). A step the job printed as
    such (a log line's, a site regex's) wins over any bar's count once one is seen.
    """

    def __init__(self) -> None:
        self._bar = ""  # the training bar's key
        self._total = -1
        self._offset = 0  # counts of the bar's earlier passes
        self._last_n = 0
        self._explicit = False
        self._now = Progress()
        self._taken: Progress | None = None

    def feed(self, p: Progress) -> None:
        now = self._now
        step = now.step
        if p.explicit and p.step is not None:
            self._explicit = True
            step = p.step
        elif p.bar and p.step is not None and not self._explicit:
            step = self._bar_step(p, step)
        self._now = Progress(step=step, loss=p.loss if p.loss is not None else now.loss,
                             lr=p.lr if p.lr is not None else now.lr,
                             epoch=p.epoch if p.epoch is not None else now.epoch)

    def _bar_step(self, p: Progress, step: int | None) -> int | None:
        total = p.total if p.total is not None else 0
        n = p.step or 0
        if p.bar != self._bar:
            lightning = p.bar == "Epoch"
            if not lightning and (self._bar == "Epoch" or total <= self._total):
                return step  # another bar (evaluation, a data loader's): not training's
            self._bar, self._total, self._offset, self._last_n = p.bar, total, 0, 0
        elif total > self._total:
            self._total = total
        if p.bar == "Epoch" and p.epoch is not None and total:
            return min(MAX_STEP, int(p.epoch) * total + n)
        if n < self._last_n:  # the bar started again: the next epoch
            self._offset += self._last_n
        self._last_n = n
        return min(MAX_STEP, self._offset + n)

    def take(self) -> Progress | None:
        """The progress now, when it has changed since the last take (None otherwise, or before any)."""
        now = self._now
        if now == self._taken or (now.step is None and now.loss is None and now.lr is None and now.epoch is None):
            return None
        self._taken = now
        return now
