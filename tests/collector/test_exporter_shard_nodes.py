"""A shard's /metrics: a node's own series (its GPUs, node_up, node memory) only on the node's collector.

An agent of a sharded deployment streams to its jobs' collectors as well as its node's; each learns the
node (and its GPU inventory) from the stream's Hello. Sums across shards must count a node once.
"""
from __future__ import annotations

from clusterwatch.collector.export import ClusterCollector
from clusterwatch.collector.state.cluster import ClusterState

from clusterwatch.model import GpuInfo

NOW = 1_800_000_000.0


def collector_text(collector: ClusterCollector) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    reg = CollectorRegistry()
    reg.register(collector)
    return generate_latest(reg).decode()


def _state() -> ClusterState:
    st = ClusterState()
    for node in ("gpu001", "gpu002"):
        st.hello(node, f"boot-{node}", "1.0", 1.0, "sim", 1 << 39,
                 [GpuInfo(f"GPU-{node}-{i}", i, "H100", 80 << 30) for i in range(2)], NOW)
    return st


def test_a_shard_exports_only_its_own_nodes_gpus_and_node_series():
    st = _state()
    whole = collector_text(ClusterCollector(st, lambda: NOW))
    shard = collector_text(ClusterCollector(st, lambda: NOW, owns_node=lambda node: node == "gpu001"))
    for name in ("clusterwatch_node_up", "clusterwatch_node_memory_total_bytes", "clusterwatch_gpu_memory_total_bytes"):
        assert f'{name}{{' in whole and 'node="gpu002"' in whole
        lines = [ln for ln in shard.splitlines() if ln.startswith(name + "{")]
        assert lines and all('node="gpu001"' in ln for ln in lines), (name, lines)
