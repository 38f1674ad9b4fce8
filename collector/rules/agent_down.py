"""agent_down: a node whose agent has been silent for long while jobs run there.

State, per node: when its agent last reported, whether it had jobs (and which), how long a silence
counts (three of the agent's intervals), and the alert's state.
"""
from __future__ import annotations

from dataclasses import dataclass

from .config import AgentDownRule
from .model import FIRING, RESOLVED, AlertEvent, NodeHeartbeat, Rule
from .process import hours

NAMES = (Rule.AGENT_DOWN,)


@dataclass(slots=True)
class NodeState:
    """What `agent_down` remembers about one node."""

    last_t: float
    has_jobs: bool
    silent_after_s: float  # three of the agent's intervals: the least silence that counts
    state: str | None = None  # FIRING, None while nothing is raised
    job_ids: tuple[str, ...] = ()  # the jobs it last reported processes of


class AgentsDown:
    """The rule over every node: node → its state."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeState] = {}

    def heartbeat(self, r: AgentDownRule, hb: NodeHeartbeat) -> list[AlertEvent]:
        """A node's agent reported: a resolved event when the node was down."""
        st = self.nodes.get(hb.node)
        if st is None:
            self.nodes[hb.node] = NodeState(hb.t, hb.has_jobs, 3.0 * hb.every_s, job_ids=hb.job_ids)
            return []
        out: list[AlertEvent] = []
        if st.state is not None:
            out.append(AlertEvent(t=hb.t, rule=Rule.AGENT_DOWN.value, state=RESOLVED, severity=r.severity,
                                  node=hb.node, job_id=st.job_ids[0] if st.job_ids else "",
                                  description=f"Agent on {hb.node} reports again after {hours(hb.t - st.last_t)}",
                                  figures={"silent_for_s": round(hb.t - st.last_t, 1)}))
            st.state = None
        st.last_t, st.has_jobs, st.silent_after_s = hb.t, hb.has_jobs, 3.0 * hb.every_s
        if hb.job_ids or not hb.has_jobs:
            st.job_ids = hb.job_ids
        return out

    def tick(self, r: AgentDownRule, now: float) -> list[AlertEvent]:
        """Time passed with no new data: the silent nodes with jobs fire."""
        if not r.enabled:
            return []
        out = []
        for node, st in self.nodes.items():
            silent = now - st.last_t
            if st.has_jobs and st.state is None and silent >= max(r.after_s, st.silent_after_s):
                st.state = FIRING
                out.append(_event(r, node, st, now))
        return out

    def refresh(self, r: AgentDownRule, now: float) -> list[AlertEvent]:
        """Every alert firing, its figures as of `now`."""
        return [_event(r, node, st, now) for node, st in self.nodes.items() if st.state is not None]

    def forget_node(self, r: AgentDownRule, node: str, t: float) -> list[AlertEvent]:
        """Stop watching a node, resolving its alert."""
        st = self.nodes.pop(node, None)
        if st is None or st.state is None:
            return []
        return [AlertEvent(t=t, rule=Rule.AGENT_DOWN.value, state=RESOLVED, severity=r.severity,
                           node=node, description=f"{node} is no longer watched")]


def _event(r: AgentDownRule, node: str, st: NodeState, now: float) -> AlertEvent:
    silent = now - st.last_t
    jobs = st.job_ids
    running = (f"job {jobs[0]} runs" if len(jobs) == 1 else
               f"jobs {', '.join(jobs[:3])}{' …' if len(jobs) > 3 else ''} run" if jobs else "jobs run")
    return AlertEvent(t=now, rule=Rule.AGENT_DOWN.value, state=FIRING, severity=r.severity, node=node,
                      job_id=jobs[0] if jobs else "",
                      description=f"Agent on {node} silent for {hours(silent)} while {running} there",
                      figures={"silent_for_s": round(silent, 1), "last_seen_t": st.last_t, "job_ids": list(jobs)})
