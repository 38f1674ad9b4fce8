"""`clusterwatch record JOBID -o FILE`: write a running job's history as a trace for `replay`."""
from __future__ import annotations

import os

import click

from .common import collector_option, deployment, fail, query_metadata


@click.command()
@click.argument("job_id")
@collector_option
@click.option("-o", "--output", type=click.Path(dir_okay=False, allow_dash=True), required=True,
              help="Trace file to write (JSON lines, docs/traces.md); - for stdout.")
@click.option("--force", is_flag=True, help="Replace the output file if it exists.")
def record(job_id: str, collector: str, collectors_before: str, tls_ca: str | None, output: str, force: bool) -> None:
    """Save the samples the collector holds of JOB_ID, to replay them with `clusterwatch replay`."""
    import grpc
    from clusterwatch.v1 import query_pb2

    from .status_cmd import _explain, _stub

    collector = deployment(collector, collectors_before).for_job(job_id)  # the job's one collector

    if output == "-":
        _record_to_stdout(job_id, collector, tls_ca)
        return
    if os.path.exists(output) and not force:
        fail(f"{output} exists; pass --force to replace it, or -o another file")
    channel, stub = _stub(collector, tls_ca)
    tmp = f"{output}.part"
    lines = 0
    try:
        with open(tmp, "w") as f:
            for chunk in stub.GetTrace(query_pb2.GetTraceRequest(job_id=job_id), timeout=60.0,
                                       metadata=query_metadata()):
                for line in chunk.lines:
                    f.write(line + "\n")
                    lines += 1
        os.replace(tmp, output)
    except grpc.RpcError as exc:
        fail(_explain(exc, collector, f"the trace of {job_id}"), code=1)
    except OSError as exc:
        fail(f"cannot write {output}: {exc.strerror}")
    finally:
        channel.close()
        if os.path.exists(tmp):
            os.unlink(tmp)
    click.echo(f"wrote {lines} samples of job {job_id} to {output}; replay with: clusterwatch replay {output}",
               err=True)


def _record_to_stdout(job_id: str, collector: str, tls_ca: str | None) -> None:
    """`record -o -`: the trace on stdout (for a pipe), the count on stderr."""
    import grpc
    from clusterwatch.v1 import query_pb2

    from .status_cmd import _explain, _stub

    channel, stub = _stub(collector, tls_ca)
    lines = 0
    try:
        for chunk in stub.GetTrace(query_pb2.GetTraceRequest(job_id=job_id), timeout=60.0,
                                   metadata=query_metadata()):
            for line in chunk.lines:
                click.echo(line)
                lines += 1
    except grpc.RpcError as exc:
        fail(_explain(exc, collector, f"the trace of {job_id}"), code=1)
    except BrokenPipeError:  # the reader has enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        return
    finally:
        channel.close()
    click.echo(f"wrote {lines} samples of job {job_id} to stdout", err=True)
