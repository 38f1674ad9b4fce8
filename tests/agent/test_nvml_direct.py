"""The NVML source's direct calls (agent/backends/nvml_calls.py) through the real pynvml and the C stand-in.

With the real pynvml the hot path calls the library pynvml loaded, into buffers kept per device: a
list is one call while its buffer is large enough, and the buffer grows when NVML says it is too
small. What the source returns must be what pynvml's wrappers would give.
"""
from __future__ import annotations

import ctypes
import time
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest
from clusterwatch.agent.backends import nvml_calls

from tests.fakes import fake_pynvml
from tests.fakes.nvml_stub import drive, fixtures

stub_lib = fixtures.stub_lib

GiB = 1024**3
MANY = 40  # more than a list buffer's first size


@pytest.fixture
def many_pids() -> Iterator[list[int]]:
    with fixtures.sleeping_pids(MANY) as pids:
        yield pids


def test_lists_longer_than_the_first_buffer_are_read_whole_and_the_grown_buffer_kept(
        stub_lib: Path, tmp_path: Path, many_pids: list[int]) -> None:
    t = time.time()
    state = (f"gpu GPU-aaaa total={80 * GiB} used={10 * GiB} util=75 power=312500 name=NVIDIA H100 80GB HBM3\n"
             + "".join(f"proc GPU-aaaa {pid} {(n + 1) * GiB}\n" for n, pid in enumerate(many_pids))
             + f"proc GPU-aaaa {many_pids[0]} na graphics\n"
             + "".join(f"sample GPU-aaaa {pid} {n % 101} age_us=100000\n" for n, pid in enumerate(many_pids)))
    out = drive(stub_lib, tmp_path, [{"state": state, "now": t}, {"state": state, "now": t + 1}], calls=True)
    for poll in out["polls"]:
        assert poll["errors"] == 0
        assert poll["readings"] == [["GPU-aaaa", 75.0, 10 * GiB, 80 * GiB, 312.5]]
        assert len(poll["processes"]) == MANY
        for n, pid in enumerate(many_pids):
            assert poll["processes"][str(pid)] == [["GPU-aaaa", (n + 1) * GiB, float(n % 101)]]
    lists = [c for c in out["calls"] if c == ["nvmlDeviceGetComputeRunningProcesses_v3", "GPU-aaaa"]]
    samples = [c for c in out["calls"] if c == ["nvmlDeviceGetProcessUtilization", "GPU-aaaa"]]
    # first poll: too small (INSUFFICIENT_SIZE), then grown; second poll: one call into the kept buffer
    assert len(lists) == 3 and len(samples) == 3


def test_the_direct_calls_are_taken_for_the_real_bindings_only() -> None:
    assert nvml_calls.DirectLibrary.of(fake_pynvml.FakeNvml([])) is None  # a fake: its own functions
    if pynvml.nvmlLib is None:  # not loaded in this process (no nvmlInit here): the wrappers, not a crash
        assert nvml_calls.DirectLibrary.of(pynvml) is None


def test_the_unpacking_follows_the_bindings_struct_layout() -> None:
    # pynvml's own structs: the fields read where ctypes puts them, the rest skipped
    sample = nvml_calls._Layout(pynvml.c_nvmlProcessUtilizationSample_t, ("pid", "timeStamp", "smUtil"))
    arr, view = sample.array(2)
    arr[1].pid, arr[1].timeStamp, arr[1].smUtil, arr[1].memUtil = 4242, 1_700_000_000_123_456, 87, 5
    assert sample.unpack is not None
    assert sample.rows(arr, view, 2) == [(0, 0, 0), (4242, 1_700_000_000_123_456, 87)]
    proc = nvml_calls._Layout(pynvml.c_nvmlProcessInfo_v2_t, ("pid", "usedGpuMemory"))
    arr, view = proc.array(1)
    arr[0].pid, arr[0].usedGpuMemory, arr[0].gpuInstanceId = 7, (1 << 64) - 1, 3
    assert proc.rows(arr, view, 1) == [(7, (1 << 64) - 1)]

    class Odd(ctypes.Structure):  # a field that is no plain integer: read by attribute instead
        _fields_ = [("pid", ctypes.c_uint), ("name", ctypes.c_char * 8), ("usedGpuMemory", ctypes.c_ulonglong)]

    odd = nvml_calls._Layout(Odd, ("pid", "name"))
    assert odd.unpack is None
    arr, view = odd.array(1)
    arr[0].pid, arr[0].name = 9, b"x"
    assert odd.rows(arr, view, 1) == [(9, b"x")]
