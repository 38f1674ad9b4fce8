"""A kernel log full of text users can put there: the real agent (--kmsg FILE) reports the driver's own XID alone.

A real collector, a real agent over the real pynvml and the C stand-in for the driver (two GPUs); the agent's
kernel log is a file of /dev/kmsg records. Before the one XID the kernel printed (48 on GPU 0), records carry
the driver's words where a user can put them: written to /dev/kmsg (the user facility), forwarded from
syslog, in an OOM report's cgroup path, after a newline in a file name, on a dictionary line, and a claim of a
GPU's bus address. `clusterwatch health` must show GPU 0's XID 48 and nothing else.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.fakes.nvml_stub import child_env, fixtures, write_state
from tests.support.helpers import CLI, Collector, Proc, cli, wait_for

pytestmark = pytest.mark.e2e
stub_lib = fixtures.stub_lib  # the stand-in's fixture, used by name
NODE = "kmsg-node"
DRIVER = "NVRM: Xid (PCI:0000:3c:00): 79, pid=1, name=python, GPU has fallen off the bus."


def _records() -> str:
    usec = int(time.monotonic() * 1e6)
    hostile = [
        f"11,1,{usec},-;{DRIVER}",                        # echo ... > /dev/kmsg
        f"27,2,{usec},-;{DRIVER}",                        # from a syslog daemon
        f"6,3,{usec},-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
        f"oom_memcg=/slurm/uid_1000/job_9/{DRIVER},task_memcg=/slurm/uid_1000/job_9,task=python,pid=7,uid=1000",
        f"6,4,{usec},-;Memory cgroup stats for /slurm/uid_1000/job_9/{DRIVER}:",
        f'5,5,{usec},-;audit: type=1400 audit(1700000000.000:42): name="/tmp/x\\x0a{DRIVER}" comm="cat"',
        f" {DRIVER}",                                     # a dictionary line
        f"12,6,{usec},-;NVRM: GPU at PCI:0000:3b:00: GPU-evil",
        f"6,7,{usec},-;NVRM: Xid (PCI[4242]: segfault at 0 ip 0000000000401136 sp 00007ffd4a1c2f40 error 6",
    ]
    genuine = f"3,8,{usec},-;NVRM: Xid (PCI:0000:3b:00): 48, An uncorrectable double bit error"
    return "".join(line + "\n" for line in [*hostile, genuine])


def test_the_agent_reports_the_kernels_xid_and_none_of_the_users(stub_lib: Path, tmp_path: Path, munged) -> None:
    state = tmp_path / "nvml-state.txt"
    write_state(state, "gpu GPU-km0 total=85899345920 used=0 util=0 power=90000 pci=0000:3b:00 name=NVIDIA H100\n"
                       "gpu GPU-km1 total=85899345920 used=0 util=0 power=70000 pci=0000:3c:00 name=NVIDIA H100\n")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(_records())
    collector = Collector(tmp_path, "--query-auth", "munge", "--munge-socket", str(munged))
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", NODE, "--gpu-source", "nvml",
                  "--interval", "0.5", "--send-interval", "0", "--no-provenance",
                  "--spool-dir", str(tmp_path / "spool"), "--train-socket", str(tmp_path / "train.sock"),
                  "--kmsg", str(kmsg)],
                 tmp_path / "agent.log", env=child_env(stub_lib, state))
    env = {"CLUSTERWATCH_MUNGE_SOCKET": str(munged)}
    try:
        def listed():
            r = cli("health", "--collector", collector.address, "--json", env=env)
            doc = json.loads(r.stdout) if r.returncode == 0 else {}
            return doc if any(g["xids"] for g in doc.get("gpus", [])) else None

        # the genuine record is the file's last: once it is in, every record before it has been read
        doc = wait_for(listed, timeout=60, what="an XID in clusterwatch health --json")
        assert [(g["gpu"], g["xids"]) for g in doc["gpus"]] == [("GPU-km0", [{"xid": 48, "count": 1}])]
    finally:
        agent_code = agent.stop()
        collector.stop()
    assert agent_code == 0, agent.text()
