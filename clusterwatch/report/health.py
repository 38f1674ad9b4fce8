"""status's Health section: the health findings on the job's GPUs during the job, worst first, with advice."""
from __future__ import annotations

import time

from .text import RULE, printable, wrap_words

__all__ = ["health_section"]

_MARK = {"critical": "●", "warning": "◐", "info": "○"}
_RANK = {"critical": 0, "warning": 1, "info": 2}


def health_section(view, width: int | None) -> list[str]:
    """Lines for the view's `health` (query HealthView): one a finding, its advice beneath; [] when none."""
    if not view.health:
        return []
    out = ["", "Health", f"{RULE}─"]
    # the collector sends them worst first; kept so for a view from an older collector too
    for h in sorted(view.health, key=lambda h: (_RANK.get(h.severity, 3), -h.time)):
        when = time.strftime("%H:%M:%S %Z", time.localtime(h.time)) if h.time else "-"
        head = f"  {_MARK.get(h.severity, '?')} {h.severity.upper():<8} {when} {h.rule:<17} "
        text = printable(h.description)
        if width is None or len(head) + len(text) <= width:
            out.append(head + text)
        else:
            out.extend(wrap_words(text, head, " " * len(head), width))
        if h.advice:
            pad = " " * len(head)
            advice = printable(h.advice)
            out.extend(wrap_words(advice, pad + "→ ", pad + "  ", width) if width else [pad + "→ " + advice])
    return out
