#!/usr/bin/env python3
"""`/metrics` generation time for 1,000 nodes, 8,000 GPUs and 1,000 jobs at the default cardinality.

    .venv/bin/python bench/bench_metrics.py [--quick] [--nodes 1000] [--repeat 5]

Builds the collector's state through the real ingest path (CollectorServer's CollectorCore,
.hello() and .batch() per node: 1,000 jobs, one per node, 8 ranks each with 7 DataLoader
workers, 8 GPUs a node, two polls), then times prometheus_client.generate_latest on a fresh
CollectorRegistry holding the real ClusterCollector, wired as the collector wires it
(CollectorServer._start_metrics). Baseline, same run: the same series (same names, labels
and values, read from the ClusterCollector's output) held in prometheus_client Gauges with
labels, exposed by generate_latest. Also series count, bytes, and bytes gzipped.
"""
from __future__ import annotations

import argparse
import gzip
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchlib  # noqa: E402
from benchlib import median, spread, table, verdict  # noqa: E402

TARGET_S = 0.5


def build_state(nodes: int, tmp: str):
    from clusterwatch.v1 import agent_pb2

    server, core, note = benchlib.collector_server_core(tmp)
    t0 = time.time() - 10
    c0 = time.process_time()
    for n in range(nodes):
        sim = benchlib.NodeSim(f"node{n:04d}", f"{100000 + n}")
        core.hello(sim.hello().hello)
        bb = benchlib.BatchBytes(sim, variants=2)
        for k in range(2):
            core.batch(sim.node, sim.boot_id, agent_pb2.AgentMessage.FromString(bb.next(t0 + 5 * k)[1]).batch)
    build_cpu = time.process_time() - c0
    return server, core, note, build_cpu


def cluster_registry(server):
    from clusterwatch.collector.exporter import ClusterCollector
    from prometheus_client import CollectorRegistry

    core, config = server.core, server.config
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector(
        core.state, core.clock, config.per_process_metrics, counters=core.counter_values,
        alerts=server.active_alerts, after_intervals=config.agent_down_after_intervals,
    ))
    return registry


def gauge_registry(families):
    """The same series in long-lived labelled Gauges (the baseline way of exporting)."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics

    disable_created_metrics()  # the clusterwatch families carry no _created series either
    registry = CollectorRegistry(auto_describe=False)
    for fam in families:
        if not fam.samples:
            continue
        labelnames = list(fam.samples[0].labels)
        if fam.type == "info":
            # an Info whose label sets vary per series is, in the exposition, a Gauge `<name>_info` at 1
            g = Gauge(fam.name + "_info", fam.documentation, labelnames=labelnames, registry=registry)
            for s in fam.samples:
                g.labels(**s.labels).set(s.value)
            continue
        if fam.type == "counter":
            labelled = bool(labelnames)
            c = Counter(fam.name, fam.documentation, labelnames=labelnames, registry=registry)
            for s in fam.samples:
                if s.name.endswith("_created"):
                    continue
                (c.labels(**s.labels) if labelled else c).inc(s.value)
            continue
        g = Gauge(fam.name, fam.documentation, labelnames=labelnames, registry=registry)
        for s in fam.samples:
            g.labels(**s.labels).set(s.value)
    return registry


def time_generate(registry, repeat: int) -> tuple[list[float], bytes]:
    from prometheus_client import generate_latest

    times, text = [], b""
    for _ in range(repeat):
        t0 = time.perf_counter()
        text = generate_latest(registry)
        times.append(time.perf_counter() - t0)
    return times, text


def run(quick: bool = False, nodes: int = 1000, repeat: int = 5, show: bool = True) -> dict:
    if quick:
        nodes, repeat = 20, 2
    with benchlib.tmpdir("cw-bench-metrics-") as tmp:
        server, core, note, build_cpu = build_state(nodes, tmp)
        reg = cluster_registry(server)
        families = list(reg.collect())
        base = gauge_registry(families)
        cw_t, base_t = [], []
        for _ in range(repeat):  # alternate, so both see the same machine
            t, cw_text = time_generate(reg, 1)
            cw_t += t
            t, base_text = time_generate(base, 1)
            base_t += t
        collect_t = []
        for _ in range(max(1, repeat // 2)):
            c0 = time.perf_counter()
            list(reg.collect())
            collect_t.append(time.perf_counter() - c0)
        gz0 = time.perf_counter()
        cw_gz = gzip.compress(cw_text)
        gz_s = time.perf_counter() - gz0
        st = core.state
        counts = (len(st.nodes), len(st.gpus), sum(1 for j in st.jobs.values() if not j.ended), len(st.processes))
    series = sum(1 for line in cw_text.splitlines() if line and not line.startswith(b"#"))
    base_series = sum(1 for line in base_text.splitlines() if line and not line.startswith(b"#"))
    cw, bs = median(cw_t), median(base_t)
    rows = [
        ["clusterwatch ClusterCollector (scrape-time families)", cw * 1000, spread([x * 1000 for x in cw_t]),
         series, len(cw_text), "1.0×"],
        ["  of which ClusterCollector.collect() (families, no text)", median(collect_t) * 1000,
         spread([x * 1000 for x in collect_t]), "-", "-", "-"],
        ["baseline: prometheus_client labelled Gauges", bs * 1000, spread([x * 1000 for x in base_t]),
         base_series, len(base_text), f"{bs / cw:.2f}×"],
    ]
    notes = [
        f"state: {counts[0]:,} nodes, {counts[1]:,} GPUs, {counts[2]:,} jobs, {counts[3]:,} processes, built through "
        f"CollectorCore.hello/.batch in {build_cpu:.1f} CPU s; {note}",
        f"generate_latest on a fresh CollectorRegistry, {repeat} times each, alternating; median; gzip of the "
        f"clusterwatch text adds {gz_s * 1000:.0f} ms ({len(cw_gz):,} B).",
        f"target ≤ {TARGET_S} s for the clusterwatch exporter: {cw:.3f} s → {verdict(cw <= TARGET_S)}"
        + ("" if nodes == 1000 else f" (at {nodes} nodes, not the full 1,000)"),
    ]
    out = table(f"/metrics generation, {nodes:,} nodes at the default cardinality",
                ["exporter", "ms", "runs", "series", "bytes", "vs clusterwatch"], rows, notes)
    if show:
        print(out, flush=True)
    return {"seconds": cw, "baseline": bs, "series": series, "bytes": len(cw_text), "table": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few seconds: 20 nodes")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    run(args.quick, args.nodes, args.repeat)


if __name__ == "__main__":
    main()
