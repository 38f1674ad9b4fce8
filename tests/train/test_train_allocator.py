"""clusterwatch.train's allocator figures: read from an already imported torch, or passed by the caller.

torch is not installed here; the tests hand report() a module object shaped like torch (its `.cuda`
with is_initialized, current_device, device_count, memory_stats, memory_allocated, memory_reserved,
get_device_properties), placed in sys.modules the way an imported torch sits there.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import pytest
from clusterwatch.agent.train_endpoint import TrainEndpoint

from clusterwatch import train

GiB = 1 << 30


def fake_torch(devices: dict[int, dict], initialized: bool = True, current: int = 0) -> types.ModuleType:
    """A module shaped like torch whose allocator holds `devices` (index -> memory_stats keys)."""
    cuda = types.ModuleType("torch.cuda")
    cuda.calls = []  # type: ignore[attr-defined]
    count = max(devices, default=-1) + 1

    def record(name, value):
        cuda.calls.append(name)  # type: ignore[attr-defined]
        return value

    cuda.is_initialized = lambda: record("is_initialized", initialized)  # type: ignore[attr-defined]
    cuda.current_device = lambda: record("current_device", current)  # type: ignore[attr-defined]
    cuda.device_count = lambda: record("device_count", count)  # type: ignore[attr-defined]
    cuda.memory_stats = lambda i: record("memory_stats", dict(devices.get(i, {})))  # type: ignore[attr-defined]
    cuda.memory_allocated = lambda i: record("memory_allocated", 0)  # type: ignore[attr-defined]
    cuda.memory_reserved = lambda i: record("memory_reserved", 0)  # type: ignore[attr-defined]
    cuda.get_device_properties = lambda i: record(  # type: ignore[attr-defined]
        "get_device_properties", types.SimpleNamespace(uuid=f"5a1d2c3e-0000-4000-8000-00000000000{i}"))

    def synchronize(*a):
        raise AssertionError("report() synchronised the GPU")

    cuda.synchronize = synchronize  # type: ignore[attr-defined]
    torch = types.ModuleType("torch")
    torch.cuda = cuda  # type: ignore[attr-defined]
    return torch


def stats(allocated: int, reserved: int, retries: int = 0, inactive: int = 0) -> dict:
    return {"allocated_bytes.all.current": allocated, "reserved_bytes.all.current": reserved,
            "num_alloc_retries": retries, "inactive_split_bytes.all.current": inactive,
            "active_bytes.all.peak": allocated}


@pytest.fixture
def sock_dir():
    d = Path(tempfile.mkdtemp(prefix="cw-alloc-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def agent(sock_dir, monkeypatch):
    """The agent's part: a bound datagram socket; this process's train state fresh and pointed at it."""
    path = str(sock_dir / "train.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    monkeypatch.setenv(train.SOCKET_ENV, path)
    monkeypatch.setattr(train, "_state", train._State())
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    yield sock
    sock.close()


def received(sock: socket.socket) -> dict:
    return json.loads(sock.recv(65536))


def test_an_initialised_torch_gives_each_used_device_once_per_interval(agent, monkeypatch):
    torch = fake_torch({0: stats(3 * GiB, 4 * GiB, retries=2, inactive=5 << 20), 1: stats(0, 0),
                        2: stats(GiB, 2 * GiB)})
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert train.report(step=1)
    assert received(agent) == {"v": 1, "step": 1, "gpu": [
        {"index": 0, "uuid": "5a1d2c3e-0000-4000-8000-000000000000", "allocated": 3 * GiB,
         "reserved": 4 * GiB, "alloc_retries": 2, "inactive_split": 5 << 20},
        {"index": 2, "uuid": "5a1d2c3e-0000-4000-8000-000000000002", "allocated": GiB,
         "reserved": 2 * GiB, "alloc_retries": 0, "inactive_split": 0}]}  # device 1 unused: left out
    calls = len(torch.cuda.calls)
    assert train.report(step=2)
    assert received(agent) == {"v": 1, "step": 2}  # not due again for ALLOCATOR_EVERY_S
    assert len(torch.cuda.calls) == calls  # and torch was not even asked
    train._state.allocator_due = time.monotonic() - 1  # the interval has passed
    assert train.report(step=3)
    assert [g["index"] for g in received(agent)["gpu"]] == [0, 2]
    assert torch.cuda.calls.count("get_device_properties") == 2  # the UUIDs are read once


def test_the_current_device_is_reported_before_its_first_allocation(agent, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", fake_torch({0: stats(0, 0), 1: stats(0, 0)}, current=1))
    train.report(step=0)
    assert [(g["index"], g["allocated"], g["reserved"]) for g in received(agent)["gpu"]] == [(1, 0, 0)]


@pytest.mark.parametrize("torch", [None, fake_torch({0: stats(GiB, GiB)}, initialized=False),
                                   types.ModuleType("torch")], ids=["no torch", "cuda not initialised",
                                                                    "torch without cuda"])
def test_no_figures_without_torch_using_cuda_and_torch_is_never_imported(agent, monkeypatch, torch):
    if torch is not None:
        monkeypatch.setitem(sys.modules, "torch", torch)
    assert train.report(step=4)
    assert received(agent) == {"v": 1, "step": 4}
    if torch is None:
        assert "torch" not in sys.modules
    else:
        assert "memory_stats" not in getattr(getattr(torch, "cuda", None), "calls", [])


def test_a_torch_that_fails_costs_the_figures_not_the_report(agent, monkeypatch):
    torch = fake_torch({0: stats(GiB, GiB)})

    def broken(i):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    torch.cuda.memory_stats = broken  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert train.report(step=5, loss=0.5)
    assert received(agent) == {"v": 1, "step": 5, "loss": 0.5}


def test_stats_without_the_keys_fall_back_to_memory_allocated_and_reserved(agent, monkeypatch):
    torch = fake_torch({0: {}})
    torch.cuda.memory_allocated = lambda i: 7  # type: ignore[attr-defined]
    torch.cuda.memory_reserved = lambda i: 9  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    train.report(step=6)
    [gpu] = received(agent)["gpu"]
    assert (gpu["allocated"], gpu["reserved"]) == (7, 9) and "alloc_retries" not in gpu


def test_other_frameworks_pass_the_figures_and_bad_ones_are_counted(agent, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", fake_torch({0: stats(GiB, GiB)}))
    assert train.report(step=7, gpu_allocated_bytes=5 * GiB, gpu_reserved_bytes=6 * GiB)
    # the caller's figures win: torch's are not read in the same report
    assert received(agent) == {"v": 1, "step": 7, "gpu": [{"allocated": 5 * GiB, "reserved": 6 * GiB}]}
    before = train.invalid()
    assert train.report(step=8, gpu_allocated_bytes=-1, gpu_reserved_bytes=True)  # type: ignore[arg-type]
    assert received(agent) == {"v": 1, "step": 8}
    assert train.invalid() - before == 2
    assert train.report(gpu_reserved_bytes=1.5)  # type: ignore[arg-type]
    assert received(agent) == {"v": 1}


def test_figures_that_would_overflow_the_datagram_are_left_out_not_the_report(agent, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", fake_torch({i: stats(GiB, GiB) for i in range(16)}))
    metrics = {f"m{i:02d}_" + "x" * 60: float(i) for i in range(32)}
    assert train.report(step=9, **metrics)
    got = received(agent)
    assert "gpu" not in got and len(got["m"]) == 32
    assert train.report(step=10)  # still due: the next report that fits carries them
    assert len(received(agent)["gpu"]) == 16


PROCESS = r"""
import sys, types
from clusterwatch import train
cuda = types.ModuleType("torch.cuda")
stats = {"allocated_bytes.all.current": 3 << 30, "reserved_bytes.all.current": 4 << 30,
         "num_alloc_retries": 1, "inactive_split_bytes.all.current": 1 << 20}
cuda.is_initialized = lambda: True
cuda.current_device = lambda: 0
cuda.device_count = lambda: 1
cuda.memory_stats = lambda i: stats
cuda.get_device_properties = lambda i: types.SimpleNamespace(uuid="5a1d2c3e-0000-4000-8000-000000000000")
torch = types.ModuleType("torch")
torch.cuda = cuda
sys.modules["torch"] = torch
ok = [train.report(step=1, loss=2.0), train.report(step=2, gpu_allocated_bytes=10, gpu_reserved_bytes=20)]
print(ok, train.invalid())
"""


def run_process(sock: str) -> str:
    env = {**os.environ, train.SOCKET_ENV: sock}
    return subprocess.run([sys.executable, "-c", PROCESS], env=env, capture_output=True, text=True,
                          timeout=30, check=True).stdout.strip()


def test_a_real_process_sends_the_figures_in_real_datagrams(sock_dir):
    path = str(sock_dir / "raw.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(10)
        assert run_process(path) == "[True, True] 0"
        first, second = json.loads(sock.recv(65536)), json.loads(sock.recv(65536))
    assert first["gpu"] == [{"index": 0, "uuid": "5a1d2c3e-0000-4000-8000-000000000000", "allocated": 3 << 30,
                             "reserved": 4 << 30, "alloc_retries": 1, "inactive_split": 1 << 20}]
    assert second["gpu"] == [{"allocated": 10, "reserved": 20}]


def test_a_real_agent_endpoint_takes_reports_with_the_figures(sock_dir):
    with TrainEndpoint(str(sock_dir / "run" / "train.sock")) as ep:
        assert run_process(ep.path) == "[True, True] 0"
        got: list = []
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            got += ep.drain()
            time.sleep(0.02)
        assert [(r.step, r.loss) for r in got] == [(1, 2.0), (2, None)]
        assert ep.rejected == 0


# -- the agent's side: the endpoint parses the figures, the protobuf message carries them ----------

def test_the_endpoint_parses_the_figures():
    from clusterwatch.agent.train_endpoint import parse_datagram

    from clusterwatch.model import AllocatorFigures

    r = parse_datagram(json.dumps({"v": 1, "step": 3, "gpu": [
        {"index": 0, "uuid": "5a1d2c3e-0000-4000-8000-000000000000", "allocated": 3 * GiB, "reserved": 4 * GiB,
         "alloc_retries": 2, "inactive_split": 5 << 20},
        {"allocated": 10, "reserved": 20, "future_key": "ignored"}]}).encode(), 42, 9.5, 100.0)
    assert r.gpu_memory == [AllocatorFigures(0, "5a1d2c3e-0000-4000-8000-000000000000", 3 * GiB, 4 * GiB, 2, 5 << 20),
                            AllocatorFigures(None, "", 10, 20, None, None)]
    assert parse_datagram(b'{"v":1,"step":3}', 42, 9.5, 100.0).gpu_memory == []


@pytest.mark.parametrize("gpu, error", [
    ({"index": 0}, "gpu is not a list of at most 16 entries"),
    ([{"index": 0}] * 17, "gpu is not a list of at most 16 entries"),
    ([1], "a gpu entry is not an object"),
    ([{"allocated": -1}], "gpu allocated is not an int from 0 to"),
    ([{"reserved": 1.5}], "gpu reserved is not an int from 0 to"),
    ([{"alloc_retries": True}], "gpu alloc_retries is not an int from 0 to"),
    ([{"inactive_split": 2**63}], "gpu inactive_split is not an int from 0 to"),
    ([{"index": 2**32}], "gpu index is not an int from 0 to 4294967295"),
    ([{"uuid": "\ud800"}], "gpu uuid is not valid Unicode"),
    ([{"uuid": 7}], "gpu uuid is not a string of 0-64 characters"),
])
def test_the_endpoint_refuses_figures_the_message_cannot_carry(gpu, error):
    from clusterwatch.agent.train_endpoint import parse_datagram

    with pytest.raises(ValueError, match="^" + error.replace("(", r"\(")):
        parse_datagram(json.dumps({"v": 1, "gpu": gpu}).encode(), 42, 9.5, 100.0)


def test_the_figures_travel_in_the_protobuf_message():
    from clusterwatch.v1 import agent_pb2

    from clusterwatch.model import AllocatorFigures, TrainingReport
    from clusterwatch.wire import training_from_proto, training_to_proto

    report = TrainingReport(100.0, 42, 9.5, step=3, gpu_memory=[
        AllocatorFigures(0, "u0", 2**63 - 1, 0, 7, 1), AllocatorFigures(None, "", 10, None, None, None)])
    msg = agent_pb2.TrainingSample()
    training_to_proto(report, msg)
    assert training_from_proto(agent_pb2.TrainingSample.FromString(msg.SerializeToString())) == report


def test_a_real_process_s_figures_reach_a_real_endpoint_parsed(sock_dir):
    with TrainEndpoint(str(sock_dir / "run" / "train.sock")) as ep:
        assert run_process(ep.path) == "[True, True] 0"
        got: list = []
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            got += ep.drain()
            time.sleep(0.02)
    assert [[(g.index, g.allocated_bytes, g.reserved_bytes, g.alloc_retries, g.inactive_split_bytes)
             for g in r.gpu_memory] for r in got] == [[(0, 3 << 30, 4 << 30, 1, 1 << 20)],
                                                        [(None, 10, 20, None, None)]]
    assert got[0].gpu_memory[0].uuid == "5a1d2c3e-0000-4000-8000-000000000000" and ep.rejected == 0
