"""Why a record says "unknown", logged once per kind of failure (a node's every rank would repeat it)."""
from __future__ import annotations

import logging

from clusterwatch.log_once import SaidOnce

# the package's logger: operators filter on "clusterwatch.agent.provenance"
log = logging.getLogger(__package__)

_said = SaidOnce(log)


def warn_once(kind: str, reason: str) -> None:
    """Log a failure as a warning the first time its kind is seen, at debug level after that.

    Args:
        kind: a short stable word for the kind of failure ("proc", "dir", a GitError's kind).
        reason: one line for a person.
    """
    if not _said.warning(kind, "provenance unknown: %s (further ones of this kind are logged at debug level)",
                         reason):
        log.debug("provenance unknown: %s", reason)
