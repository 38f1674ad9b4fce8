"""The XID catalog (xid_catalog.toml beside this file, with a site's overrides): severity and advice per XID.

The catalog is data: every entry names its sources, and a site's file of the same form overrides
entries field by field or adds new ones. A wrong file is one line that names the file, the line,
the table and what is allowed (CatalogError, a ConfigError; clusterwatch/toml_file.py), never a traceback.

An entry's fields are declared with toml_schema (`_ENTRY`), as the rules file's are. The tables around
them are read here: toml_schema knows tables with fixed keys, and the catalog's are named by the user
([xid.79], a [sources] key per reference), checked against each other (an entry's sources must be keys
of [sources]) and merged over the shipped file's.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from clusterwatch import toml_file
from clusterwatch.errors import ConfigError
from clusterwatch.toml_schema import Bool, Invalid, Key, Strings, Table, Text

__all__ = ["XidEntry", "XidCatalog", "CatalogError", "load_catalog", "SEVERITIES", "ACTIONS", "DEFAULT_PATH"]

DEFAULT_PATH = Path(__file__).with_name("xid_catalog.toml")
SEVERITIES = ("info", "warning", "critical")
ACTIONS = ("none", "restart_app", "reset_gpu", "reboot_node", "drain")
SITE_SOURCE = "site"
# One [xid.N] table's fields, every one optional here: a site's entry may override only some.
_ENTRY = Table({
    "name": Key("name", Text()),
    "severity": Key("severity", Text(SEVERITIES)),
    "action": Key("action", Text(ACTIONS)),
    "advice": Key("advice", Text()),
    "sources": Key("sources", Strings("a list of [sources] keys")),
    "application": Key("application", Bool()),
}, noun="field")


class CatalogError(ConfigError):
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


def _read(path: Path) -> tuple[str, dict[str, Any]]:
    label = _label(path)
    try:
        text = toml_file.read_text(path, label, "fix the path or drop the option")
        return text, toml_file.parse(text, label)
    except ConfigError as exc:
        raise CatalogError(str(exc)) from None


def _label(path: Path) -> str:
    return f"XID catalog {path}"


class _File:
    """One catalog file being read: its errors name the file, the line and the table."""

    def __init__(self, path: Path, text: str) -> None:
        self.path, self.text = path, text

    def error(self, what: str, table: tuple[str, ...] = (), key: str | None = None) -> CatalogError:
        return self.invalid(Invalid(what, table, key))

    def invalid(self, exc: Invalid) -> CatalogError:
        """`{label}: line N: [table] what`, the form every clusterwatch TOML file's errors take."""
        return CatalogError(str(toml_file.error_at(_label(self.path), self.text, exc)))


def _entry(file: _File, key: str, table: Any, base: XidEntry | None, sources: dict[str, str],
           site: bool) -> XidEntry:
    here = ("xid", key)

    def fail(what: str, field: str | None = None) -> CatalogError:
        return file.error(what, here, field)

    try:
        xid = int(key)
    except ValueError:
        raise fail("the table's name must be an XID number, e.g. [xid.79]") from None
    if not isinstance(table, dict):
        raise fail(f"must be a table with {', '.join(_ENTRY.keys)}")
    try:
        fields = _ENTRY.read(table, here)
    except Invalid as exc:
        raise file.invalid(exc) from None
    if "sources" not in fields and site:
        fields["sources"] = (SITE_SOURCE,)
    if base is None:
        missing = [f for f in ("name", "severity", "action", "advice") if f not in fields]
        if missing:
            raise fail(f"a new entry needs {', '.join(missing)}")
        entry = XidEntry(xid=xid, name=fields["name"], severity=fields["severity"], action=fields["action"],
                         advice=fields["advice"], sources=fields.get("sources", ()),
                         application=fields.get("application", False))
    else:
        entry = replace(base, **fields)
    if not entry.sources:
        raise fail("sources must name at least one key of [sources]", "sources")
    unknown = [s for s in entry.sources if s not in sources and s != SITE_SOURCE]
    if unknown:
        raise fail(f"source {unknown[0]!r} is not in [sources] ({', '.join(sorted(sources))})", "sources")
    return entry


def _merge(path: Path, entries: dict[int, XidEntry], sources: dict[str, str], site: bool) -> None:
    text, data = _read(path)
    file = _File(path, text)
    unknown = set(data) - {"sources", "xid"}
    if unknown:
        first = sorted(unknown)[0]
        raise file.error(f"unknown table [{first}]; allowed: [sources], [xid.N]", key=first)
    for key, value in (data.get("sources") or {}).items():
        if not isinstance(value, str):
            raise file.error(f"{key} must be a string (where the entry comes from)", ("sources",), key)
        sources[key] = value
    for key, table in (data.get("xid") or {}).items():
        entry = _entry(file, key, table, entries.get(_int_or(key)), sources, site)
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
    _merge(shipped, entries, sources, site=False)
    if site is not None:
        _merge(site, entries, sources, site=True)
    return XidCatalog(entries=entries, sources=sources)
