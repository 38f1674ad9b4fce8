"""Slurm hostlist expressions: expand ``gpu[001-004,010]`` into names, and compress names for display.

Written here rather than taken from ``python-hostlist``: that package is GPL-2.0-or-later and clusterwatch
is Apache-2.0, and the part we need (Slurm's documented syntax) is small.

Syntax, as ``scontrol show hostnames`` reads it: a comma-separated list at the top level; each item is
literal text with zero or more bracket groups, each group a comma list of numbers or ``lo-hi`` ranges.
Several groups multiply out with the last one varying fastest (``rack[0-1]_blade[0-2]``). A leading zero
fixes the width (``[001-004]``); without one the numbers are printed naturally.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from clusterwatch.errors import ParseError

#: Refuse expansions larger than this: a typo like ``n[0-99999999999]`` must not eat the collector's memory.
MAX_HOSTS = 1_000_000

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
# Characters that cannot be part of a plain host name piece.
_SPECIAL = set("[],")


def _short(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


def _split_top(expr: str) -> list[str]:
    """Split on commas that are outside brackets; raise on unbalanced brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ParseError(f"hostlist {_short(expr)!r}: nested '[' at offset {i}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ParseError(f"hostlist {_short(expr)!r}: ']' without '[' at offset {i}")
        elif ch == "," and depth == 0:
            items.append(expr[start:i])
            start = i + 1
    if depth != 0:
        raise ParseError(f"hostlist {_short(expr)!r}: '[' is never closed")
    items.append(expr[start:])
    return items


def _parse_group(body: str, expr: str) -> list[tuple[int, int, int]]:
    """Parse the inside of one bracket group into (lo, hi, width) ranges."""
    ranges = []
    for part in body.split(","):
        match = _RANGE.match(part)
        if match is None:
            raise ParseError(f"hostlist {_short(expr)!r}: bad range {_short(part)!r} (expected N or N-M)")
        lo_text, hi_text = match.group(1), match.group(2)
        lo = int(lo_text)
        hi = int(hi_text) if hi_text is not None else lo
        if hi < lo:
            raise ParseError(f"hostlist {_short(expr)!r}: range {part!r} runs backwards")
        ranges.append((lo, hi, len(lo_text)))
    return ranges


def _parse_item(item: str, expr: str) -> list[str | list[tuple[int, int, int]]]:
    """Split one top-level item into literal pieces and bracket groups."""
    pieces: list[str | list[tuple[int, int, int]]] = []
    pos = 0
    while pos < len(item):
        open_at = item.find("[", pos)
        if open_at < 0:
            pieces.append(item[pos:])
            break
        if open_at > pos:
            pieces.append(item[pos:open_at])
        close_at = item.find("]", open_at)
        pieces.append(_parse_group(item[open_at + 1 : close_at], expr))
        pos = close_at + 1
    for piece in pieces:
        if isinstance(piece, str) and (any(ch.isspace() for ch in piece) or _SPECIAL & set(piece)):
            raise ParseError(f"hostlist {_short(expr)!r}: bad character in {_short(piece)!r}")
    return pieces


def _count(pieces: Sequence[str | list[tuple[int, int, int]]]) -> int:
    total = 1
    for piece in pieces:
        if not isinstance(piece, str):
            total *= sum(hi - lo + 1 for lo, hi, _ in piece)
            if total > MAX_HOSTS:
                break
    return total


def _expand_pieces(pieces: Sequence[str | list[tuple[int, int, int]]]) -> list[str]:
    names = [""]
    for piece in pieces:
        if isinstance(piece, str):
            names = [name + piece for name in names]
        else:
            values = [f"{n:0{width}d}" for lo, hi, width in piece for n in range(lo, hi + 1)]
            names = [name + value for name in names for value in values]
    return names


def expand(expr: str, max_hosts: int = MAX_HOSTS) -> list[str]:
    """Expand a Slurm hostlist expression into host names, in Slurm's order.

    Args:
        expr: for example ``gpu[001-004,010]``, ``rack[0-1]_blade[0-2]`` or ``a,b[1-3],c``. Surrounding
            whitespace is ignored; an empty string is an empty list (``NodeList=`` of a pending job).
        max_hosts: refuse expressions that expand to more names than this.

    Returns:
        The host names; duplicates are kept, as ``scontrol show hostnames`` keeps them.

    Raises:
        ParseError: unbalanced or nested brackets, a bad or backwards range, an empty item, whitespace
            inside the expression, or more than ``max_hosts`` names.
    """
    if not isinstance(expr, str):
        raise ParseError(f"hostlist must be text, not {type(expr).__name__}")
    expr = expr.strip()
    if not expr:
        return []
    hosts: list[str] = []
    for item in _split_top(expr):
        if not item:
            raise ParseError(f"hostlist {_short(expr)!r}: empty item between commas")
        pieces = _parse_item(item, expr)
        if len(hosts) + _count(pieces) > max_hosts:
            raise ParseError(f"hostlist {_short(expr)!r} expands to more than {max_hosts} hosts")
        hosts.extend(_expand_pieces(pieces))
    return hosts


_TRAILING_NUMBER = re.compile(r"^(.*?)(\d+)$")


def _format_ranges(numbers: list[tuple[int, str]]) -> str:
    """Join (value, text) pairs, already in order, into ``0-3,7`` keeping each number's written form."""
    parts = []
    i = 0
    while i < len(numbers):
        lo_value, lo_text = numbers[i]
        width = len(lo_text)
        j = i
        # Extend the run while the next number is one more and prints the same way with this width,
        # so expanding the range gives back exactly the original names.
        while (
            j + 1 < len(numbers)
            and numbers[j + 1][0] == numbers[j][0] + 1
            and f"{numbers[j + 1][0]:0{width}d}" == numbers[j + 1][1]
        ):
            j += 1
        parts.append(lo_text if j == i else f"{lo_text}-{numbers[j][1]}")
        i = j + 1
    return ",".join(parts)


def compress(hosts: Iterable[str]) -> str:
    """Compress host names into a hostlist expression, for display.

    Adjacent names that share a prefix and end in a number are merged (``n1,n2,n3`` → ``n[1-3]``); the
    order of the names is kept, so ``expand(compress(hosts)) == list(hosts)``.

    Args:
        hosts: host names without brackets, commas or whitespace.

    Returns:
        The expression; an empty string for no hosts.

    Raises:
        ParseError: a name is empty or holds a character that a hostlist cannot carry.
    """
    groups: list[tuple[str, list[tuple[int, str]] | None]] = []
    for host in hosts:
        if not host or _SPECIAL & set(host) or any(ch.isspace() for ch in host):
            raise ParseError(f"cannot put host name {_short(host)!r} in a hostlist")
        match = _TRAILING_NUMBER.match(host)
        if match is None:
            groups.append((host, None))
            continue
        prefix, digits = match.group(1), match.group(2)
        last = groups[-1] if groups else None
        if last is not None and last[1] is not None and last[0] == prefix:
            last[1].append((int(digits), digits))
        else:
            groups.append((prefix, [(int(digits), digits)]))
    parts = []
    for prefix, numbers in groups:
        if numbers is None:
            parts.append(prefix)
        elif len(numbers) == 1:
            parts.append(prefix + numbers[0][1])
        else:
            parts.append(f"{prefix}[{_format_ranges(numbers)}]")
    return ",".join(parts)
