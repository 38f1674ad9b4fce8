#!/usr/bin/env python3
"""`/metrics` scrape time for 1,000 nodes, 8,000 GPUs and 1,000 jobs at the default cardinality.

    .venv/bin/python bench/bench_metrics.py [--quick] [--nodes 1000] [--repeat 5]

Builds the collector's state through the real ingest path (CollectorServer's CollectorCore,
.hello() and .batch() per node: 1,000 jobs, one per node, 8 ranks each with 7 DataLoader
workers, 8 GPUs a node, two polls), then times the collector's scrape path as
CollectorServer._start_metrics wires it: Exposition.scrape() (ClusterCollector.snapshot() under
the core's lock, then ClusterCollector.render() writing the text outside it), in the text
format and in OpenMetrics (what Prometheus asks for by default), and a real HTTP GET of
/metrics over loopback with gzip (as Prometheus scrapes). For reference, the library's own path:
prometheus_client.generate_latest of the same ClusterCollector's families. Baseline, same run:
the same series (same names, labels and values) held in prometheus_client Gauges with labels,
exposed by generate_latest. Also series count, bytes, bytes gzipped, and whether the text is
generate_latest's for the same snapshot (line for line; integers written as integers).
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
    feed_health(server)
    build_cpu = time.process_time() - c0
    return server, core, note, build_cpu


def feed_health(server) -> None:
    """Every GPU's health counters as an H100's agent reads them (no retired pages: Ampere and later remap
    rows), through the health engine as ingest hands them on: the GPU health families have their series."""
    from clusterwatch.v1 import agent_pb2

    engine = server.alerting.health.engine
    now = time.time()
    for uuid, gs in server.core.state.gpus.items():
        msg = agent_pb2.GpuHealth(time=now, uuid=uuid, ecc_corrected_volatile=3, ecc_uncorrected_volatile=0,
                                  ecc_corrected_aggregate=12, ecc_uncorrected_aggregate=0, remapped_rows_corrected=0,
                                  remapped_rows_uncorrected=0, remapped_rows_pending=False,
                                  remapped_rows_failure=False, clock_event_reasons=0x4, temperature_c=61,
                                  pcie_replays=0)
        msg.violation_seconds.update({"power": 12.5, "thermal": 0.0, "sync_boost": 0.0, "board_limit": 0.0,
                                      "low_utilization": 3.0, "reliability": 0.0})
        msg.nvlink_errors.update({"replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0})
        engine.observe_counters(gs.node, msg, [])


def cluster_exposition(server, health: str = "basic"):
    """The collector's scrape path, wired as CollectorServer._start_metrics wires it, with its GPU health
    families at `health` (the collector's --gpu-health-metrics: basic, full or none)."""
    from clusterwatch.collector.export import ClusterCollector, Exposition
    from clusterwatch.collector.health.metrics import HealthFamilies, health_snapshot

    core, config = server.core, server.config
    extra = None if health == "none" else HealthFamilies(
        lambda: health_snapshot(server.alerting.health.engine, core.state), full=health == "full")
    return Exposition(ClusterCollector(
        core.state, core.clock, config.per_process_metrics, counters=server.counter_values,
        alerts=server.active_alerts, after_intervals=config.agent_down_after_intervals, extra=extra,
    ), core.lock)


class _Families:
    """A prometheus_client collector yielding fixed families."""

    def __init__(self, families) -> None:
        self.families = list(families)

    def collect(self):
        return self.families


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


def _timed(fn) -> tuple[float, float, object]:
    """Wall and CPU seconds of one call, and its result."""
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w0, time.process_time() - c0, out


def _http_get(url: str, headers: dict) -> bytes:
    import urllib.request

    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60) as r:
        return r.read()


PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
                     "application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;"
                     "escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2")


def run(quick: bool = False, nodes: int = 1000, repeat: int = 5, show: bool = True) -> dict:
    from clusterwatch.collector.export import same_exposition, serve_metrics
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

    if quick:
        nodes, repeat = 20, 2
    with benchlib.tmpdir("cw-bench-metrics-") as tmp:
        server, core, note, build_cpu = build_state(nodes, tmp)
        expo = cluster_exposition(server)
        no_health = cluster_exposition(server, health="none")
        full_health = cluster_exposition(server, health="full")
        col = expo.collector
        old = CollectorRegistry(auto_describe=False)
        old.register(col)
        base = gauge_registry(list(col.collect()))
        httpd = serve_metrics(expo, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{httpd.server_port}/metrics"
        paths = {
            "text": lambda: expo.scrape(),
            "om": lambda: expo.scrape(openmetrics=True),
            "nohealth": lambda: no_health.scrape(),
            "full": lambda: full_health.scrape(),
            "http": lambda: _http_get(url, {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"}),
            "old": lambda: generate_latest(old),
            "base": lambda: generate_latest(base),
        }
        wall: dict[str, list[float]] = {k: [] for k in paths}
        cpu: dict[str, list[float]] = {k: [] for k in paths}
        out: dict[str, bytes] = {}
        try:
            for _ in range(repeat):  # interleaved, so every path sees the same machine
                for key, fn in paths.items():
                    w, c, out[key] = _timed(fn)
                    wall[key].append(w)
                    cpu[key].append(c)
        finally:
            httpd.shutdown()
            httpd.server_close()
        snap_t = []
        for _ in range(repeat):
            with core.lock:
                w, _c, snap = _timed(col.snapshot)
            snap_t.append(w)
        same = same_exposition(col.render(snap), generate_latest(_Families(col.families(snap))))
        same_om = same_exposition(col.render(snap, openmetrics=True), openmetrics_latest(_Families(col.families(snap))))
        text = out["text"]
        gz0 = time.perf_counter()
        cw_gz = gzip.compress(text, compresslevel=1)
        gz_s = time.perf_counter() - gz0
        st = core.state
        counts = (len(st.nodes), len(st.gpus), sum(1 for j in st.jobs.values() if not j.ended), len(st.processes))

    def count(body: bytes) -> int:
        return sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))

    cw = median(wall["text"])
    http = median(wall["http"])

    def row(label, key, series="-", size="-"):
        return [label, median(wall[key]) * 1000, spread([x * 1000 for x in wall[key]]), median(cpu[key]) * 1000,
                series, size, f"{median(wall[key]) / cw:.2f}×"]

    rows = [
        row("clusterwatch ClusterCollector scrape (snapshot + own text)", "text", count(text), len(text)),
        ["  of which the snapshot, under the core's lock", median(snap_t) * 1000,
         spread([x * 1000 for x in snap_t]), "-", "-", "-", "-"],
        row("  same, OpenMetrics (Prometheus's default Accept)", "om", count(out["om"]), len(out["om"])),
        row("  same, --gpu-health-metrics full", "full", count(out["full"]), len(out["full"])),
        row("  same, --gpu-health-metrics none", "nohealth", count(out["nohealth"]), len(out["nohealth"])),
        row("  HTTP GET /metrics on loopback, OpenMetrics + gzip", "http", "-", len(out["http"])),
        row("prometheus_client generate_latest, same families", "old", count(out["old"]), len(out["old"])),
        row("baseline: prometheus_client labelled Gauges", "base", count(out["base"]), len(out["base"])),
    ]
    notes = [
        f"state: {counts[0]:,} nodes, {counts[1]:,} GPUs, {counts[2]:,} jobs, {counts[3]:,} processes, built through "
        f"CollectorCore.hello/.batch in {build_cpu:.1f} CPU s; {note}",
        f"{repeat} runs of each path, interleaved; median wall ms (and CPU ms of this process); gzip level 1 of "
        f"the text: {gz_s * 1000:.0f} ms ({len(cw_gz):,} B).",
        f"text the same as generate_latest's for the same snapshot (line for line; integer values written as "
        f"integers, not 3.2e+09): {'yes' if same else 'NO'}; "
        f"OpenMetrics the same as prometheus_client's: {'yes' if same_om else 'NO'}.",
        f"target ≤ {TARGET_S} s for the clusterwatch exporter: {cw:.3f} s → {verdict(cw <= TARGET_S)}; "
        f"over HTTP with gzip {http:.3f} s → {verdict(http <= TARGET_S)}"
        + ("" if nodes == 1000 else f" (at {nodes} nodes, not the full 1,000)"),
    ]
    out_table = table(f"/metrics generation, {nodes:,} nodes at the default cardinality",
                      ["exporter", "ms", "runs", "CPU ms", "series", "bytes", "vs clusterwatch"], rows, notes)
    if show:
        print(out_table, flush=True)
    return {"seconds": cw, "http_seconds": http, "baseline": median(wall["base"]), "series": count(text),
            "bytes": len(text), "identical": same and same_om, "table": out_table}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few seconds: 20 nodes")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    run(args.quick, args.nodes, args.repeat)


if __name__ == "__main__":
    main()
