"""`clusterwatch prolog` and `clusterwatch epilog`: the Slurm node hooks.

slurmd drains a node whose Prolog or Epilog fails or hangs, so both commands always exit 0 and give up
after HOOK_DEADLINE_S whatever happens (collector down, agent missing, spool unwritable, a garbled
environment); anything that went wrong is one line on stderr. They call no Slurm command and talk to
nobody: the prolog writes a "start" event file into the node's spool and makes sure the node's agent
runs (starting it detached when needed); the epilog writes an "end" event file. The agent picks the
files up on its next poll and sends them to the collector.

The one exception is the health gate (`prolog --gate`, off by default): on a node its agent knows to be
unfit, the prolog exits 1 with the reason, and Slurm drains the node and requeues the job
(cli/health_gate.py; docs/how-to/gate-jobs-on-gpu-health.md).

Imports stay small (no grpc, no psutil): this runs for every job on every node.
"""
from __future__ import annotations

import os
import signal
import sys
import time

import click

from .help_text import examples

#: A hook that has not finished by then exits 0 anyway (slurmd's timeouts are far longer, but a slow
#: hook delays every job start).
HOOK_DEADLINE_S = 0.9
#: Agent settings a hook reads from the config file's [agent] section.
_AGENT_KEYS = ("collector", "collectors_before", "token", "token_file", "gpu_source", "spool_dir", "interval", "node")


def _say(hook: str, message: str) -> None:
    # One write, so lines of prologs running at once do not interleave.
    try:
        os.write(2, f"clusterwatch {hook}: {message}\n".encode(errors="replace"))
    except OSError:
        pass


def _arm_deadline(hook: str) -> None:
    def expired(signum, frame):  # noqa: ARG001
        _say(hook, f"gave up after {HOOK_DEADLINE_S:g} s; exiting 0 so the node stays up")
        os._exit(0)

    signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, HOOK_DEADLINE_S)


def _settings(ctx: click.Context, given: dict) -> dict:
    """Flags and CLUSTERWATCH_* variables (click resolved those), else the config file's [agent] section."""
    root = ctx.find_root().default_map or {}
    from_file = root.get("agent", {}) if isinstance(root, dict) else {}
    out = {}
    for key in _AGENT_KEYS:
        value = given.get(key)
        out[key] = value if value not in (None, "") else from_file.get(key)
    return out


def _job_id(env: dict[str, str]) -> str:
    from clusterwatch.errors import ConfigError

    job_id = (env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or "").strip()
    if not job_id.isdigit() or len(job_id) > 20:
        raise ConfigError(f"SLURM_JOB_ID is {job_id[:40]!r}, not a job number; is this run by slurmd?")
    return job_id


def _int_or(value: str | None, default: int) -> int:
    value = (value or "").strip()
    return int(value) if value.isdigit() else default


def exit_code_from(env: dict[str, str]) -> int | None:
    """The job's exit code from an epilog's environment, None when Slurm did not give one.

    ``SLURM_JOB_EXIT_CODE2`` is ``code:signal`` (as ``ExitCode=`` in scontrol); a job killed by a signal
    counts as 128 + signal, as a shell would say. ``SLURM_JOB_EXIT_CODE`` is the raw wait status.
    """
    pair = env.get("SLURM_JOB_EXIT_CODE2", "").strip()
    code, sep, sig = pair.partition(":")
    if sep and code.isdigit() and sig.isdigit():
        return int(code) if int(sig) == 0 else 128 + int(sig)
    raw = env.get("SLURM_JOB_EXIT_CODE", "").strip()
    if raw.isdigit():
        status = int(raw)
        return (status >> 8) & 0xFF if status & 0x7F == 0 else 128 + (status & 0x7F)
    return None


def _node(settings: dict, env: dict[str, str]) -> str:
    return settings.get("node") or env.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]


def _gpu_uuids(value: str | None) -> str:
    """The value when it names GPUs by UUID (GPU-..., MIG-...), else empty."""
    entries = [e.strip() for e in (value or "").split(",") if e.strip()]
    return value if entries and all(e.startswith(("GPU-", "MIG-")) for e in entries) else ""


def _event(kind: str, env: dict[str, str], exit_code: int | None = None):
    from clusterwatch.model import JobEvent

    return JobEvent(
        kind=kind, job_id=_job_id(env), time=time.time(), uid=_int_or(env.get("SLURM_JOB_UID"), 0),
        user=(env.get("SLURM_JOB_USER") or "")[:64],
        # Indexes as Slurm numbers them on this node; the agent turns them into UUIDs. Under MIG,
        # CUDA_VISIBLE_DEVICES holds the instances' MIG-... UUIDs, which name them exactly.
        gpu_indexes=(_gpu_uuids(env.get("CUDA_VISIBLE_DEVICES")) or env.get("SLURM_JOB_GPUS")
                     or env.get("CUDA_VISIBLE_DEVICES") or "")[:256],
        exit_code=exit_code,
    )


def run_hook(kind: str, settings: dict, env: dict[str, str]) -> None:
    """Write the job event and, for the prolog, make sure the agent runs; never raises.

    Args:
        kind: "prolog" or "epilog".
        settings: collector, token, token_file, gpu_source, spool_dir, interval, node (None where unset).
        env: the hook's environment, as slurmd set it.
    """
    from clusterwatch.agent.ensure import SpoolNotPrivate
    from clusterwatch.agent.spool import spool_dir_for, write_event

    try:
        node = _node(settings, env)
        spool = spool_dir_for(settings.get("spool_dir"), node)
        event = _event("start", env) if kind == "prolog" else _event("end", env, exit_code_from(env))
    except Exception as exc:  # a garbled environment: say so once, the node stays up
        _say(kind, f"ignored: {exc}")
        return
    try:
        write_event(spool, event)
    except SpoolNotPrivate as exc:  # the agent would not be started there either
        _say(kind, f"job {event.job_id}: not announced: {exc}")
        return
    except OSError as exc:
        _say(kind, f"job {event.job_id}: cannot write its event into {spool} ({exc.strerror or exc}); "
                   "check that the folder is writable by slurmd's user")
    if kind == "prolog":
        _ensure(settings, env, node, spool)


def _ensure(settings: dict, env: dict[str, str], node: str, spool: str) -> None:
    from clusterwatch.agent.ensure import agent_command, agent_environment, ensure_agent

    from clusterwatch.errors import ClusterwatchError, ConfigError

    collector = settings.get("collector")
    if not collector:
        _say("prolog", "no collector address (CLUSTERWATCH_COLLECTOR, --collector or [agent] collector); "
                       "the agent is not started")
        return
    try:
        interval = _interval(settings.get("interval"))
        gpu_source = settings.get("gpu_source")
        if gpu_source not in (None, "auto", "nvml", "sim", "none"):
            raise ConfigError(f"gpu source {str(gpu_source)[:20]!r} is not auto, nvml, sim or none")
        argv = agent_command(collector, node, spool, gpu_source, interval,
                             collectors_before=settings.get("collectors_before"))
        result = ensure_agent(spool, argv, agent_environment(os.environ, _token(settings)))
    except (OSError, ValueError, ClusterwatchError) as exc:  # ValueError too: a hook never raises
        _say("prolog", f"cannot start the agent for {node} in {spool}: {exc}")
        return
    if result.action == "busy":
        _say("prolog", f"another prolog is starting the agent of {node}; left to it")


def _interval(value) -> float | None:
    """The agent's poll interval in seconds (a flag, CLUSTERWATCH_INTERVAL or [agent] interval); None: its default."""
    from clusterwatch.errors import ConfigError

    if not value:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"interval {str(value)[:20]!r} is not a number of seconds; give e.g. 1 or 0.5") from None


def _token(settings: dict) -> str | None:
    """The agent's token: --token, else read from --token-file as root (it reaches the agent by variable, in an
    environment only root may read). ConfigError when the file is unfit or both are given."""
    from clusterwatch.config import read_token_file
    from clusterwatch.errors import ConfigError

    token, token_file = settings.get("token"), settings.get("token_file")
    if token and token_file:
        raise ConfigError("the token is given twice (token and token_file); keep the token file")
    return read_token_file(token_file) if token_file else token


def _gate_refusal(ctx: click.Context, options: dict, gate) -> str | None:
    """The reason to refuse this job when the gate is on and the node's agent knows it unfit; else None.

    Never raises: a bad setting, or a health file that cannot tell, lets the job run with one line.
    """
    # --gate on the command line, else CLUSTERWATCH_GATE, else [prolog] gate (click's default_map)
    if ctx.get_parameter_source("gate") is not click.core.ParameterSource.COMMANDLINE:
        gate = os.environ.get("CLUSTERWATCH_GATE", gate)
    if gate is None:
        return None  # off by default: nothing more is imported
    from clusterwatch.agent.spool import spool_dir_for

    from clusterwatch.errors import ConfigError

    from .health_gate import gate_also, gate_enabled, verdict

    try:
        if not gate_enabled(gate):
            return None
        also = gate_also(options.get("gate_also"))
        settings = _settings(ctx, options)
        job = _job_id(dict(os.environ))
        found = verdict(spool_dir_for(settings.get("spool_dir"), _node(settings, dict(os.environ))), also)
    except Exception as exc:  # noqa: BLE001 - the gate cannot tell: the job runs
        reason = str(exc) if isinstance(exc, ConfigError) else f"{exc.__class__.__name__}: {exc}"
        _say("prolog", f"gate off for this job: {reason}")
        return None
    if found.refuse:
        return f"job {job} refused: {found.reason}"
    if found.reason:
        _say("prolog", f"gate: job {job}: {found.reason}")
    return None


def _hook(kind: str, ctx: click.Context, options: dict, gate=None) -> None:
    _arm_deadline(kind)
    refusal = None
    try:
        if kind == "prolog":
            refusal = _gate_refusal(ctx, options, gate)
        if refusal is None:
            run_hook(kind, _settings(ctx, options), dict(os.environ))
    except BaseException as exc:  # noqa: BLE001 - whatever it is, the node must not drain
        _say(kind, f"failed: {exc.__class__.__name__}: {exc}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if refusal is not None:
        # The one non-zero exit, on evidence only: slurmd drains the node and Slurm requeues the job.
        _say(kind, refusal)
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)  # skips interpreter teardown: a hook has nothing to clean up and every ms counts


_common = [
    click.option("--spool-dir", envvar="CLUSTERWATCH_SPOOL", default=None,
                 help="The node's spool folder (default: /run/clusterwatch/<node>; '{node}' is replaced)."),
    click.option("--node", envvar="CLUSTERWATCH_NODE", default=None,
                 help="Node name (default: SLURMD_NODENAME, else the host name)."),
]


def _with_common(f):
    for option in reversed(_common):
        f = option(f)
    return f


@click.command(epilog=examples(
    "clusterwatch prolog    # in Slurm's Prolog script, as root, with SLURM_JOB_ID and the job's GPUs set",
    "clusterwatch prolog --collector collector01:50051 --gpu-source sim",
    "clusterwatch prolog --gate    # refuse jobs on a node whose agent knows a GPU unfit",
))
@click.option("--collector", envvar="CLUSTERWATCH_COLLECTOR", default=None, metavar="HOST:PORT",
              help="Collector address for an agent this prolog starts.")
@click.option("--token", envvar="CLUSTERWATCH_TOKEN", default=None, help="Shared secret for that agent.")
@click.option("--token-file", envvar="CLUSTERWATCH_TOKEN_FILE", default=None, metavar="PATH",
              help="File (mode 0600) holding that agent's shared secret.")
# Plain strings, checked by the hook: a bad value must not make click exit 2.
@click.option("--gpu-source", envvar="CLUSTERWATCH_GPU_SOURCE", default=None,
              help="GPU source for that agent: auto, nvml, sim or none.")
@click.option("--interval", envvar="CLUSTERWATCH_INTERVAL", default=None, help="Poll interval for that agent.")
# A flag whose value stays a string (CLUSTERWATCH_GATE and [prolog] gate are read by the hook): no exit 2.
@click.option("--gate", flag_value="on", type=str, default=None,
              help="Refuse the job (exit 1: Slurm drains the node, requeues the job) when this node's agent "
                   "knows a GPU unfit; off by default (CLUSTERWATCH_GATE=1).")
@click.option("--gate-also", envvar="CLUSTERWATCH_GATE_ALSO", default=None, metavar="FINDINGS",
              help="More findings that refuse a job, comma-separated: a kind or kind:number (xid:13).")
@_with_common
@click.pass_context
def prolog(ctx, collector, token, token_file, gpu_source, interval, gate, gate_also, spool_dir, node) -> None:
    """Slurm Prolog: announce the job to this node's agent, starting the agent if it is not running.

    Reads SLURM_JOB_ID, SLURM_JOB_UID, SLURM_JOB_USER, SLURMD_NODENAME and SLURM_JOB_GPUS (or
    CUDA_VISIBLE_DEVICES). Exits 0 within a second, except with --gate on a node known unfit: exit 1.
    """
    _hook("prolog", ctx, dict(collector=collector, token=token, token_file=token_file, gpu_source=gpu_source,
                              interval=interval, spool_dir=spool_dir, node=node, gate_also=gate_also), gate=gate)


@click.command(epilog=examples(
    "clusterwatch epilog    # in Slurm's Epilog script, as root, with SLURM_JOB_ID set",
))
@_with_common
@click.pass_context
def epilog(ctx, spool_dir, node) -> None:
    """Slurm Epilog: tell this node's agent the job ended (with SLURM_JOB_EXIT_CODE2). Always exits 0."""
    _hook("epilog", ctx, dict(spool_dir=spool_dir, node=node))
