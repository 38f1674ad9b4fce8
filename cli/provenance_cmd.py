"""`clusterwatch provenance [DIR] [--json]`: the git provenance record of a directory."""
from __future__ import annotations

import click

from .help_text import examples


def human_lines(record: dict) -> list[str]:
    """The record as short labelled lines, for a person.

    Args:
        record: `Provenance.to_dict()`.

    Returns:
        The lines, without newlines.
    """
    git = record["git"]
    if git["error"]:
        return [f"path        {record['path']}", f"git         unknown: {git['error']}"]
    branch = git["branch"]
    state = "clean" if git["dirty"] is False else "modified tracked files"
    if git["diff_sha256"]:
        state += f", diff sha256 {git['diff_sha256']}"
    lines = [
        f"repository  {git['root']}",
        f"commit      {git['commit']}",
        f"branch      {branch}",
        f"state       {state}",
        f"untracked   {git['untracked']} file{'' if git['untracked'] == 1 else 's'}",
        f"remote      {git['remote_url'] or '(none)'}",
        f"code id     {record['code_id']}",
    ]
    for sub in git["submodules"]:
        mark = {True: " (modified)", False: "", "unknown": " (state unknown)"}[sub["dirty"]]
        moved = "" if sub["commit"] in (sub["recorded"], "unknown") else f" (recorded {sub['recorded']})"
        lines.append(f"submodule   {sub['path']} {sub['commit']}{mark}{moved}")
    return lines


@click.command(epilog=examples(
    "clusterwatch provenance",
    "clusterwatch provenance . --json > code.json",
))
@click.argument("directory", default=".", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (for checkpoints and model cards).")
@click.option("--timeout", "budget_s", type=float, default=5.0, show_default=True,
              help="Seconds for all git calls together.")
def provenance(directory: str, as_json: bool, budget_s: float) -> None:
    """Print which code DIRECTORY holds: commit, branch, local changes, submodules, remote.

    The same record the agent takes for every training process. git runs with hooks,
    fsmonitor, pagers, filters and credential helpers switched off; run as root, it
    runs as the directory's owner. Without git or a repository the fields say
    "unknown" and the command still exits 0.
    """
    from clusterwatch.agent.provenance import ProvenanceConfig, provenance_of_dir

    record = provenance_of_dir(directory, ProvenanceConfig(budget_s=budget_s))
    if as_json:  # as status --json has the record: null, never "unknown", "" or 0.0, where there is no value
        import json

        from clusterwatch.json_view import provenance_record

        click.echo(json.dumps(provenance_record(record.to_dict()), indent=2))
    else:
        from clusterwatch.report.text import printable

        for line in human_lines(record.to_dict()):
            click.echo(printable(line))
