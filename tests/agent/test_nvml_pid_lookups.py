"""The NVML poll's cost (issue 14, benchmarks): a pid NVML listed last time, found a process here then,
is not looked up in /proc again; a pid that was not (broken bindings' pids) is, every time."""
from __future__ import annotations

from clusterwatch.agent.backends.nvml import NvmlGpuSource

from tests.fakes.fake_pynvml import FakeGpu, FakeNvml, FakeProcess

GiB = 1024**3


def test_a_pid_seen_here_is_looked_up_once_a_foreign_one_every_poll() -> None:
    looked_up: list[int] = []

    def visible(pid: int) -> bool:
        looked_up.append(pid)
        return pid != 4294967295

    nv = FakeNvml([FakeGpu(uuid="GPU-aaaa", processes=[FakeProcess(101, GiB), FakeProcess(102, GiB),
                                                         FakeProcess(4294967295, GiB)])])
    src = NvmlGpuSource(nv, pid_visible=visible, nested_pid_namespace=False)
    polls = [src.poll(1000.0 + i) for i in range(3)]
    assert [sorted(p.processes) for p in polls] == [[101, 102]] * 3
    assert [p.errors for p in polls] == [1, 1, 1]  # the foreign pid counted each poll
    assert sorted(looked_up) == [101, 102] + [4294967295] * 3
    # a pid new to the list is looked up
    nv.gpus[0].processes.append(FakeProcess(103, GiB))
    src.poll(1003.0)
    assert looked_up.count(103) == 1 and looked_up.count(101) == 1
