"""The report's figures: the job's overall utilisation, its nodes, its ranks and its GPUs."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from clusterwatch.humanize import duration
from clusterwatch.model import HELD_STATES, ROOT_USERS

from .text import Col, Table, human_bytes, meter, sparkline, title, wrap_words

if TYPE_CHECKING:
    from clusterwatch.v1 import query_pb2


def job_cpu(view: query_pb2.JobView, run_time: float) -> tuple[float, float | None]:
    """(CPU time of the job's processes over their whole lives, CPU efficiency as jobstats shows it: that
    time over run time × allocated cores; None where Slurm gave no core count or no time has passed)."""
    cpu_s = sum(p.cpu_seconds for p in view.processes)
    cores = view.job.cpus
    return cpu_s, (cpu_s / (run_time * cores) if cores and run_time > 0 else None)


def overall_section(view: query_pb2.JobView, width: int | None, run_time: float = 0.0) -> list[str]:
    out = [title("Overall utilisation")]
    figures = overall_figures(view, run_time)
    meters = [(name, fraction, text) for name, fraction, text, metered in figures if metered]
    # 40 cells, fewer where the lines must fit: 19 before the meter, 2 brackets and "  nnn%" after it
    cells = 40
    if width is not None:
        cells = max(10, min(40, width - 19 - 8 - max((len(t) for _, _, t in meters), default=0)))
    for name, fraction, text, metered in figures:
        if metered:
            out.append(f"  {name:<16} {meter(fraction, cells)}{text}")
        else:  # a long one wraps under its text
            out.extend(wrap_words(text, f"  {name:<16} ", " " * 19, width or 19 + len(text)))
    return out


def overall_figures(view: query_pb2.JobView, run_time: float) -> list[tuple[str, float | None, str, bool]]:
    """The job's overall figures in the order shown: (label, fraction used, the figures said, drawn as a meter);
    a figure with nothing to compare with (no allocation known) has no meter."""
    meters: list[tuple[str, float | None, str]] = []  # label, fraction, the figures after the meter
    lines: list[tuple[str, str]] = []  # label, figures without a meter (nothing to compare with)
    live = [p for p in view.processes if p.alive] or list(view.processes)
    gpus = list(view.gpus)
    ended = bool(view.job.end_time)
    if gpus:
        # the whole job, where the collector accumulated it (every reading while the job's processes were on
        # its GPUs); else averaged over the history held
        busy = sum(g.busy_seconds for g in gpus)
        covered = sum(g.covered_seconds for g in gpus)
        trend = [u for g in gpus for u in g.utilization_trend]
        util = [g.utilization for g in gpus if g.HasField("utilization")]
        if covered > 0:
            avg, how = busy / covered * 100, "  whole job"
        else:
            avg = sum(trend) / len(trend) if trend else (sum(util) / len(util) if util else None)
            how = "  average"
        meters.append(("GPU utilisation", avg / 100 if avg is not None else None, how))
        # an ended job is judged by its peaks (its last readings are after the processes left)
        used = sum(g.memory_peak_bytes if ended else g.memory_used_bytes for g in gpus
                   if ended or g.HasField("memory_used_bytes"))
        total = sum(g.memory_total_bytes for g in gpus)
        meters.append(("GPU memory", used / total if total else None,
                       f"  {human_bytes(used)} of {human_bytes(total)}{' at peak' if ended else ''}" if total else ""))
    cpu_s, efficiency = job_cpu(view, run_time)
    cores = view.job.cpus
    if efficiency is not None:
        meters.append(("CPU efficiency", efficiency,
                       f"  {duration(cpu_s)} CPU time of {cores} cores × {duration(run_time)}"))
    elif run_time > 0 and cpu_s > 0:  # what is known without Slurm's core count
        lines.append(("CPU", f"{cpu_s / run_time:.1f} cores busy on average ({duration(cpu_s)} CPU time); "
                             "allocated cores unknown"))
    else:  # no CPU time yet (the first polls): the latest readings
        now_cores = sum(p.cpu_percent for p in live if p.HasField("cpu_percent")) / 100
        if cores:
            meters.append(("CPU", now_cores / cores, f"  {now_cores:.1f} of {cores} cores"))
        else:
            lines.append(("CPU", f"{now_cores:.1f} cores busy now; allocated cores unknown"))
    # host memory against what Slurm allocated (the job is killed past it), never the node's RAM
    rss = (sum(p.rss_peak_bytes for p in view.processes) if ended
           else sum(p.rss_bytes for p in live if p.HasField("rss_bytes")))
    shm = [n for n in view.nodes if n.HasField("tmpfs_bytes")]  # the user's tmpfs files: host memory too
    shm_bytes = sum(n.tmpfs_bytes for n in shm)
    rss += shm_bytes
    mem = view.job.memory_bytes
    at = " at peak" if ended else ""
    if mem:
        meters.append(("Host memory", rss / mem, f"  {human_bytes(rss)}{at} of {human_bytes(mem)} allocated"))
    else:
        ram = sum(n.memory_total_bytes for n in view.nodes)
        lines.append(("Host memory", f"{human_bytes(rss)}{at}; allocation unknown"
                                     + (f" (node RAM {human_bytes(ram)})" if ram else "")))
    if shm_bytes:
        lines.append(("Shared memory", tmpfs_text(shm, shm_bytes)))
    elif not ended and view.job.user in ROOT_USERS:  # root's files are the machine's (collector/state/tmpfs.py)
        lines.append(("Shared memory", "/dev/shm and tmpfs files not counted for root's jobs (the machine's)"))
    return ([] if gpus else [("GPU", None, "no GPU reported for this job", False)]) \
        + [(name, fraction, text, True) for name, fraction, text in meters] \
        + [(name, None, text, False) for name, text in lines]


def tmpfs_text(nodes: list, held: int) -> str:
    """What the job's user's files hold in /dev/shm and the other tmpfs mounts, counted in host memory above."""
    text = f"{human_bytes(held)}{'+' if any(n.tmpfs_truncated for n in nodes) else ''} in /dev/shm and tmpfs " \
           "files of the job's user (in host memory)"
    shared = sorted({j for n in nodes if n.tmpfs_bytes for j in n.tmpfs_shared_with})
    if shared:
        text += f"; the user's job{'s' if len(shared) > 1 else ''} {', '.join(shared)} on the same node" \
                f"{'s' if len(nodes) > 1 else ''} hold{'' if len(shared) > 1 else 's'} them too"
    return text


def nodes_section(view: query_pb2.JobView, width: int | None) -> list[str]:
    """Per node: is its agent reporting, and what the job uses there (jobstats' per-node lines)."""
    return nodes_table(view).lines(width) if view.nodes else []


def nodes_table(view: query_pb2.JobView) -> Table:
    ended = bool(view.job.end_time)
    columns = [Col("NODE", 14, "<"), Col("AGENT", 6, "<"), Col("PROCS", 5), Col("CPU CORES", 9),
               Col("HOST MEM", 10), Col("GPUS", 4, drop=1), Col("GPU UTIL", 8),
               Col("GPU MEM (peak)" if ended else "GPU MEM", 20)]
    # grouped in one pass: a scan of every process per node was 3 ms of a 512-process job's 8 ms report
    procs_of: dict[str, list] = {}
    for p in view.processes:
        if p.alive or ended:
            procs_of.setdefault(p.node, []).append(p)
    gpus_of: dict[str, list] = {}
    for g in view.gpus:
        gpus_of.setdefault(g.node, []).append(g)
    out = Table("Nodes", columns)
    for n in sorted(view.nodes, key=lambda n: n.node):
        procs = procs_of.get(n.node, [])
        cpu = sum(p.cpu_percent for p in procs if p.HasField("cpu_percent")) / 100
        rss = sum(p.rss_bytes for p in procs if p.HasField("rss_bytes")) + n.tmpfs_bytes  # tmpfs files too
        gpus = gpus_of.get(n.node, [])
        covered = sum(g.covered_seconds for g in gpus)
        trend = [u for g in gpus for u in g.utilization_trend]
        if covered:  # the whole job's, while its processes were on them
            util = f"{sum(g.busy_seconds for g in gpus) / covered * 100:.0f}%"
        else:
            util = f"{sum(trend) / len(trend):.0f}%" if trend else "-"
        used = sum(g.memory_peak_bytes if ended else g.memory_used_bytes for g in gpus
                   if ended or g.HasField("memory_used_bytes"))
        total = sum(g.memory_total_bytes for g in gpus)
        mem = f"{human_bytes(used)} / {human_bytes(total)}" if total else "-"
        agent = "ended" if ended else ("up" if n.agent_up else "DOWN")
        out.add([n.node, agent, str(len(procs)), f"{cpu:.1f}", human_bytes(rss), str(len(gpus)), util, mem],
                mark="down" if agent == "DOWN" else "")
    down = [n.node for n in view.nodes if not n.agent_up and not ended]
    if down:
        out.footer.append(f"no recent samples from {', '.join(down)}: its figures are the last ones received")
    for n in sorted(view.nodes, key=lambda n: n.node):
        if n.gpu_pids_note:  # the agent cannot tie GPU memory to processes there (a container without host pids)
            out.footer.append(f"{n.node}: {n.gpu_pids_note}")
    return out


def ranks_section(view: query_pb2.JobView, now: float, width: int | None) -> list[str]:
    if not view.processes:
        return [title("Processes (by rank)"), "  no process of this job has been reported yet"]
    out = ranks_table(view, now).lines(width)
    training = training_table(view, now)
    return out + (training.lines(width) if training else [])


def ranks_table(view: query_pb2.JobView, now: float) -> Table:
    """Per process: its rank, where, its GPU and host memory with their trends; a process gone or held
    (D, stopped, traced) says so under its row."""
    # the allocator's own figures, where a process reports them (clusterwatch.train): beside NVML's
    has_alloc = any(p.HasField("gpu_allocated_bytes") or p.HasField("gpu_reserved_bytes") for p in view.processes)
    # at 80 columns the trends, the GPU memory peak and the per-process GPU utilisation go first; with the
    # allocator's two columns, CPU too (the Nodes table has it)
    columns = [Col("RANK", 5), Col("NODE", 10, "<"), Col("PID", 7), Col("CMD", 10, "<"), Col("GPU MEM", 9)]
    if has_alloc:
        columns += [Col("ALLOC", 9), Col("RESERVED", 9)]
    columns += [Col("PEAK", 9, drop=2), Col("TREND", 12, "<", drop=3), Col("UTIL", 5, drop=1),
                Col("CPU", 5, drop=1 if has_alloc else 0), Col("RSS", 9), Col("TREND", 8, "<", drop=3)]
    out = Table("Processes (by rank)", columns)
    alerted = {(a.node, a.pid) for a in view.alerts if a.state == "firing" and a.pid}
    for p in view.processes:
        row = [_rank(p), p.node, str(p.pid), p.command,
               human_bytes(p.gpu_memory_bytes) if p.HasField("gpu_memory_bytes") else "-"]
        if has_alloc:
            row += [human_bytes(p.gpu_allocated_bytes) if p.HasField("gpu_allocated_bytes") else "-",
                    human_bytes(p.gpu_reserved_bytes) if p.HasField("gpu_reserved_bytes") else "-"]
        row += [human_bytes(p.gpu_memory_peak_bytes) if p.gpu_memory_peak_bytes else "-",
                sparkline(list(p.gpu_memory_trend)) if p.gpu_memory_peak_bytes else "",
                f"{p.gpu_utilization:.0f}%" if p.HasField("gpu_utilization") else "-",
                f"{p.cpu_percent:.0f}%" if p.HasField("cpu_percent") else "-",
                human_bytes(p.rss_bytes) if p.HasField("rss_bytes") else "-",
                sparkline(list(p.rss_trend), 8)]
        gone = not p.alive and not view.job.end_time
        said = (["gone"] if gone else []) + ([held_text(p, now)] if p.state else [])
        # the page marks the row; the text says why under it (a stall: in the Training table)
        mark = ("held" if p.state else "gone" if gone else "stalled" if p.HasField("stalled_since")
                else "alerted" if (p.node, p.pid) in alerted else "")
        out.add(row, ", ".join(said), mark)
    if has_alloc:
        out.footer.append("GPU MEM is NVML's figure (the CUDA context and the allocator's reserve); ALLOC (live "
                          "tensors) and RESERVED are the allocator's own")
    mapped = sorted({p.mapped_by for p in view.processes if p.mapped_by})
    if mapped:
        out.footer.append(f"mapped to the job by: {', '.join(mapped)}")
    return out


def training_table(view: query_pb2.JobView, now: float) -> Table | None:
    """Per rank: its step, step rate, loss and learning rate as it reports them (clusterwatch.train), and
    whether its step has stalled; None where no process reports."""
    reporting = [p for p in view.processes if p.HasField("step") or p.HasField("loss") or p.HasField("lr")]
    if not reporting:
        return None
    columns = [Col("RANK", 5), Col("NODE", 10, "<"), Col("PID", 7), Col("STEP", 9), Col("STEP/S", 7),
               Col("LOSS", 10), Col("LR", 9)]
    out = Table("Training (by rank, as reported)", columns)
    for p in reporting:
        row = [_rank(p), p.node, str(p.pid), str(p.step) if p.HasField("step") else "-",
               f"{p.steps_per_s:.2f}" if p.HasField("steps_per_s") else "-",
               f"{p.loss:.4g}" if p.HasField("loss") else "-", f"{p.lr:.3g}" if p.HasField("lr") else "-"]
        note = ""
        if p.HasField("stalled_since"):  # its step has not moved for a while: its STEP/S reads 0
            note = f"stalled since {time.strftime('%H:%M:%S %Z', time.localtime(p.stalled_since))}"
            if p.alive and not view.job.end_time:
                note += f" ({duration(now - p.stalled_since)})"
        out.add(row, note, "stalled" if note else "")
    rates = [(p.steps_per_s, p) for p in reporting if p.HasField("steps_per_s") and p.alive]
    if len(rates) > 1:
        slow_rate, slow = min(rates, key=lambda r: r[0])
        fast = max(r for r, _ in rates)
        if fast > 0 and slow_rate < 0.9 * fast:
            out.footer.append(f"slowest: {_who(slow)} on {slow.node} at {slow_rate:.2f} steps/s "
                              f"({(1 - slow_rate / fast) * 100:.0f}% behind the fastest)")
    return out


def _rank(p: query_pb2.ProcessView) -> str:
    return str(p.rank) if p.HasField("rank") else "-"


def _who(p: query_pb2.ProcessView) -> str:
    return f"rank {p.rank}" if p.HasField("rank") else f"pid {p.pid}"


def held_text(p: query_pb2.ProcessView, now: float) -> str:
    """A process held where it is, as the ranks table's tail says it: "in uninterruptible sleep (D) for 6 min,
    in nfs_wait_bit_killable"."""
    text = f"{HELD_STATES.get(p.state, 'held')} ({p.state})"
    if p.HasField("state_since"):
        text += f" for {duration(max(0.0, now - p.state_since))}"
    if p.wchan:
        text += f", in {p.wchan}"
    return text


def gpus_section(view: query_pb2.JobView, width: int | None) -> list[str]:
    return gpus_table(view).lines(width) if view.gpus else []


def gpus_table(view: query_pb2.JobView) -> Table:
    # SM activity (GPM) beside utilisation where a GPU reads it; its name gives the room at 80 columns
    gpm = any(g.HasField("activity") and g.activity.HasField("sm_active") for g in view.gpus)
    columns = [Col("NODE", 10, "<"), Col("GPU", 3), Col("NAME", 17 if gpm else 22, "<"), Col("UTIL", 5),
               *([Col("SM", 4)] if gpm else []),
               Col("TREND", 12, "<", drop=2), Col("MEMORY", 21), Col("PEAK", 9, drop=1), Col("POWER", 6),
               Col("PROCS", 5)]
    out = Table("GPUs", columns)
    if gpm:
        out.footer.append("SM: the share of its SMs at work (NVML GPM); UTIL says only that a kernel ran")
    for g in view.gpus:
        sm = [f"{g.activity.sm_active:.0f}%" if g.activity.HasField("sm_active") else "-"] if gpm else []
        out.add([g.node, str(g.index), g.name, f"{g.utilization:.0f}%" if g.HasField("utilization") else "-", *sm,
                     sparkline(list(g.utilization_trend)),
                     (f"{human_bytes(g.memory_used_bytes)} / {human_bytes(g.memory_total_bytes)}"
                      if g.HasField("memory_used_bytes") else "-"),
                     human_bytes(g.memory_peak_bytes),
                     f"{g.power_watts:.0f} W" if g.HasField("power_watts") else "-",
                 str(g.processes) if g.processes else "none"], mark="" if g.processes else "idle")
    return out
