"""A real clusterwatch agent per simulated Slurm node, over the real pynvml and the C stand-in for the driver
(tests/fakes/nvml_stub), each with one GPU whose loss a test stages as the driver shows it (XID 79 in the
node's kernel log, GPU_IS_LOST from NVML) and whose repair it stages by making the GPU answer again.

The tests on the real Slurm (tests/slurm/) start one per node of tests/services/slurm.py's cluster; the agent
takes the node's name from SLURMD_NODENAME, as under slurmd.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tests.fakes.nvml_stub import child_env, write_state
from tests.support.helpers import CLI, Collector, Proc, kmsg_record, wait_for

__all__ = ["NodeAgent", "start_node_agent", "wait_gpus_reported"]

_XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."


def _gpu_line(uuid: str, *, lost: bool = False) -> str:
    # the stand-in's state-file line for one H100 (format: tests/fakes/nvml_stub/libnvml.c)
    return (f"gpu {uuid} total=85899345920 used=0 util=0 power=90000 pci=0000:3b:00{' lost=1' if lost else ''} "
            "name=NVIDIA H100\n")


@dataclass
class NodeAgent:
    """One node's running agent and the files that stand for its hardware."""

    node: str
    gpu: str        # the GPU's UUID: GPU-<node>-0
    state: Path     # the stand-in's state file
    kmsg: Path      # the kernel log the agent reads (--kmsg)
    spool: Path     # the agent's spool folder, where it keeps the health file the prolog's gate reads
    proc: Proc

    def lose_gpu(self, *, xid: bool = True) -> None:
        """The GPU falls off the bus: XID 79 in the kernel log (unless `xid` is False), then NVML's GPU_IS_LOST."""
        if xid:
            with self.kmsg.open("a") as f:
                f.write(kmsg_record(2, _XID_79))
        write_state(self.state, _gpu_line(self.gpu, lost=True))

    def repair(self) -> None:
        """The GPU answers again."""
        write_state(self.state, _gpu_line(self.gpu))

    def stop(self) -> int:
        """Stop the agent by its pid; its exit status."""
        return self.proc.stop()


def start_node_agent(node: str, stub_lib: Path, folder: Path, collector: str, *extra: str,
                     spool: Path | None = None) -> NodeAgent:
    """Start `clusterwatch agent --gpu-source nvml` for `node` on the stand-in built in `stub_lib`.

    Args:
        node: the Slurm node name (SLURMD_NODENAME and --node).
        stub_lib: the folder the stand-in was built in (tests/fakes/nvml_stub/fixtures.py's stub_lib).
        folder: a folder of this node's own, made here: state file, kernel log, train socket, agent.log.
        collector: the collector's address.
        extra: more agent flags (e.g. "--health-interval", "1").
        spool: the agent's spool folder; default `folder`/spool.

    Returns:
        The running agent; the caller stops it.
    """
    folder.mkdir(parents=True, exist_ok=True)
    gpu = f"GPU-{node}-0"
    state = folder / "nvml-state.txt"
    write_state(state, _gpu_line(gpu))
    kmsg = folder / "kmsg"
    kmsg.write_text(kmsg_record(1, "Linux version 6.8.0"))
    spool = spool if spool is not None else folder / "spool"
    proc = Proc([*CLI, "agent", "--collector", collector, "--node", node, "--gpu-source", "nvml",
                 "--interval", "0.5", "--send-interval", "0", "--no-provenance", "--spool-dir", str(spool),
                 "--train-socket", str(folder / "train.sock"), "--kmsg", str(kmsg), *extra],
                folder / "agent.log", env={**child_env(stub_lib, state), "SLURMD_NODENAME": node})
    return NodeAgent(node=node, gpu=gpu, state=state, kmsg=kmsg, spool=spool, proc=proc)


def wait_gpus_reported(collector: Collector, agents: Iterable[NodeAgent], timeout: float = 60.0) -> None:
    """Wait until the collector's /metrics shows every agent's GPU: each agent polls and streams."""
    for agent in agents:
        wait_for(lambda agent=agent: f'gpu="{agent.gpu}"' in collector.metrics(), timeout=timeout,
                 what=f"{agent.node}'s GPU reported")
