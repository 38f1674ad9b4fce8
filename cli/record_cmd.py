"""`clusterwatch record JOBID -o FILE`: write a running job's history as a trace for `replay`."""
from __future__ import annotations

import json
import os
from collections.abc import Iterator

import click

from .common import collector_option, deployment, fail, query_metadata
from .help_text import examples

#: A process line's readings (docs/traces.md); a line with none of them only opens a process.
_READINGS = ("gpu_mem_bytes", "gpu_util", "rss_bytes", "cpu_percent", "threads", "open_fds")


@click.command(epilog=examples(
    "clusterwatch record 4242 -o job-4242.jsonl",
    "clusterwatch record 4242 -o - | gzip > job-4242.jsonl.gz",
))
@click.argument("job_id")
@collector_option
@click.option("-o", "--output", type=click.Path(dir_okay=False, allow_dash=True), required=True,
              help="Trace file to write (JSON lines, docs/traces.md); - for stdout.")
@click.option("--force", is_flag=True, help="Replace the output file if it exists.")
@click.option("--processes-only", is_flag=True,
              help="Only the processes' samples: no GPU, node or health records (idle_gpu, agent_down and the "
                   "health rules cannot be replayed then), for tools that read only those, such as the traces "
                   "scorer's reference rules.")
def record(job_id: str, collector: str, collectors_before: str, tls_ca: str | None, output: str, force: bool,
           processes_only: bool) -> None:
    """Save the samples the collector holds of JOB_ID, to replay them with `clusterwatch replay`.

    The trace holds what the rules saw: each process's samples with the GPU and node sizes,
    the readings of the job's GPUs and the times its nodes reported, and the health events and
    counters of its GPUs, so that replaying it with the collector's rules file (and XID catalog)
    raises the alerts the collector raised.
    """
    collector = deployment(collector, collectors_before).for_job(job_id)  # the job's one collector
    if output != "-" and os.path.exists(output) and not force:
        fail(f"{output} exists; pass --force to replace it, or -o another file")
    counts = [0, 0]  # process samples, GPU and node records
    if output == "-":
        try:
            for line in _trace_lines(job_id, collector, tls_ca, processes_only, counts):
                click.echo(line)
        except BrokenPipeError:  # the reader has enough
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
            return
        click.echo(f"wrote {_counted(counts)} of job {job_id} to stdout", err=True)
        return
    tmp = f"{output}.part"
    try:
        with open(tmp, "w") as f:
            for line in _trace_lines(job_id, collector, tls_ca, processes_only, counts):
                f.write(line + "\n")
        os.replace(tmp, output)
    except OSError as exc:
        fail(f"cannot write {output}: {exc.strerror}")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    click.echo(f"wrote {_counted(counts)} of job {job_id} to {output}; replay with: clusterwatch replay {output}"
               " --rules RULES (the collector's rules file, for its alerts)", err=True)


def _counted(counts: list[int]) -> str:
    samples, records = counts
    return f"{samples} samples" + (f" and {records} GPU, node and health records" if records else "")


def _trace_lines(job_id: str, collector: str, tls_ca: str | None, processes_only: bool, counts: list[int]
                 ) -> Iterator[str]:
    """The job's trace lines from its collector, counted into `counts`; a failed query ends the command."""
    import grpc
    from clusterwatch.v1 import query_pb2

    from .status_cmd import _explain, _stub

    channel, stub = _stub(collector, tls_ca)
    try:
        for chunk in stub.GetTrace(query_pb2.GetTraceRequest(job_id=job_id), timeout=60.0,
                                   metadata=query_metadata()):
            for line in chunk.lines:
                record = '"kind":' in line
                if processes_only and (record or not _has_reading(line)):
                    continue
                counts[1 if record else 0] += 1
                yield line
    except grpc.RpcError as exc:
        fail(_explain(exc, collector, f"the trace of {job_id}"), code=1)
    finally:
        channel.close()


def _has_reading(line: str) -> bool:
    """Whether a process line carries a reading (the collector also writes lines that only open a process)."""
    try:
        row = json.loads(line)
    except ValueError:
        return False
    return isinstance(row, dict) and any(row.get(k) is not None for k in _READINGS)
