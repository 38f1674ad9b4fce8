"""One Slurm node by its name: what a drain (or any Slurm command run for a node) may name.

A node name reaches the collector from an agent's Hello, which its sender writes. Where Slurm expects a
node it reads more than names: a hostlist (`n[1-9]`), a list (`a,b`), the keyword `ALL`, a nodeset (a name
of slurm.conf's NodeSet= standing for many nodes), and scontrol reads a leading `-` as an option and a
space as the next field. So a name is taken only when it is plain (letters and digits, then also `.`, `_`
and `-`), not a keyword, and Slurm, asked for it alone, shows exactly that one node
(`scontrol -o show node NAME`: a nodeset or a name Slurm does not know shows some other count).
"""
from __future__ import annotations

import re

# a node name as scontrol takes it: no hostlist brackets, commas, spaces or leading dash
_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# names Slurm reads as more than one node wherever a node list goes (compared without case)
KEYWORDS = frozenset({"all"})


def why_not_a_node_name(name: str) -> str:
    """Why `name` cannot name one Slurm node by itself ("" when it can, if Slurm knows it)."""
    if not _PLAIN.fullmatch(name):
        return ("not a plain Slurm node name (letters, digits, '.', '_' and '-', at most 128, no hostlist, list, "
                "space or leading '-')")
    if name.lower() in KEYWORDS:
        return f"{name!r} is a Slurm keyword for every node, not a node"
    return ""


def shown_node_names(text: str) -> list[str]:
    """The NodeName of each node `scontrol -o show node ...` printed (one node a line, NodeName= first)."""
    names = []
    for line in text.splitlines():
        if line.startswith("NodeName="):
            names.append(line[len("NodeName="):].split(" ", 1)[0])
    return names
