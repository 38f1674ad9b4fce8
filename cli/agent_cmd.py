"""`clusterwatch agent`: sample this node and stream to the collector."""
from __future__ import annotations

import socket
import sys

import click

from .common import fail, resolve_token, setup_logging, token_file_option
from .help_text import examples


@click.command(epilog=examples(
    "clusterwatch agent --collector collector01:50051",
    "clusterwatch agent --once --json    # one poll of this node, printed",
    "clusterwatch agent --collector collector01:50051 --gpu-source sim --node sim1",
))
@click.option("--collector", envvar="CLUSTERWATCH_COLLECTOR", metavar="HOST:PORT[,...]",
              help="Collector address, or the deployment's collectors list in its one order (the config file's "
                   "collectors = [...]): a stream to each collector this node has data for (CLUSTERWATCH_COLLECTOR).")
@click.option("--collectors-before", envvar="CLUSTERWATCH_COLLECTORS_BEFORE", default="", metavar="JOB=HOST:PORT,...",
              help="After a change of the list: the first job number of --collector, then the list the jobs "
                   "below it started on (they stay there) (CLUSTERWATCH_COLLECTORS_BEFORE).")
@click.option("--node", envvar="CLUSTERWATCH_NODE", default=None,
              help="Node name (default: SLURMD_NODENAME, else the host name).")
@click.option("--interval", type=click.FloatRange(min=0.1), default=5.0, envvar="CLUSTERWATCH_INTERVAL",
              show_default=True, help="Poll interval in seconds.")
@click.option("--send-interval", type=click.FloatRange(min=0.0), default=5.0, envvar="CLUSTERWATCH_SEND_INTERVAL",
              show_default=True,
              help="Send a batch this often, joining the polls in between (0: every poll; a job event goes at once).")
@click.option("--health-interval", type=click.FloatRange(min=1.0), default=30.0, envvar="CLUSTERWATCH_HEALTH_INTERVAL",
              show_default=True,
              help="Read the GPUs' health counters (ECC, throttling, PCIe and NVLink errors) this often, in seconds.")
@click.option("--gpu-source", type=click.Choice(["auto", "nvml", "sim", "none"]), default="auto",
              envvar="CLUSTERWATCH_GPU_SOURCE", show_default=True,
              help="Where GPU data comes from; `sim` plays a scenario for machines without a GPU.")
@click.option("--sim-scenario", type=click.Path(dir_okay=False), default=None,
              help="Scenario file for --gpu-source sim (default: the embedded scenario).")
@click.option("--sim-run", envvar="CLUSTERWATCH_SIM_RUN", default=None, metavar="TOKEN",
              help="With --gpu-source sim: play only processes whose CLUSTERWATCH_SIM_RUN is TOKEN "
                   "(default: only those without one) (CLUSTERWATCH_SIM_RUN).")
@click.option("--process-source", type=click.Choice(["auto", "proc", "psutil"]), default="auto", show_default=True,
              help="Where process figures come from: Linux /proc, or psutil (CPU and memory where there is no "
                   "/proc, e.g. macOS); auto picks /proc when there is one.")
@click.option("--pid", "pids", multiple=True, metavar="PID[:STARTTIME]",
              help="Also watch this process and its children, while it is the process that started at STARTTIME "
                   "(Unix seconds; default: the start time it has when the agent starts): a pid reused by "
                   "another process is not followed.")
@click.option("--job-id", "local_job_id", default="", help="Job id given to the --pid trees.")
@click.option("--once", is_flag=True, help="Take one poll, print it and exit.")
@click.option("--json", "as_json", is_flag=True, help="With --once: print the batch as JSON.")
@click.option("--token", envvar="CLUSTERWATCH_TOKEN", default=None, help="Shared secret for the collector.")
@token_file_option
@click.option("--agent-auth", type=click.Choice(["auto", "munge", "token", "tls", "none"]), default="auto",
              show_default=True, envvar="CLUSTERWATCH_AGENT_AUTH",
              help="What the agent proves to the collector: auto (the token and certificate when given, and a "
                   "munge credential where munge is installed), munge (a credential always: root on this node), "
                   "token, tls or none (no munge credential) (CLUSTERWATCH_AGENT_AUTH).")
@click.option("--munge-socket", default=None, envvar="CLUSTERWATCH_MUNGE_SOCKET",
              help="munged's socket, when not the default (CLUSTERWATCH_MUNGE_SOCKET).")
@click.option("--tls-ca", type=click.Path(exists=True, dir_okay=False), envvar="CLUSTERWATCH_TLS_CA",
              help="Talk TLS to the collector, trusting this CA (PEM).")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), envvar="CLUSTERWATCH_TLS_CERT",
              help="Client certificate for mutual TLS (PEM).")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), envvar="CLUSTERWATCH_TLS_KEY",
              help="The client certificate's private key (PEM).")
@click.option("--spool-dir", default=None, envvar="CLUSTERWATCH_SPOOL",
              help="This node's folder for the prolog/epilog's job events and the pid file "
                   "(default: /run/clusterwatch/<node>; '{node}' is replaced by the node name).")
@click.option("--buffer-samples", type=click.IntRange(min=1), default=100_000, show_default=True,
              help="Unacknowledged samples kept while the collector is away (oldest dropped first).")
@click.option("--train-socket", envvar="CLUSTERWATCH_TRAIN_SOCKET", default="/run/clusterwatch/train.sock",
              show_default=True, help="Unix socket where clusterwatch.train reports arrive; one agent per path "
                                      "(it holds PATH.lock): a second one runs without training reports.")
@click.option("--kmsg", envvar="CLUSTERWATCH_KMSG", default="/dev/kmsg", show_default=True, metavar="PATH",
              help="Kernel log read for the NVIDIA driver's XID lines, from this boot on ('none': not read) "
                   "(CLUSTERWATCH_KMSG).")
@click.option("--ib-sysfs", envvar="CLUSTERWATCH_IB_SYSFS", default="/sys/class/infiniband", show_default=True,
              metavar="PATH", help="The InfiniBand / RoCE ports' sysfs folder, read for link flaps, rate and errors "
                                   "('none': not read) (CLUSTERWATCH_IB_SYSFS).")
@click.option("--ib-expect-rate", envvar="CLUSTERWATCH_IB_EXPECT_RATE", default="", metavar="GBPS[,DEVICE[/PORT]=GBPS]",
              help="The rate, Gb/s, the ports should run at, so a link that trains narrow or slow at boot is "
                   "fabric_port's `degraded`: GBPS for every port, DEVICE=GBPS or DEVICE/PORT=GBPS for some, comma "
                   "separated (200,mlx5_4=100); off by default, as a split cable's halves run at 2X (HDR100 is 2X "
                   "HDR, 100 Gb/s) (CLUSTERWATCH_IB_EXPECT_RATE).")
@click.option("--tmpfs-interval", envvar="CLUSTERWATCH_TMPFS_INTERVAL", type=click.FloatRange(min=0), default=30.0,
              show_default=True, metavar="SECONDS",
              help="How often the node's tmpfs (/dev/shm, ...) is walked for what each user's files hold, counted in "
                   "the host memory of the user's jobs on the node; 0: not walked (CLUSTERWATCH_TMPFS_INTERVAL).")
@click.option("--provenance/--no-provenance", default=True, show_default=True,
              help="Record the git provenance of each rank process (git runs as the process's owner).")
@click.option("--read-job-output/--no-read-job-output", default=False, show_default=True,
              envvar="CLUSTERWATCH_READ_JOB_OUTPUT",
              help="Read the progress of jobs that do not call clusterwatch.train from their output files (tqdm, "
                   "Hugging Face Trainer, Lightning), each opened as its owner: off unless the site allows it "
                   "(CLUSTERWATCH_READ_JOB_OUTPUT).")
@click.option("--job-output-regex", default="", envvar="CLUSTERWATCH_JOB_OUTPUT_REGEX", metavar="REGEX",
              help="With --read-job-output: the site's pattern for progress lines, with named groups step, loss "
                   "and lr (CLUSTERWATCH_JOB_OUTPUT_REGEX).")
@click.option("--ensure", is_flag=True,
              help="Start the agent detached (as the prolog does) unless its pid file names a live one; exit 0.")
@click.option("--poll-on-sigusr1", is_flag=True, hidden=True,
              help="The first poll waits for SIGUSR1, and each SIGUSR1 asks for a poll now (`clusterwatch run` "
                   "starts its command once this agent listens for its reports, before its first poll).")
@click.option("-v", "--verbose", count=True,
              help="More log lines: -v adds the libraries' INFO lines (clusterwatch's own show always), -vv DEBUG.")
def agent(collector, collectors_before, node, interval, send_interval, health_interval, gpu_source, sim_scenario,
          sim_run, process_source, pids,
          local_job_id, once,
          as_json, token, token_file, agent_auth, munge_socket, tls_ca, tls_cert, tls_key,
          spool_dir, buffer_samples, train_socket, kmsg, ib_sysfs, ib_expect_rate, tmpfs_interval, provenance,
          read_job_output, job_output_regex, ensure, poll_on_sigusr1, verbose) -> None:
    """Sample this node's GPU processes (and --pid trees) and stream them to the collector."""
    import os

    # gRPC's fork handlers run in every child the agent forks (git for provenance runs as the
    # process's owner, which needs fork, not vfork) and can crash git while the stream is busy.
    # The agent never uses gRPC in a child, so they are switched off before gRPC loads.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    setup_logging(verbose)
    token = resolve_token(token, token_file)  # one line and exit 2 when unfit

    from clusterwatch.agent.config import AgentConfig
    from clusterwatch.agent.runtime import AgentRuntime, SpoolTaken, polls_on_sigusr1, stop_on_signals
    from clusterwatch.agent.spool import spool_dir_for

    from clusterwatch.errors import ClusterwatchError, ConfigError
    from clusterwatch.tls import check_client_pair

    if agent_auth == "token" and not token:
        fail("--agent-auth token needs --token (or CLUSTERWATCH_TOKEN): the collector's secret")
    if agent_auth == "tls" and not tls_cert:
        fail("--agent-auth tls needs --tls-cert and --tls-key: this node's client certificate")
    if not once and not collector:
        fail("no collector address: pass --collector HOST:PORT or set CLUSTERWATCH_COLLECTOR "
             "(or use --once --json to print one poll)")
    if collector:
        from .common import deployment

        deployment(collector, collectors_before)  # a malformed list: one line and exit 2
    elif collectors_before:
        fail("--collectors-before needs --collector (the current list)")
    from clusterwatch.agent.health.fabric import parse_expected_rates
    from clusterwatch.agent.roots import parse_root

    try:
        roots = tuple(parse_root(p) for p in pids)
        ib_expect = parse_expected_rates(ib_expect_rate)
    except ConfigError as exc:
        fail(str(exc))
    node = node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    spool_dir = spool_dir_for(spool_dir, node)
    if ensure:
        sys.exit(ensure_running(collector, node, spool_dir, gpu_source, interval, token, collectors_before))
    config = AgentConfig(
        collector=collector, node=node, interval_s=interval, send_interval_s=send_interval,
        health_interval_s=health_interval, gpu_source=gpu_source,
        sim_scenario=sim_scenario, sim_run=sim_run,
        pids=roots, local_job_id=local_job_id, buffer_max_samples=buffer_samples, token=token,
        agent_auth=agent_auth, munge_socket=munge_socket,
        spool_dir=spool_dir, train_socket=train_socket, provenance=provenance,
        tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key, process_source=process_source,
        kmsg=None if kmsg in ("", "none") else kmsg, collectors_before=collectors_before,
        read_job_output=read_job_output, job_output_regex=job_output_regex,
        ib_sysfs=None if ib_sysfs in ("", "none") else ib_sysfs, ib_expect=ib_expect,
        tmpfs_interval_s=tmpfs_interval,
    )
    # Before anything is opened: a SIGTERM while NVML opens stops the run it starts, and close()
    # removes the train socket (the default action would leave it behind).
    stop = None if once else stop_on_signals()
    wake = polls_on_sigusr1(stop) if poll_on_sigusr1 and not once else None
    try:
        check_client_pair(tls_cert, tls_key, tls_ca)
        runtime = AgentRuntime.from_config(config, live=not once)
    except SpoolTaken as exc:
        fail(str(exc), code=1)
    except ConfigError as exc:
        fail(str(exc))
    except ClusterwatchError as exc:
        fail(str(exc), code=1)
    if once:
        print_one_poll(runtime, as_json)
        runtime.close()
        return
    counters = runtime.run(stop, wake)
    streams = runtime.sender.senders if runtime.sender is not None else {}
    if len(streams) > 1:  # each stream's own, then the whole (the last line, as with one collector)
        for address, sender in streams.items():
            c = sender.counters
            click.echo(f"collector {address}: samples_sent={c.samples_sent} samples_acked={c.samples_acked} "
                       f"samples_dropped={c.samples_dropped} samples_unsent={c.samples_unsent} "
                       f"streams_refused={c.streams_refused}")
    click.echo(f"samples_sent={counters.samples_sent} samples_acked={counters.samples_acked} "
               f"samples_dropped={counters.samples_dropped} samples_unsent={counters.samples_unsent} "
               f"streams_refused={counters.streams_refused}")


def print_one_poll(runtime, as_json: bool) -> None:
    """`--once`: one poll, as JSON or as a header and a line a process."""
    from clusterwatch.agent.agent import batch_as_json

    batch, samples = runtime.one_poll()
    hello = runtime.agent.hello()
    if as_json:
        click.echo(batch_as_json(batch, hello))
        return
    # a header always: with no job process on the node the rows alone would be nothing at all
    click.echo(f"one poll of {hello.node} (GPU source {hello.gpu_source}): {len(samples)} process(es) of "
               f"jobs, {len(hello.gpus)} GPU(s); --json prints the whole batch")
    for s in samples:
        click.echo(f"{s.pid:>8} {s.command:<16} job={s.job_id or '-':<10} cpu={s.cpu_percent}% "
                   f"rss={s.rss_bytes} gpu_mem={s.gpu_memory_bytes}")


def ensure_running(collector, node, spool_dir, gpu_source, interval, token, collectors_before="") -> int:
    """`agent --ensure`: start this node's agent detached unless one runs; say which; return 0."""
    import os

    from clusterwatch.agent.ensure import SpoolNotPrivate, agent_command, agent_environment, ensure_agent

    argv = agent_command(collector, node, spool_dir, gpu_source, interval, collectors_before=collectors_before)
    try:
        result = ensure_agent(spool_dir, argv, agent_environment(os.environ, token), lock_wait_s=5.0)
    except SpoolNotPrivate as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot start the agent in {spool_dir}: {exc}; check that the folder is writable")
    if result.action == "busy":
        click.echo(f"another process is starting the agent of {node} ({spool_dir}/agent.lock is held)")
    else:
        pid = result.pid if result.pid is not None else "not written yet"
        click.echo(f"agent of {node} {result.action}, pid {pid}")
    return 0
