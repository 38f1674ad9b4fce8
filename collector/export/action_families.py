"""The audit trail's counts on /metrics (collector/alerting/audit.py): automatic actions by action and outcome,
as families after the GPU health ones (the exporter takes one `extra`: `Chained` puts several in it)."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .families import family

if TYPE_CHECKING:
    from .series import ExtraFamilies, FamilyRows
    from .text import TextWriter

ACTIONS = family("clusterwatch_actions", "counter",
                 "Automatic actions of the alert steps since the collector started, by action (webhook, command, "
                 "signal, drain, checkpoint, stop; resume_check, resume with --resume) and outcome (done, failed, "
                 "held, refused, skipped, dropped, asked, passed); each is a row of the audit trail (clusterwatch "
                 "health --history).", "action", "outcome")


class ActionFamilies:
    """The actions counter from `counts()`: {(action, outcome): count}."""

    def __init__(self, counts: Callable[[], dict[tuple[str, str], int]]) -> None:
        self.counts = counts

    def snapshot(self) -> dict[tuple[str, str], int]:
        return self.counts()

    def series(self, snap: dict[tuple[str, str], int]) -> FamilyRows:
        return [(ACTIONS, [(ACTIONS.labels, key, float(n)) for key, n in sorted(snap.items())])]

    def write(self, snap: dict[tuple[str, str], int], out: TextWriter) -> None:
        for fam, rows in self.series(snap):
            out.generic(fam, rows, "actions")


class Chained:
    """Several `extra` families as one, in order; None entries are left out."""

    def __init__(self, *parts: ExtraFamilies | None) -> None:
        self.parts = [p for p in parts if p is not None]

    def snapshot(self) -> list[Any]:
        return [p.snapshot() for p in self.parts]

    def series(self, snap: list[Any]) -> FamilyRows:
        return [row for p, s in zip(self.parts, snap, strict=True) for row in p.series(s)]

    def write(self, snap: list[Any], out: TextWriter) -> None:
        for p, s in zip(self.parts, snap, strict=True):
            p.write(s, out)
