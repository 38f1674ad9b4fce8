"""The report's Code section: the git provenance of each rank, grouped by version."""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .text import WIDTH, printable, title

if TYPE_CHECKING:
    from clusterwatch.v1 import query_pb2


def describe_code(record: dict) -> str:
    """One line for a provenance record: where, which commit, how clean."""
    git = record.get("git") or {}
    if git.get("error") or git.get("commit") in (None, "unknown"):
        return printable(f"unknown ({git.get('error') or 'no git repository'})")
    state = "modified" if git.get("dirty") is True else "clean"
    untracked = git.get("untracked")
    if isinstance(untracked, int) and untracked:
        state += f", {untracked} untracked"
    diff = git.get("diff_sha256") or ""
    if git.get("dirty") is True and diff and diff != "unknown":
        state += f", diff {diff[:8]}"
    remote = git.get("remote_url")
    line = f"{git.get('root', '?')} @ {str(git.get('commit'))[:12]} ({git.get('branch', '?')}), {state}"
    if remote and remote != "unknown":
        line += f"; remote {remote}"
    return printable(line)


def code_versions(view: query_pb2.JobView) -> list[tuple[list[str], str, str]]:
    """The versions of the code the job's ranks run, most ranks first: (the ranks, or "pid N" where no rank is
    known; the code, as describe_code says it; the command of its first rank); [] where none was recorded."""
    if not view.provenance_json:
        return []
    try:
        records = json.loads(view.provenance_json)
    except ValueError:
        return []
    ranks = {(p.node, p.pid): (str(p.rank) if p.HasField("rank") else f"pid {p.pid}") for p in view.processes}
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(r.get("code_id", "unknown"), []).append(r)
    return [([ranks.get((r.get("node"), r.get("pid")), f"pid {r.get('pid')}") for r in recs], describe_code(recs[0]),
             printable(" ".join(map(str, recs[0].get("cmdline", [])))))
            for _, recs in sorted(groups.items(), key=lambda kv: -len(kv[1]))]


def code_section(view: query_pb2.JobView) -> list[str]:
    versions = code_versions(view)
    if not versions:
        return []
    out = [title("Code (git provenance)")]
    if len(versions) == 1:
        ((whose, code, command),) = versions
        out.append(f"  {code}")
        out.append(f"  all {len(whose)} recorded rank(s) run the same code")
        if command:
            out.append(f"  command: {command if len(command) <= WIDTH - 11 else command[:WIDTH - 12] + '…'}")
        return out
    out.append(f"  ranks run {len(versions)} different versions of the code:")
    for whose, code, _ in versions:
        out.append(f"  - ranks {', '.join(whose)}: {code}")
    return out
