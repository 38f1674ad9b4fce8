"""What a node's agent said of itself that a person reading a job's view must know.

Today one thing: its GPU source names pids that are no process of the agent's /proc (an agent in a
container without the host's PID namespace), so GPU memory shows per GPU but no process holds any.
The agent says so in its Hello (Hello.gpu_pids_hidden), again whenever that changes; the note goes
into each NodeView of the job views (NodeView.gpu_pids_note) as one line with what to do.
"""
from __future__ import annotations

from clusterwatch.v1 import agent_pb2, query_pb2

__all__ = ["NodeNotes", "gpu_pids_note"]

_FIX = "run the agent in the host's PID namespace (docker: pid: host; Kubernetes: hostPID: true)"
_GPU_PIDS_NOTES = {
    agent_pb2.GPU_PIDS_OTHER_NAMESPACE: "GPU memory not per process: the agent runs in a PID namespace of its "
    "own (a container without the host's PIDs) and NVML names host pids; " + _FIX,
    agent_pb2.GPU_PIDS_NOT_IN_PROC: "GPU memory not per process: NVML names pids that are no process the agent "
    "sees (a container without the host's PIDs?); " + _FIX,
}


def gpu_pids_note(hidden: int) -> str:
    """The line for a Hello's gpu_pids_hidden ("" when the pids are the agent's processes)."""
    return _GPU_PIDS_NOTES.get(hidden, "")


class NodeNotes:
    """Node → its note, as its agent's latest Hello says (kept while the collector runs)."""

    def __init__(self) -> None:
        self._gpu_pids: dict[str, str] = {}

    def hello(self, hello: agent_pb2.Hello) -> None:
        """Take what an agent's Hello (its first, or one sent again) says."""
        note = gpu_pids_note(hello.gpu_pids_hidden)
        if note:
            self._gpu_pids[hello.node] = note
        else:
            self._gpu_pids.pop(hello.node, None)

    def fill(self, view: query_pb2.JobView) -> None:
        """Put each node's note into the view's NodeViews."""
        for nv in view.nodes:
            nv.gpu_pids_note = self._gpu_pids.get(nv.node, "")
