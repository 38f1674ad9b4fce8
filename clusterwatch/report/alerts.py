"""The report's Alerts section, and what to do about each alert that fires."""
from __future__ import annotations

from typing import TYPE_CHECKING

from clusterwatch.rule_names import Rule

from .text import title, wrap_words

if TYPE_CHECKING:
    from clusterwatch.v1 import query_pb2


def alerts_section(view: query_pb2.JobView, width: int | None) -> list[str]:
    if not view.alerts:
        return []
    out = [title("Alerts")]
    for a in sorted(view.alerts, key=lambda a: (_ALERT_ORDER.get(_alert_state(a), 4), -a.since)):
        state = _alert_state(a)
        # one that ended while firing keeps the firing mark: it never cleared (the process took it along)
        mark = {"firing": "●", "pending": "◐", "ended": "●", "resolved": "○"}.get(state, "?")
        head = f"  {mark} {state.upper():<8} {a.rule:<18} "
        if width is None or len(head) + len(a.description) <= width:
            out.append(head + a.description)
        else:  # the description wraps under itself
            out.extend(wrap_words(a.description, head, " " * len(head), width))
    return out


_ALERT_ORDER = {"firing": 0, "pending": 1, "ended": 2, "resolved": 3}


def _alert_state(a) -> str:
    """An alert's state as the report says it: "ended" for one resolved only because its process or job
    ended while it fired (not good news, unlike "resolved")."""
    return "ended" if a.state == "resolved" and a.ended_while_firing else a.state


# What to do about an alert that is firing (or that ended with its process), by rule: one note a rule,
# naming who. The health rules (gpu_xid, ...) carry their advice in the Health section.
_ALERT_ADVICE = {
    Rule.GPU_MEMORY_LEAK: "GPU memory of {who} {full}. Look for tensors kept across steps (losses "
                          "appended without .item(), caches keyed by batch); torch.cuda.memory_summary() at two "
                          "steps shows what grows. Checkpoint now if the run matters.",
    Rule.HOST_MEMORY_LEAK: "Host memory of {who} {full}; past the job's --mem, Slurm kills it. Look for "
                           "data kept across steps and for DataLoader workers copying the dataset; tracemalloc "
                           "snapshots at two steps show what grows.",
    Rule.TRAINING_STALL: "Training of {who} is not advancing. `py-spy dump --pid PID` on its node shows where it "
                         "waits; a busy GPU with no steps is often a hung collective (NCCL_DEBUG=INFO, a timeout "
                         "in init_process_group). Cancel it if it does not recover: it holds its GPUs.",
    Rule.GPU_STALL: "The GPU of {who} is idle while the process runs: it waits on data or on the CPU. More "
                    "DataLoader workers, pinned memory, or `py-spy dump --pid PID` shows where it spends its time.",
    Rule.IDLE_GPU: "GPUs allocated to this job are idle ({who}). If the code uses fewer GPUs than requested, ask "
                   "for fewer (--gres=gpu:N).",
    Rule.GPU_MEMORY_FRAGMENTATION: "The allocator of {who} holds more and more free cache it cannot reuse (allocations "
                                   "retry after freeing it): fragmentation. Start it with "
                                   "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; varying tensor shapes "
                                   "(padding to fixed sizes helps) are the usual cause.",
    Rule.HANDLE_LEAK: "Threads or open files of {who} keep growing: something opened each step is never closed "
                      "(files, sockets, DataLoader iterators recreated). `ls /proc/PID/fd` shows what.",
    Rule.AGENT_DOWN: "The agent on {who} is not reporting: that node's figures are old. Tell the cluster's "
                     "operators if it lasts.",
    Rule.CODE_MISMATCH: "Ranks run different versions of the code: check that every node sees the same checkout "
                        "(see Code below).",
}


def alert_notes(view) -> list[str]:
    """What to do about the alerts firing (and those that ended while firing), one note a rule."""
    by_rule: dict[str, list] = {}
    for a in view.alerts:
        if a.state == "firing" or (a.state == "resolved" and a.ended_while_firing):
            by_rule.setdefault(a.rule, []).append(a)
    notes = []
    for rule, alerts in by_rule.items():
        advice = _ALERT_ADVICE.get(rule)
        if advice is None:
            continue
        whos = []
        for a in alerts:
            if rule == Rule.AGENT_DOWN:
                who = a.node
            elif rule == Rule.IDLE_GPU:
                who = f"{a.gpu[:12]} on {a.node}" if a.gpu else a.node
            else:
                who = f"rank {a.rank}" if a.HasField("rank") else f"pid {a.pid}"
                who += f" on {a.node}" if a.node else ""
            if who not in whos:
                whos.append(who)
        full = ""
        if rule in (Rule.GPU_MEMORY_LEAK, Rule.HOST_MEMORY_LEAK):
            ended = [a for a in alerts if a.ended_while_firing]
            if ended and len(ended) == len(alerts):
                # a job that completed was stopped by its own code or its user, not killed for its memory
                completed = view.job.state == "COMPLETED" and not view.job.exit_code
                full = "was still growing when it ended" + ("" if completed else
                                                             " (an out-of-memory kill looks like this)")
            else:
                full = "keeps growing (see Alerts for the rate and the time until it is full)"
        notes.append(advice.format(who=", ".join(whos[:4]) + (" …" if len(whos) > 4 else ""), full=full))
    return notes
