"""The live host side of a slow job (collector/alerting/slowdown_host.py): a rank held in D, the one rank whose
CPU runs far above the others', and nothing for ranks alike."""
from __future__ import annotations

from types import SimpleNamespace

from clusterwatch.collector.alerting.slowdown_host import HostSide


def _state(cpus, held=None):
    procs, keys = {}, []
    for rank, cpu in enumerate(cpus):
        key = ("n0", 100 + rank, 1.0)
        state = "D" if held == rank else ""
        procs[key] = SimpleNamespace(alive=True, state=state, state_since=0.0, latest=SimpleNamespace(
            rank=rank, node="n0", pid=100 + rank, wchan="nfs_wait" if state else "", cpu_percent=cpu))
        keys.append(key)
    return SimpleNamespace(jobs={"7": SimpleNamespace(processes=keys)}, processes=procs)


def test_the_rank_whose_cpu_saturates_is_named() -> None:
    causes = HostSide(_state([110.0, 105.0, 180.0, 108.0]))("7", 600.0)
    assert [c.figures["cause_rank"] for c in causes] == [2] and causes[0].kind == "rank_cpu"


def test_a_rank_held_in_d_comes_first() -> None:
    causes = HostSide(_state([110.0, 105.0, 108.0, 20.0], held=3))("7", 600.0)
    assert causes[0].kind == "process_held" and causes[0].figures["cause_rank"] == 3
    assert "nfs_wait" in causes[0].text


def test_ranks_alike_and_an_unknown_job_name_nothing() -> None:
    assert HostSide(_state([110.0, 120.0, 100.0, 115.0]))("7", 600.0) == []
    assert HostSide(_state([110.0]))("8", 600.0) == []
