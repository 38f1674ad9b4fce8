"""One node's state and drain reason, read from `scontrol -o show node NAME` (pure: text in, a record out).

What a resume asks before it runs: is the node drained, and is the drain clusterwatch's? Slurm keeps one
reason a node; whoever drains it last writes it (`scontrol update nodename=X state=drain reason=...`), and
Slurm adds who and when: `Reason=TEXT [USER@TIME]`, the last field of the one-line form (22.05 to 24.x).
A reason that is not exactly the one clusterwatch wrote is a person's, and their node stays as they left it.

The fields before Reason= are Slurm's and the site's configuration, never a user's, so the first
" Reason=" starts the reason, whatever it holds.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_STAMP = re.compile(r"\s\[([^\[\]@]*)@([^\[\]]*)\]$")


@dataclass(frozen=True, slots=True)
class NodeDrain:
    """A node as `scontrol -o show node` printed it: its state flags, and its reason with who set it and when."""

    node: str
    state: str  # IDLE+DRAIN, MIXED+DRAIN, ALLOCATED, DOWN+DRAIN+NOT_RESPONDING...
    reason: str = ""
    set_by: str = ""
    set_at: str = ""

    @property
    def drained(self) -> bool:
        """Slurm schedules nothing new on it (DRAIN, whether still draining jobs or drained)."""
        return "DRAIN" in self.state.upper().split("+")


def parse_node_drain(text: str) -> NodeDrain | None:
    """The one node in `scontrol -o show node NAME`'s output; None when it shows none, or more than one."""
    lines = [x for x in text.splitlines() if x.startswith("NodeName=")]
    if len(lines) != 1:
        return None
    line = lines[0].rstrip()
    node = line[len("NodeName="):].split(" ", 1)[0]
    head, sep, reason = line.partition(" Reason=")
    state = re.search(r"(?:^| )State=(\S+)", head)
    by = at = ""
    if sep:
        stamp = _STAMP.search(reason)
        if stamp:
            by, at = stamp.group(1), stamp.group(2)
            reason = reason[:stamp.start()]
    return NodeDrain(node, state.group(1) if state else "", reason.strip(), by, at)
