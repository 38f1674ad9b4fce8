"""`clusterwatch status JOBID` and `clusterwatch jobs`: ask the collector, print a report."""
from __future__ import annotations

import os
import sys
import time

import click

from .common import (
    DEFAULT_COLLECTOR,
    MungeCredential,
    collector_option,
    deployment,
    exit_quickly_when_done,
    fail,
    query_channel,
    query_metadata,
)
from .help_text import examples

QUERY_TIMEOUT_S = 5.0


def check_collector_address(address: str) -> None:
    """One line and exit 2 for a --collector gRPC would misread: no port (it dials 443), port 0, a bad number."""
    from .addresses import AddressError
    from .addresses import check_collector_address as check

    try:
        check(address)
    except AddressError as exc:
        fail(f"--collector {exc} (the collector's --listen port, 50051 by default)")


def _stub(address: str, tls_ca: str | None = None, stub_class=None):
    from clusterwatch.v1 import query_pb2_grpc

    check_collector_address(address)
    channel = query_channel(address, tls_ca)
    return channel, (stub_class or query_pb2_grpc.QueryStub)(channel)


def _explain(exc, address: str, what: str) -> str:
    import grpc

    code = exc.code()
    details = exc.details() or ""
    if code == grpc.StatusCode.UNAVAILABLE and "errors resolving" in details:
        host = address.rpartition(":")[0].strip("[]")
        return f"cannot resolve the host {host!r} of --collector {address}; check the name"
    if code == grpc.StatusCode.UNAVAILABLE and ("HTTP/2" in details or "http1" in details.lower()):
        return (f"{address} answers, but not with gRPC: it looks like the collector's /metrics port (9750 by "
                "default); --collector takes its gRPC port (--listen, 50051 by default)")
    if code == grpc.StatusCode.UNAVAILABLE:
        return (f"the collector at {address} does not answer; check --collector / CLUSTERWATCH_COLLECTOR "
                "and that `clusterwatch collector` runs there")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"the collector at {address} did not answer {what} within {QUERY_TIMEOUT_S:.0f} s; it may be overloaded"
    if code == grpc.StatusCode.NOT_FOUND:
        return exc.details()
    if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
        return f"{exc.details()}"
    return f"the collector at {address} failed {what}: {code.name}: {exc.details()}"


def fetch_job(address: str, job_id: str, trend_points: int = 40, credential: MungeCredential | None = None,
              tls_ca: str | None = None):
    """The job's view from the collector; raises grpc.RpcError.

    `credential`: a munge credential started earlier (used once); else a fresh one is made here.
    """
    from clusterwatch.v1 import query_pb2

    channel, stub = _stub(address, tls_ca)
    try:
        return stub.GetJob(query_pb2.GetJobRequest(job_id=job_id, trend_points=trend_points),
                           timeout=QUERY_TIMEOUT_S, metadata=(credential or MungeCredential()).metadata())
    finally:
        channel.close()


def complete_job_ids(ctx: click.Context, param, incomplete: str):
    """Shell completion of JOBID: the running jobs the collector knows (quietly nothing when it is away)."""
    from click.shell_completion import CompletionItem
    from clusterwatch.v1 import query_pb2

    address = ctx.params.get("collector") or os.environ.get("CLUSTERWATCH_COLLECTOR", DEFAULT_COLLECTOR)
    found = []
    for one in address.split(","):
        try:
            channel, stub = _stub(one.strip(), ctx.params.get("tls_ca"))
            try:
                found += stub.ListJobs(query_pb2.ListJobsRequest(), timeout=1.0, metadata=query_metadata()).jobs
            finally:
                channel.close()
        except (Exception, SystemExit):  # away, or a bad --collector: quietly nothing from it
            continue
    return [CompletionItem(j.job_id, help=f"{j.user} {j.name}".strip()) for j in merge_jobs(found)
            if j.job_id.startswith(incomplete)]


def _job_id(ctx: click.Context, param, value: str) -> str:
    if not value.strip():
        raise click.BadParameter("is empty: give a job id, as `clusterwatch jobs` lists them")
    return value


@click.command(epilog=examples(
    "clusterwatch status 4242",
    "clusterwatch status 4242 --watch -n 5",
    "clusterwatch status 4242 --json",
    "clusterwatch status 4242 --collector collector01:50051",
))
@click.argument("job_id", shell_complete=complete_job_ids, callback=_job_id)
@collector_option
@click.option("--json", "as_json", is_flag=True, help="Print the job as one JSON document.")
# a flag, not an option with an optional value: `--watch 4242` took the job id for the interval
@click.option("--watch", "watch", is_flag=True,
              help="Refresh until Ctrl-C: in place on a terminal; else one report (one JSON line) each time.")
@click.option("-n", "--interval", "interval", type=click.FloatRange(min=0.5), default=5.0, show_default=True,
              help="Seconds between refreshes with --watch.")
def status(job_id: str, collector: str, collectors_before: str, tls_ca: str | None, as_json: bool, watch: bool,
           interval: float) -> None:
    """Show a job: its nodes, ranks and GPUs, memory and utilisation trends, alerts and advice."""
    # `munge -n` runs (on another core) while grpc and protobuf import; the first request takes its credential
    credential: MungeCredential | None = MungeCredential()
    import grpc

    collector = deployment(collector, collectors_before).for_job(job_id)  # the one collector that holds it

    def once() -> str:
        nonlocal credential
        try:
            view = fetch_job(collector, job_id, credential=credential, tls_ca=tls_ca)
        except grpc.RpcError as exc:
            fail(_explain(exc, collector, f"status {job_id}"), code=1)
        finally:
            credential = None  # used: a later refresh makes a fresh one
        if as_json:  # docs/json.md
            from clusterwatch.json_view import dumps, status_document

            # a stream a script reads: one document a line
            return dumps(status_document(view), one_line=watch and not tty)
        from clusterwatch.report import render

        return render(view)

    tty = sys.stdout.isatty()
    if not watch:
        exit_quickly_when_done()
        click.echo(once(), nl=False)
        return
    try:
        while True:
            text = once()
            if tty:  # clear the screen and home the cursor, then draw: refresh in place
                sys.stdout.write("\x1b[H\x1b[2J" + text)
            elif as_json:
                sys.stdout.write(text)
            else:  # a file or a pipe gets no terminal codes: one report after another
                sys.stdout.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n{text}")
            sys.stdout.flush()
            time.sleep(interval)
    except KeyboardInterrupt:
        pass
    except BrokenPipeError:  # `| head` has read enough: leave quietly, as other filters do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


@click.command(epilog=examples(
    "clusterwatch jobs",
    "clusterwatch jobs --all",
    "clusterwatch jobs --json",
))
@collector_option
@click.option("--all", "include_ended", is_flag=True, help="Also list jobs that have ended.")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def jobs(collector: str, collectors_before: str, tls_ca: str | None, include_ended: bool, as_json: bool) -> None:
    """List the jobs the collectors know, with their firing alerts."""
    credential = MungeCredential()  # made while grpc and protobuf import, as in status
    from clusterwatch.v1 import query_pb2

    exit_quickly_when_done()
    request = query_pb2.ListJobsRequest(include_ended=include_ended)
    answers, partial = ask_all(deployment(collector, collectors_before).all, tls_ca, "the job list",
                      lambda stub, metadata: stub.ListJobs(request, timeout=QUERY_TIMEOUT_S, metadata=metadata),
                      credential)
    resp = query_pb2.ListJobsResponse(jobs=merge_jobs([j for a in answers for j in a.jobs]))
    for a in answers:
        for job_id, firing in a.firing_alerts.items():
            resp.firing_alerts[job_id] = resp.firing_alerts[job_id] + firing
    if as_json:  # docs/json.md
        from clusterwatch.json_view import dumps, jobs_document

        click.echo(dumps(jobs_document(resp)), nl=False)
    else:
        from clusterwatch.report import render_jobs

        click.echo(render_jobs(list(resp.jobs), dict(resp.firing_alerts), time.time(), include_ended), nl=False)
    if partial:
        sys.exit(1)


def ask_all(addresses: tuple[str, ...], tls_ca: str | None, what: str, call, credential: MungeCredential | None = None,
            stub_class=None):
    """`call(stub, metadata)` on every collector at once: the answers of those that answered, and whether
    one did not.

    One that does not answer gets one line on stderr and the command still shows the others, then exits 1
    (a script must not take a part for the whole); none answering is one line and exit 1. A munge
    credential is good for one request, so each collector gets its own.
    """
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    def one(address: str, cred: MungeCredential):
        channel, stub = _stub(address, tls_ca, stub_class)  # the Query service's unless another is named
        try:
            return call(stub, cred.metadata())
        except grpc.RpcError as exc:
            return exc
        finally:
            channel.close()

    creds = [credential or MungeCredential()] + [MungeCredential() for _ in addresses[1:]]
    if len(addresses) == 1:
        results = [one(addresses[0], creds[0])]
    else:
        with ThreadPoolExecutor(max_workers=min(16, len(addresses))) as pool:
            results = list(pool.map(one, addresses, creds))
    answers = [r for r in results if not isinstance(r, grpc.RpcError)]
    for address, r in zip(addresses, results, strict=True):
        if isinstance(r, grpc.RpcError):
            message = _explain(r, address, what)
            if not answers:
                fail(message, code=1)
            click.echo(f"clusterwatch: {message}; showing what the other collectors hold", err=True)
    return answers, len(answers) < len(results)


def merge_jobs(found) -> list:
    """One entry per job id, the running or latest one when two collectors name it; in the collectors' order."""
    best: dict[str, object] = {}
    for j in found:
        held = best.get(j.job_id)
        if held is None or (not j.end_time, j.start_time) > (not held.end_time, held.start_time):
            best[j.job_id] = j
    return list(best.values())
