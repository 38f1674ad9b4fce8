"""The XID catalog (xid_catalog.toml beside this file, with a site's overrides): severity and advice per XID.

The catalog is data: every entry names its sources, and a site's file of the same form overrides
entries field by field or adds new ones. A wrong file is one line that names the file, the table
and what is allowed (CatalogError), never a traceback.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import tomllib

__all__ = ["XidEntry", "XidCatalog", "CatalogError", "load_catalog", "SEVERITIES", "ACTIONS", "DEFAULT_PATH"]

DEFAULT_PATH = Path(__file__).with_name("xid_catalog.toml")
SEVERITIES = ("info", "warning", "critical")
ACTIONS = ("none", "restart_app", "reset_gpu", "reboot_node", "drain")
_FIELDS = {"name": str, "severity": str, "action": str, "advice": str, "sources": list, "application": bool}
SITE_SOURCE = "site"


class CatalogError(ValueError):
    """A catalog file that cannot be used; the message is one line for the operator."""


@dataclass(frozen=True, slots=True)
class XidEntry:
    xid: int
    name: str
    severity: str                 # one of SEVERITIES
    action: str                   # one of ACTIONS
    advice: str
    sources: tuple[str, ...]      # keys of XidCatalog.sources ("site" for a site's own)
    application: bool = False     # raised by an application's own fault; the GPU stays healthy
    known: bool = True            # False: the XID is in no catalog file


@dataclass(frozen=True, slots=True)
class XidCatalog:
    entries: dict[int, XidEntry]
    sources: dict[str, str]

    def lookup(self, xid: int) -> XidEntry:
        """The entry for `xid`; an XID in no file is a warning that says to look it up."""
        entry = self.entries.get(xid)
        if entry is not None:
            return entry
        return XidEntry(xid=xid, name=f"XID {xid}", severity="warning", action="none", known=False, sources=(),
                        advice=f"XID {xid} is not in clusterwatch's catalog: look it up in NVIDIA's Xid catalog "
                               "and add it to the site's catalog file.")


def _read(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise CatalogError(f"XID catalog {path}: cannot read it ({exc.strerror}); "
                           "fix the path or drop the option") from None
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"XID catalog {path}: not TOML ({exc}); fix the file") from None


def _entry(path: Path, key: str, table: Any, base: XidEntry | None, sources: dict[str, str],
           site: bool) -> XidEntry:
    where = f"XID catalog {path}: [xid.{key}]"
    try:
        xid = int(key)
    except ValueError:
        raise CatalogError(f"{where}: the table's name must be an XID number, e.g. [xid.79]") from None
    if not isinstance(table, dict):
        raise CatalogError(f"{where}: must be a table with {', '.join(_FIELDS)}")
    for name, value in table.items():
        want = _FIELDS.get(name)
        if want is None:
            raise CatalogError(f"{where}: unknown field {name!r}; allowed: {', '.join(_FIELDS)}")
        if not isinstance(value, want):
            raise CatalogError(f"{where}: {name} must be a {want.__name__}")
    fields = dict(table)
    if "sources" in fields:
        fields["sources"] = tuple(fields["sources"])
    elif site:
        fields["sources"] = (SITE_SOURCE,)
    if base is None:
        missing = [f for f in ("name", "severity", "action", "advice") if f not in fields]
        if missing:
            raise CatalogError(f"{where}: a new entry needs {', '.join(missing)}")
        entry = XidEntry(xid=xid, name=fields["name"], severity=fields["severity"], action=fields["action"],
                         advice=fields["advice"], sources=fields.get("sources", ()),
                         application=fields.get("application", False))
    else:
        entry = replace(base, **fields)
    if entry.severity not in SEVERITIES:
        raise CatalogError(f"{where}: severity {entry.severity!r}; allowed: {', '.join(SEVERITIES)}")
    if entry.action not in ACTIONS:
        raise CatalogError(f"{where}: action {entry.action!r}; allowed: {', '.join(ACTIONS)}")
    if not entry.sources:
        raise CatalogError(f"{where}: sources must name at least one key of [sources]")
    unknown = [s for s in entry.sources if s not in sources and s != SITE_SOURCE]
    if unknown:
        raise CatalogError(f"{where}: source {unknown[0]!r} is not in [sources] ({', '.join(sorted(sources))})")
    return entry


def _merge(path: Path, data: dict[str, Any], entries: dict[int, XidEntry], sources: dict[str, str],
           site: bool) -> None:
    unknown = set(data) - {"sources", "xid"}
    if unknown:
        raise CatalogError(f"XID catalog {path}: unknown table [{sorted(unknown)[0]}]; allowed: [sources], [xid.N]")
    for key, text in (data.get("sources") or {}).items():
        if not isinstance(text, str):
            raise CatalogError(f"XID catalog {path}: [sources] {key} must be a string (where the entry comes from)")
        sources[key] = text
    for key, table in (data.get("xid") or {}).items():
        entry = _entry(path, key, table, entries.get(_int_or(key)), sources, site)
        entries[entry.xid] = entry


def _int_or(key: str) -> int | None:
    try:
        return int(key)
    except ValueError:
        return None


def load_catalog(site: Path | None = None, *, shipped: Path = DEFAULT_PATH) -> XidCatalog:
    """The shipped catalog, with a site's file (same form) laid over it field by field."""
    entries: dict[int, XidEntry] = {}
    sources: dict[str, str] = {}
    _merge(shipped, _read(shipped), entries, sources, site=False)
    if site is not None:
        _merge(site, _read(site), entries, sources, site=True)
    return XidCatalog(entries=entries, sources=sources)
