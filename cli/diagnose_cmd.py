"""`clusterwatch diagnose JOBID [--rank R]`: the Python stacks of a job's ranks, grouped, and memory snapshots.

The job's collector asks each rank's agent (Query.AskTraining): the agent reads the stacks from outside
with `py-spy dump` (no cooperation needed: a hung collective shows where it waits), then each rank that
uses clusterwatch.train is asked for a CUDA memory snapshot, which it writes where only its user can
read it (clusterwatch/train_snapshot.py). Only the job's owner and admins may ask.
"""
from __future__ import annotations

import sys

import click

from .common import MungeCredential, collector_option, deployment, exit_quickly_when_done, fail
from .help_text import examples
from .status_cmd import _explain, _job_id, _stub, complete_job_ids

# The collector waits this long for the ranks' answers; the call's deadline is a little longer.
ANSWER_WAIT_S = 8.0


def _ask(address: str, tls_ca: str | None, job_id: str, rank: int | None, kind: str, credential: MungeCredential):
    from clusterwatch.v1 import query_pb2

    request = query_pb2.AskTrainingRequest(job_id=job_id, kind=kind, timeout_s=ANSWER_WAIT_S)
    if rank is not None:
        request.rank = rank
    channel, stub = _stub(address, tls_ca)
    try:
        return stub.AskTraining(request, timeout=ANSWER_WAIT_S + 5.0, metadata=credential.metadata())
    finally:
        channel.close()


def render_diagnosis(stacks, snapshots) -> str:
    """The grouped stacks (each distinct stack once, with its ranks), then each rank's snapshot."""
    from clusterwatch.report.requests import answer_line as line
    from clusterwatch.report.requests import who
    from clusterwatch.report.text import printable
    from clusterwatch.stacks import by_rank, group_ranks

    out = ["Stacks (main thread; ranks with the same stack once)"]
    dumps, noun = by_rank(stacks.answers)
    for group in group_ranks(dumps) if dumps else []:
        out.append(f"  {printable(group.summary(noun))}")
        for frame in group.frames:
            out.append(f"      {printable(str(frame))}")
    for a in stacks.answers:
        if not a.payload:
            out.append(f"  {who(a)}: no stacks: {printable(a.message) or a.status}")
        elif a.truncated:
            out.append(f"  {who(a)}: its stacks were cut at 60000 bytes")
    if not stacks.answers:
        out.append("  no process answered")
    out += ["", "Memory snapshots (open one in PyTorch's memory viewer, https://pytorch.org/memory_viz)"]
    now = max([a.answered_at for a in snapshots.answers] + [0.0])
    out += [line(a, now) for a in snapshots.answers] or ["  no process answered"]
    return "\n".join(out) + "\n"


def diagnosis_document(job_id: str, stacks, snapshots) -> dict:
    from clusterwatch.json_view import message_to_json

    return {"schema": "clusterwatch.diagnose/1", "job_id": job_id,
            "stack_groups": list(stacks.stack_groups),
            "stacks": [message_to_json(a) for a in stacks.answers],
            "snapshots": [message_to_json(a) for a in snapshots.answers]}


@click.command(epilog=examples(
    "clusterwatch diagnose 4242",
    "clusterwatch diagnose 4242 --rank 3 --no-snapshot",
))
@click.argument("job_id", shell_complete=complete_job_ids, callback=_job_id)
@click.option("--rank", type=click.IntRange(min=0), default=None, help="Only this rank (default: every rank).")
@click.option("--no-snapshot", is_flag=True, help="Only the stacks: ask no rank for a CUDA memory snapshot.")
@collector_option
@click.option("--json", "as_json", is_flag=True, help="Print the answers as one JSON document.")
def diagnose(job_id: str, rank: int | None, no_snapshot: bool, collector: str, collectors_before: str,
             tls_ca: str | None, as_json: bool) -> None:
    """Show where a job's ranks are (their Python stacks, grouped) and take CUDA memory snapshots."""
    credential = MungeCredential()
    import grpc
    from clusterwatch.v1 import query_pb2

    address = deployment(collector, collectors_before).for_job(job_id)  # the one collector that holds it
    exit_quickly_when_done()
    try:
        stacks = _ask(address, tls_ca, job_id, rank, "dump_stacks", credential)
        snapshots = query_pb2.AskTrainingResponse() if no_snapshot else \
            _ask(address, tls_ca, job_id, rank, "memory_snapshot", MungeCredential())
    except grpc.RpcError as exc:
        fail(_explain(exc, address, f"diagnose {job_id}"), code=1)
    if as_json:
        from clusterwatch.json_view import dumps

        click.echo(dumps(diagnosis_document(job_id, stacks, snapshots)), nl=False)
    else:
        click.echo(render_diagnosis(stacks, snapshots), nl=False)
    if not any(a.payload for a in stacks.answers):
        sys.exit(1)  # no stacks from any rank: a script must not take that for a diagnosis
