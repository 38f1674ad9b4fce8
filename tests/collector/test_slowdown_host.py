"""The live host side of a slow job (collector/alerting/slowdown_host.py): a rank held in D, the one rank whose
CPU runs far above the others', and nothing for ranks alike."""
from __future__ import annotations

from types import SimpleNamespace

from clusterwatch.collector.alerting.slowdown_host import HostSide
from clusterwatch.collector.health.engine import HealthEngine
from clusterwatch.collector.health.xid_catalog import load_catalog
from clusterwatch.v1 import agent_pb2


def _state(cpus, held=None):
    procs, keys = {}, []
    for rank, cpu in enumerate(cpus):
        key = ("n0", 100 + rank, 1.0)
        state = "D" if held == rank else ""
        procs[key] = SimpleNamespace(alive=True, state=state, state_since=0.0, latest=SimpleNamespace(
            rank=rank, node="n0", pid=100 + rank, wchan="nfs_wait" if state else "", cpu_percent=cpu))
        keys.append(key)
    job = SimpleNamespace(processes=keys, nodes=["n0"])
    return SimpleNamespace(jobs={"7": job}, processes=procs, job_gpus=lambda job: [])


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


def _port(t: float, node: str, engine: HealthEngine, downed: int) -> None:
    msg = agent_pb2.FabricPort(time=t, device="mlx5_0", port=1, state=4, phys_state=5, rate_gbps=200.0, width=4,
                               speed="HDR", link_layer="InfiniBand")
    msg.counters.update({"link_downed": downed})
    engine.observe_port(node, msg, [])


def test_a_port_flapping_on_the_jobs_node_is_named_after_its_ranks_and_not_another_nodes() -> None:
    engine = HealthEngine(load_catalog())
    for node in ("n0", "n9"):
        _port(500.0, node, engine, 0)
        _port(530.0, node, engine, 3)  # went down three times: flapping
    causes = HostSide(_state([110.0, 105.0, 108.0, 20.0], held=3), lambda: engine)("7", 600.0)
    assert [c.kind for c in causes] == ["process_held", "fabric"], causes
    assert causes[1].figures["cause_node"] == "n0" and causes[1].figures["cause_port"] == "mlx5_0/1"
    assert "flapping" in causes[1].text
    # long after, the port steady again: no longer a cause
    _port(2000.0, "n0", engine, 3)
    assert HostSide(_state([110.0, 120.0]), lambda: engine)("7", 3000.0) == []
