"""`clusterwatch agent`: sample this node and stream to the collector."""
from __future__ import annotations

import logging
import signal
import socket
import sys
import threading
import time

import click

from .common import fail, setup_logging


@click.command()
@click.option("--collector", envvar="CLUSTERWATCH_COLLECTOR", metavar="HOST:PORT",
              help="Collector address (CLUSTERWATCH_COLLECTOR).")
@click.option("--node", envvar="CLUSTERWATCH_NODE", default=None,
              help="Node name (default: SLURMD_NODENAME, else the host name).")
@click.option("--interval", type=click.FloatRange(min=0.1), default=5.0, envvar="CLUSTERWATCH_INTERVAL",
              show_default=True, help="Poll interval in seconds.")
@click.option("--send-interval", type=click.FloatRange(min=0.0), default=5.0, envvar="CLUSTERWATCH_SEND_INTERVAL",
              show_default=True,
              help="Send a batch this often, joining the polls in between (0: every poll; a job event goes at once).")
@click.option("--gpu-source", type=click.Choice(["auto", "nvml", "sim", "none"]), default="auto",
              envvar="CLUSTERWATCH_GPU_SOURCE", show_default=True,
              help="Where GPU data comes from; `sim` plays a scenario for machines without a GPU.")
@click.option("--sim-scenario", type=click.Path(dir_okay=False), default=None,
              help="Scenario file for --gpu-source sim (default: the embedded scenario).")
@click.option("--sim-run", envvar="CLUSTERWATCH_SIM_RUN", default=None, metavar="TOKEN",
              help="With --gpu-source sim: play only processes whose CLUSTERWATCH_SIM_RUN is TOKEN "
                   "(default: only those without one) (CLUSTERWATCH_SIM_RUN).")
@click.option("--pid", "pids", type=int, multiple=True, help="Also watch this process and its children.")
@click.option("--job-id", "local_job_id", default="", help="Job id given to the --pid trees.")
@click.option("--once", is_flag=True, help="Take one poll, print it and exit.")
@click.option("--json", "as_json", is_flag=True, help="With --once: print the batch as JSON.")
@click.option("--token", envvar="CLUSTERWATCH_TOKEN", default=None, help="Shared secret for the collector.")
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
              show_default=True, help="Unix socket where clusterwatch.train reports arrive.")
@click.option("--provenance/--no-provenance", default=True, show_default=True,
              help="Record the git provenance of each rank process (git runs as the process's owner).")
@click.option("--ensure", is_flag=True,
              help="Start the agent detached (as the prolog does) unless its pid file names a live one; exit 0.")
@click.option("-v", "--verbose", count=True)
def agent(collector, node, interval, send_interval, gpu_source, sim_scenario, sim_run, pids, local_job_id, once,
          as_json, token, tls_ca, tls_cert, tls_key,
          spool_dir, buffer_samples, train_socket, provenance, ensure, verbose) -> None:
    """Sample this node's GPU processes (and --pid trees) and stream them to the collector."""
    import os

    # gRPC's fork handlers run in every child the agent forks (git for provenance runs as the
    # process's owner, which needs fork, not vfork) and crashed git while the stream was busy.
    # The agent never uses gRPC in a child, so they are switched off before gRPC loads.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    setup_logging(verbose)

    from clusterwatch.agent.config import AgentConfig

    if not once and not collector:
        fail("no collector address: pass --collector HOST:PORT or set CLUSTERWATCH_COLLECTOR "
             "(or use --once --json to print one poll)")
    node = node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    from clusterwatch.agent.spool import spool_dir_for

    spool_dir = spool_dir_for(spool_dir, node)
    if ensure:
        sys.exit(ensure_running(collector, node, spool_dir, gpu_source, interval, token))
    config = AgentConfig(
        collector=collector, node=node, interval_s=interval, send_interval_s=send_interval, gpu_source=gpu_source,
        sim_scenario=sim_scenario, sim_run=sim_run,
        pids=tuple(pids), local_job_id=local_job_id, buffer_max_samples=buffer_samples, token=token,
        spool_dir=spool_dir, train_socket=train_socket, provenance=provenance,
        tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key,
    )
    from clusterwatch.errors import ConfigError
    from clusterwatch.tls import check_client_pair

    try:
        check_client_pair(tls_cert, tls_key, tls_ca)
    except ConfigError as exc:
        fail(str(exc))
    if not once:
        claim_spool_or_exit(spool_dir)  # before anything is opened: a second agent must touch nothing
    agent_obj = build_agent(config, live=not once)
    if once:
        from clusterwatch.agent.agent import batch_as_json

        agent_obj.poll()  # a first pass, so CPU percentages have a previous reading
        time.sleep(min(0.5, interval))
        batch, samples = agent_obj.poll()
        if as_json:
            click.echo(batch_as_json(batch, agent_obj.hello()))
        else:
            # a header always: with no job process on the node the rows alone were nothing at all, exit 0
            hello = agent_obj.hello()
            click.echo(f"one poll of {hello.node} (GPU source {hello.gpu_source}): {len(samples)} process(es) of "
                       f"jobs, {len(hello.gpus)} GPU(s); --json prints the whole batch")
            for s in samples:
                click.echo(f"{s.pid:>8} {s.command:<16} job={s.job_id or '-':<10} cpu={s.cpu_percent}% "
                           f"rss={s.rss_bytes} gpu_mem={s.gpu_memory_bytes}")
        agent_obj.gpus.close()
        return
    sys.exit(run_agent(agent_obj))


def claim_spool_or_exit(spool_dir: str) -> None:
    """Take the spool folder's run lock for this agent's life, or exit with one line when another agent has it.

    Two agents of one node would sample it twice (and fight over its training socket).
    """
    import os

    from clusterwatch.agent.ensure import PID_FILE, claim_spool, read_pid

    try:
        claimed = claim_spool(spool_dir) is not None  # the descriptor stays open, unclosed, for the agent's life
    except OSError as exc:  # an unwritable folder: the pid file cannot be written either; run unguarded
        logging.getLogger("clusterwatch.agent").warning(
            "cannot lock %s (%s): not guarded against a second agent", spool_dir, exc.strerror or exc)
        return
    if not claimed:
        other = read_pid(os.path.join(spool_dir, PID_FILE))
        fail(f"another agent runs for {spool_dir} (pid {other or 'unknown'}); this one exits, so the node is "
             "not sampled twice", code=1)


def build_agent(config, live: bool = True):
    """The agent with its sources, from a config (GPU source falls back to none with one clear line).

    `live` also opens the training-report socket and the provenance worker (not for --once).
    """
    from clusterwatch.agent.agent import Agent
    from clusterwatch.agent.backends.procs import ProcSource
    from clusterwatch.agent.labels import JobLabeler
    from clusterwatch.agent.slurm_lookup import ProcLookup
    from clusterwatch.agent.spool import JobSpool

    gpus = open_gpus(config)
    local_roots = {pid: config.local_job_id for pid in config.pids if config.local_job_id}
    lookup = ProcLookup(node=config.node)
    cache: dict = {}
    labeler = JobLabeler(local_roots, slurm_lookup=lookup.slurm_labels, local_lookup=lookup.rank_labels)
    spool = JobSpool(config.spool_dir, find_job_pids=lambda jobs: lookup.job_pids(jobs, cache))
    train_drain = provenance = None
    if live:
        train_drain = open_train_endpoint(config.train_socket)
        if config.provenance:
            from clusterwatch.agent.provenance_worker import ProvenanceWorker

            provenance = ProvenanceWorker()
    return Agent(config, gpus, ProcSource(config.node, count_fds=config.count_fds), labeler, spool=spool,
                 train_drain=train_drain, provenance=provenance)


def open_train_endpoint(path: str | None):
    """Start listening for clusterwatch.train reports; None (with one line) when the socket cannot be made."""
    if not path:
        return None
    from clusterwatch.agent.train_endpoint import TrainEndpoint

    endpoint = TrainEndpoint(path)
    try:
        endpoint.start()
    except OSError as exc:
        logging.getLogger("clusterwatch.agent").warning(
            "cannot listen for training reports on %s (%s); running without them. "
            "Pass --train-socket with a writable path.", path, exc.strerror or exc)
        return None
    return endpoint.drain


def ensure_running(collector, node, spool_dir, gpu_source, interval, token) -> int:
    """`agent --ensure`: start this node's agent detached unless one runs; say which; return 0."""
    import os

    from clusterwatch.agent.ensure import agent_command, agent_environment, ensure_agent

    argv = agent_command(collector, node, spool_dir, gpu_source, interval)
    try:
        result = ensure_agent(spool_dir, argv, agent_environment(os.environ, token), lock_wait_s=5.0)
    except OSError as exc:
        fail(f"cannot start the agent in {spool_dir}: {exc}; check that the folder is writable")
    if result.action == "busy":
        click.echo(f"another process is starting the agent of {node} ({spool_dir}/agent.lock is held)")
    else:
        pid = result.pid if result.pid is not None else "not written yet"
        click.echo(f"agent of {node} {result.action}, pid {pid}")
    return 0


def open_gpus(config):
    from clusterwatch.errors import ConfigError

    log = logging.getLogger("clusterwatch.agent")
    try:
        from clusterwatch.agent.backends.select import open_gpu_source
    except ImportError:  # the GPU backends are not installed in this build
        from clusterwatch.agent.backends.gpu import NoGpuSource

        log.warning("no GPU backend available; running without GPU data")
        return NoGpuSource()
    try:
        return open_gpu_source(config.gpu_source, config.sim_scenario, log, node=config.node,
                               interval_s=config.interval_s, sim_run=config.sim_run)
    except ConfigError as exc:
        fail(str(exc))


def channel_credentials(config):
    """TLS (and mutual TLS) credentials for the stream, None for plaintext; a bad file exits with one line."""
    from clusterwatch.errors import ConfigError
    from clusterwatch.tls import channel_credentials as build

    try:
        return build(config.tls_ca, config.tls_cert, config.tls_key)
    except ConfigError as exc:
        fail(str(exc))


def run_agent(agent_obj) -> int:
    """Run until SIGTERM/SIGINT; then flush, print the counters line and return 0."""
    from clusterwatch.agent.agent import PollJoiner, run_loop, submit, write_pid_file
    from clusterwatch.agent.signals import SignalHandler
    from clusterwatch.agent.stream import Sender

    config = agent_obj.config
    on_signal = SignalHandler(agent_obj.procs.start_time, agent_obj.procs.is_known)
    sender = Sender(config.collector, agent_obj.hello, config.buffer_max_samples, token=config.token,
                    channel_credentials=channel_credentials(config), on_signal=on_signal)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    write_pid_file(config.spool_dir)
    sender.start()
    logging.getLogger("clusterwatch.agent").info(
        "agent on %s: polling every %.1fs, GPU source %s, collector %s",
        config.node, config.interval_s, agent_obj.gpus.name, config.collector)
    joiner = PollJoiner(config.interval_s, config.send_interval_s)
    run_loop(agent_obj, sender, stop, joiner)
    # a last poll so the final state (e.g. a job's end event) goes out with the polls held, then flush
    try:
        due = joiner.add(*agent_obj.poll_parts(), time.monotonic())
        if due is not None:
            submit(agent_obj, sender, *due)
    except Exception:
        logging.getLogger("clusterwatch.agent").exception("the last poll failed; what was held is sent")
    held = joiner.take()
    if held is not None:
        submit(agent_obj, sender, *held)
    sender.flush(timeout=5.0)
    sender.stop()
    if agent_obj.provenance is not None:
        agent_obj.provenance.stop()  # no git of ours outlives the agent
    agent_obj.gpus.close()
    c = sender.counters
    click.echo(f"samples_sent={c.samples_sent} samples_acked={c.samples_acked} "
               f"samples_dropped={c.samples_dropped}")
    return 0
