"""The examples each command's --help ends with (click's epilog)."""
from __future__ import annotations


def examples(*lines: str) -> str:
    """An epilog of example command lines, kept as written ("\\b": click does not rewrap the paragraph)."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)
