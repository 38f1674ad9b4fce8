"""Issue 14 item 10: NVML names host pids; an agent whose /proc lists another PID namespace (a container
without `pid: host`) cannot tie GPU memory to processes, and says so at start, in its Hello, and
through the collector in the job's view (NodeView.gpu_pids_note, which `status` shows).

Through the real pynvml and the C stand-in for the driver; a real PID namespace from `unshare`.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
from clusterwatch.agent.backends.pid_visibility import (
    HOST_PID_NAMESPACE,
    NOT_IN_PROC,
    OTHER_NAMESPACE,
    PidListings,
    proc_pid_namespace,
)
from clusterwatch.v1 import query_pb2, query_pb2_grpc

from tests.fakes.nvml_stub import child_env, drive, fixtures, write_state
from tests.services.procs import require_binary
from tests.support.helpers import CLI, ROOT, Collector, Proc, cli, wait_for

stub_lib, live_pids = fixtures.stub_lib, fixtures.live_pids  # the stand-in's fixtures, used by name

GiB = 1024**3
# Above any pid_max this suite meets (Linux allows up to 2^22): never a process here.
FOREIGN = (4_000_017, 4_000_023)
GPU = f"gpu GPU-aaaa total={80 * GiB} used={10 * GiB} util=75 power=312500 name=NVIDIA H100 80GB HBM3\n"


def _fake_proc(root: Path, *, init_ns: str | None, self_ns: str | None, nspid: str) -> Path:
    for pid, link in (("1", init_ns), ("self", self_ns)):
        (root / pid / "ns").mkdir(parents=True)
        if link is not None:
            os.symlink(link, root / pid / "ns" / "pid")  # readlink reads it as the kernel's ns link
    (root / "self" / "status").write_text(f"Name:\tpython\nNSpid:\t{nspid}\n")
    return root


def test_the_namespace_of_the_proc_read_is_told_from_its_links(tmp_path: Path) -> None:
    other = "pid:[4026532179]"
    assert proc_pid_namespace(str(_fake_proc(tmp_path / "a", init_ns=HOST_PID_NAMESPACE, self_ns=other,
                                             nspid="4242\t17"))) is True  # the host's /proc, mounted in
    # A container with its own /proc: NSpid has one level there, as on the host; pid 1's link tells.
    assert proc_pid_namespace(str(_fake_proc(tmp_path / "b", init_ns=other, self_ns=other, nspid="17"))) is False
    # pid 1 not readable (another user's): our own namespace, and NSpid, tell what they can
    assert proc_pid_namespace(str(_fake_proc(tmp_path / "c", init_ns=None, self_ns=HOST_PID_NAMESPACE,
                                             nspid="4242"))) is True
    assert proc_pid_namespace(str(_fake_proc(tmp_path / "d", init_ns=None, self_ns=other, nspid="17"))) is False
    assert proc_pid_namespace(str(_fake_proc(tmp_path / "e", init_ns=None, self_ns=other,
                                             nspid="4242\t17"))) is None
    assert proc_pid_namespace(str(tmp_path / "absent")) is None


def test_a_real_pid_namespace_with_its_own_proc_is_told() -> None:
    # What `docker run` without --pid=host gives: a PID namespace and a /proc of its own.
    unshare = require_binary("unshare", "util-linux")
    code = ("from clusterwatch.agent.backends.pid_visibility import proc_pid_namespace\n"
            "nspid = [line.split()[1:] for line in open('/proc/self/status') if line.startswith('NSpid:')]\n"
            "print(proc_pid_namespace(), len(nspid[0]))")
    out = subprocess.run([unshare, "--pid", "--fork", "--mount-proc", sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    # NSpid has one level in there, as on the host: why the old check (NSpid) read it as the host's
    assert out.stdout.split() == ["False", "1"]


def test_listings_turn_not_in_proc_only_for_pids_absent_two_polls_running() -> None:
    seen = PidListings()
    assert not seen.observe(0, {11})  # one poll: a process may just have exited
    assert not seen.observe(0, {12})
    assert seen.observe(0, {12}) and seen.verdict == NOT_IN_PROC
    assert not seen.observe(0, set())  # nothing listed: no evidence either way
    assert seen.observe(1, {12}) and seen.verdict == ""  # a listed pid is a process here


def test_nvml_pids_absent_from_proc_are_said_once_and_no_longer_counted(stub_lib: Path, tmp_path: Path) -> None:
    state = GPU + "".join(f"proc GPU-aaaa {pid} {GiB}\n" for pid in FOREIGN)
    out = drive(stub_lib, tmp_path, [{"state": state, "now": time.time()}] * 3,
                source={"nested_pid_namespace": False})
    assert [p["pid_visibility"] for p in out["polls"]] == ["", NOT_IN_PROC, NOT_IN_PROC]
    assert [p["errors"] for p in out["polls"]] == [2, 2, 0]  # counted until it is said why
    assert [p["processes"] for p in out["polls"]] == [{}, {}, {}]
    assert sum("no process in this agent's /proc" in line for line in out["log"]) == 1
    assert all(p["readings"][0][2] == 10 * GiB for p in out["polls"])  # the GPU's own memory still shows


def test_a_pid_that_is_here_keeps_the_pids_visible(stub_lib: Path, tmp_path: Path, live_pids: list[int]) -> None:
    # A broken binding's pid beside a real process: counted, dropped, but NVML's pids are this host's.
    state = GPU + f"proc GPU-aaaa {live_pids[0]} {GiB}\nproc GPU-aaaa {FOREIGN[0]} {GiB}\n"
    out = drive(stub_lib, tmp_path, [{"state": state, "now": time.time()}] * 3,
                source={"nested_pid_namespace": False})
    assert [p["pid_visibility"] for p in out["polls"]] == ["", "", ""]
    assert all(set(p["processes"]) == {str(live_pids[0])} for p in out["polls"])


def test_in_another_namespace_the_reason_is_the_namespace(stub_lib: Path, tmp_path: Path,
                                                          live_pids: list[int]) -> None:
    state = GPU + f"proc GPU-aaaa {live_pids[0]} {GiB}\n"
    out = drive(stub_lib, tmp_path, [{"state": state, "now": time.time()}],
                source={"nested_pid_namespace": True})
    assert out["polls"][0]["pid_visibility"] == OTHER_NAMESPACE
    assert out["polls"][0]["processes"] == {}


# --- end to end: the agent's Hello, the collector's job view ------------------------------------

def _node_note(collector: Collector, job_id: str) -> str | None:
    with grpc.insecure_channel(collector.address) as channel:
        try:
            view = query_pb2_grpc.QueryStub(channel).GetJob(query_pb2.GetJobRequest(job_id=job_id), timeout=10)
        except grpc.RpcError:
            return None
    return view.nodes[0].gpu_pids_note if view.nodes else None


def _entry(report: str, needle: str) -> str | None:
    """The report's entry starting with `needle`, its wrapped lines joined (the report keeps to 80 columns)."""
    lines = report.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith(needle):
            indent = len(line) - len(line.lstrip())
            tail = []
            for more in lines[i + 1:]:
                if not more.strip() or len(more) - len(more.lstrip()) <= indent:
                    break
                tail.append(more.strip())
            return " ".join([line.strip(), *tail])
    return None


def _agent_args(collector: Collector, tmp_path: Path, *extra: str) -> list[str]:
    return [*CLI, "agent", "--collector", collector.address, "--node", "gpu-node", "--interval", "0.5",
            "--send-interval", "0", "--gpu-source", "nvml", "--no-provenance", "--kmsg", "none",
            "--spool-dir", str(tmp_path / "spool"), "--train-socket", str(tmp_path / "train.sock"), *extra]


def test_an_agent_in_its_own_pid_namespace_says_so_and_the_job_view_carries_it(stub_lib: Path,
                                                                              tmp_path: Path) -> None:
    unshare = require_binary("unshare", "util-linux")
    state = tmp_path / "nvml-state.txt"
    # The host pid NVML names is also a pid inside the namespace (its pid 1, the agent): not taken.
    write_state(state, GPU + f"proc GPU-aaaa 1 {8 * GiB}\n")
    collector = Collector(tmp_path)
    env = child_env(stub_lib, state)
    agent = Proc([unshare, "--pid", "--fork", "--mount-proc", "--kill-child=SIGTERM",
                  *_agent_args(collector, tmp_path, "--pid", "1", "--job-id", "ns-1")],
                 tmp_path / "agent.log", env=env)
    try:
        note = wait_for(lambda: _node_note(collector, "ns-1"), timeout=60, what="the node's note in the job view")
        with grpc.insecure_channel(collector.address) as channel:
            view = query_pb2_grpc.QueryStub(channel).GetJob(query_pb2.GetJobRequest(job_id="ns-1"), timeout=10)
        rows = [(p.pid, p.HasField("gpu_memory_bytes")) for p in view.processes]
        status = cli("status", "ns-1", "--collector", collector.address)
    finally:
        agent.stop()
        collector.stop()
    assert "PID namespace of its own" in note and "pid: host" in note
    # the text report keeps to 80 columns: the note is read across its wrapped lines
    assert status.returncode == 0 and _entry(status.stdout, "gpu-node: ") == f"gpu-node: {note}", \
        status.stdout + status.stderr
    assert (1, False) in rows  # the agent (pid 1 in there) is not given the host pid 1's GPU memory
    assert sum("PID namespace of its own" in line for line in agent.text().splitlines()) == 1


def test_pids_found_absent_later_reach_the_collector_in_a_fresh_hello(stub_lib: Path, tmp_path: Path) -> None:
    state = tmp_path / "nvml-state.txt"
    worker = subprocess.Popen(["sleep", "300"])
    write_state(state, GPU + f"proc GPU-aaaa {worker.pid} {8 * GiB}\n")
    collector = Collector(tmp_path)
    agent = Proc(_agent_args(collector, tmp_path, "--pid", str(worker.pid), "--job-id", "late-1"),
                 tmp_path / "agent.log", env=child_env(stub_lib, state))
    try:
        wait_for(lambda: _node_note(collector, "late-1") == "", timeout=60, what="the job seen, no note")
        # NVML now names only pids this /proc does not have (as a container's agent would see)
        write_state(state, GPU + "".join(f"proc GPU-aaaa {pid} {GiB}\n" for pid in FOREIGN))
        note = wait_for(lambda: _node_note(collector, "late-1"), timeout=60, what="the note after a fresh Hello")
        write_state(state, GPU + f"proc GPU-aaaa {worker.pid} {8 * GiB}\n")
        wait_for(lambda: _node_note(collector, "late-1") == "", timeout=60, what="the note gone again")
    finally:
        code = agent.stop()
        collector.stop()
        worker.kill()
        worker.wait()
    assert code == 0, agent.text()
    assert "NVML names pids that are no process the agent sees" in note
