"""`clusterwatch prolog --gate`: the prolog's settings for the health gate and its verdict for this node.

The verdict itself is clusterwatch/slurm/health_gate.py's (pure, over the agent's health file); this module
reads the settings as a hook must (a bad value turns the gate off with one line, it never fails the prolog)
and says which XIDs need a reset, from the collector's XID catalog, the one place that knows.
"""
from __future__ import annotations

import functools
import time

from clusterwatch.errors import ConfigError

__all__ = ["gate_enabled", "gate_also", "xid_needs_reset", "verdict"]

_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off", "none")
#: The catalog's actions that take a GPU out of service until someone acts.
RESET_ACTIONS = ("reset_gpu", "reboot_node", "drain")


def gate_enabled(value) -> bool:
    """--gate, CLUSTERWATCH_GATE or [prolog] gate as a bool; ConfigError for a value that is neither."""
    text = str(value if value is not None else "").strip().lower()
    if text in _ON:
        return True
    if text in _OFF:
        return False
    raise ConfigError(f"gate {text[:20]!r} is neither on nor off; give 1 or 0")


def gate_also(value) -> tuple[str, ...]:
    """The findings a site adds to the gate: a list (the config file) or a comma-separated string."""
    if value is None:
        return ()
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    return tuple(s for s in (str(i).strip() for i in items) if s)


@functools.lru_cache(maxsize=None)
def xid_needs_reset(xid: int) -> bool:
    """Whether the shipped XID catalog says the GPU needs a reset, a reboot or a drain after `xid`."""
    return _catalog().lookup(xid).action in RESET_ACTIONS


@functools.lru_cache(maxsize=1)
def _catalog():
    # loaded only when the health file names an XID: most prologs never parse it
    from clusterwatch.collector.health.xid_catalog import load_catalog

    return load_catalog()


def verdict(spool: str, also: tuple[str, ...]):
    """The gate's Verdict for the node whose spool folder is `spool`; never raises."""
    from clusterwatch.slurm.health_gate import check

    return check(spool, time.time(), needs_reset=xid_needs_reset, also=also)
