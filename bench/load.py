#!/usr/bin/env python3
"""Load: simulated agents for 1,000 nodes × 64 processes at 1 Hz against one real collector, or N.

    .venv/bin/python bench/load.py [--nodes 1000] [--duration 60] [--interval 1] [--polls 5] [--clients 4]
                                   [--collectors N] [--quick]

`--collectors N` (N > 1): the same load against one collector, then against N shards (each started with
the deployment's --collectors list and its --shard), routed as the agent routes it (agent/shard_streams.py):
a node's job (one job a node, 64 processes on its 8 GPUs) goes to the job's collector (`for_job`) with the
readings of its GPUs, and, where the node's own collector (`for_node`) is another, a second stream carries
the node's GPU readings there, a batch each send interval as the agent's node stream does. Printed: the
one collector's table, then a table a collector and in all (samples/s ingested, messages/s, CPU, RSS).

A real `clusterwatch collector` process (fresh store, loopback), and `--clients` OS processes,
each multiplexing its share of the nodes on grpc.aio: one channel and one stream per node,
as a real agent has, a hello and then one numbered batch of 64 process samples (8 ranks × 7
DataLoader workers, 8 GPUs) per interval, joined as the agent joins them: with its default 5 s
send interval an agent polling every second sends a batch of five polls every 5 s (`--polls 1`:
a batch every poll). The nodes' phases are spread over the send interval.

Reported: samples/s ingested (acknowledged), the collector's CPU (utime+stime of its
process from /proc/<pid>/stat over the run, in cores), its RSS at the end, acknowledgement
delay (time from handing a batch to gRPC to its ack) p50/p99/max, and samples sent vs
acknowledged vs the collector's own clusterwatch_ingest_samples_total (dropped must be 0).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchlib  # noqa: E402
from benchlib import PYTHON, Children, CollectorProc, table, verdict  # noqa: E402

HERE = os.path.abspath(__file__)


def routes(addresses: list[str], first: int, count: int) -> list[tuple[str, str, str, bool]]:
    """(node, job, collector, carries processes) a stream: one a node for one collector, two for several where
    the node's own collector is not its job's (clusterwatch/shards.py, as agent/shard_streams.py routes)."""
    from clusterwatch.shards import Collectors

    deployment = Collectors(tuple(addresses))
    out = []
    for n in range(first, first + count):
        node, job = f"load-node{n:04d}", f"load-job{n:04d}"
        out.append((node, job, deployment.for_job(job), True))
        if deployment.for_node(node) != deployment.for_job(job):
            out.append((node, job, deployment.for_node(node), False))  # the node's own: its GPU readings
    return out


def client(address: str, first: int, count: int, duration: float, interval: float, start_at: float,
           polls: int) -> dict:
    """Nodes first..first+count-1, sending from start_at (Unix time) for `duration`; `address` one collector
    or the deployment's list, comma-separated."""

    async def main() -> dict:
        # the batches are built before the start (it takes seconds), so every node sends for `duration`
        streams = routes(address.split(","), first, count)
        sims = [benchlib.NodeSim(node, job, ranks=8 if procs else 0) for node, job, _, procs in streams]
        bbs = [benchlib.BatchBytes(s, polls=polls, interval=interval) for s in sims]
        every = interval * polls
        results = [benchlib.StreamResult() for _ in sims]
        channels = [benchlib.aio_channel(target) for _, _, target, _ in streams]
        delay = start_at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            print(f"load client: batches built {-delay:.1f} s after the common start", file=sys.stderr)
        until = time.monotonic() + duration
        c0 = time.process_time()
        node_index = {node: i for i, node in enumerate(dict.fromkeys(node for node, _, _, _ in streams))}
        await asyncio.gather(*(
            benchlib.agent_stream(ch, bb, r, interval=every, until=until, window=1_000_000,
                                  phase=every * node_index[route[0]] / count, drain_timeout=30.0)
            for ch, bb, r, route in zip(channels, bbs, results, streams, strict=True)
        ))
        cpu = time.process_time() - c0
        for ch in channels:
            await ch.close()
        delays = sorted(round(d * 1000, 2) for r in results for d in r.delays)
        # the same, for batches sent after the first 15 s (once every process is known to the collector)
        settled = sorted(round(d * 1000, 2) for r in results for d, t in zip(r.delays, r.sent_times, strict=True)
                         if t >= until - duration + 15.0)
        by_collector: dict[str, dict[str, int]] = {}
        for (_, _, target, _), r in zip(streams, results, strict=True):
            got = by_collector.setdefault(target, {"sent": 0, "acked": 0, "batches": 0, "streams": 0})
            got["sent"] += r.samples_sent
            got["acked"] += r.samples_acked
            got["batches"] += r.acked
            got["streams"] += 1
        return {"by_collector": by_collector,
                "sent": sum(r.samples_sent for r in results), "acked": sum(r.samples_acked for r in results),
                "batches": sum(r.sent for r in results), "delays_ms": delays, "settled_ms": settled, "client_cpu": cpu,
                "errors": [r.error for r in results if r.error]}

    return asyncio.run(main())


def free_ports(n: int) -> list[int]:
    """n TCP ports on 127.0.0.1 nothing listens on now, distinct: held open together while picked, then let go
    (the shards' list must be known before they start, each collector taking its own entry)."""
    import socket

    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def pct(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def run(quick: bool = False, nodes: int = 1000, duration: float = 60.0, interval: float = 1.0,
        clients: int = 4, show: bool = True, polls: int = 5, collectors: int = 1) -> dict:
    """One collector's table; with `collectors` > 1 the same load against that many shards after it."""
    if quick:
        nodes, duration, clients = 20, 3.0, 1
    clients = max(1, min(clients, nodes))
    one = phase(1, nodes, duration, interval, clients, polls)
    out = one_table(one, nodes, duration, interval, polls, clients)
    if show:
        print(out, flush=True)
    result = {"rate": one["rate"], "cores": one["cores"], "p99_ms": pct(one["delays"], 0.99),
              "dropped": one["dropped"], "table": out, "cpu_ms_per_1000": one["cpu_ms_per_1000"]}
    if collectors > 1:
        many = phase(collectors, nodes, duration, interval, clients, polls)
        text = shards_table(one, many, nodes, duration, interval, polls)
        if show:
            print(text, flush=True)
        result["shards"] = {"table": text, "dropped": many["dropped"], "rate": many["rate"],
                            "per_collector": many["per_collector"]}
    return result


def phase(n_collectors: int, nodes: int, duration: float, interval: float, clients: int, polls: int) -> dict:
    """The load against `n_collectors` fresh collectors (shards of one deployment when several)."""
    with benchlib.tmpdir("cw-load-") as tmp, Children() as children:
        if n_collectors == 1:
            procs_c = [CollectorProc(children, tmp, name="load-collector")]
        else:
            addresses = [f"127.0.0.1:{p}" for p in free_ports(n_collectors)]
            listed = ",".join(addresses)
            # --listen again after CollectorProc's own port 0: the last one given is the one taken
            procs_c = [CollectorProc(children, tmp, "--listen", a, "--collectors", listed, "--shard", a,
                                     name=f"load-shard{i}") for i, a in enumerate(addresses)]
        addresses = [c.address for c in procs_c]
        start_at = time.time() + 3.0 + nodes * polls / 250  # time for the clients to import and build their batches
        procs = []
        per = [nodes // clients + (1 if i < nodes % clients else 0) for i in range(clients)]
        first = 0
        for i, n in enumerate(per):
            out = open(os.path.join(tmp, f"client{i}.json"), "wb")
            err = open(os.path.join(tmp, f"client{i}.log"), "wb")
            p = children.start([PYTHON, HERE, "--client", ",".join(addresses), "--first", str(first), "--count",
                                str(n), "--duration", str(duration), "--interval", str(interval), "--polls", str(polls),
                                "--start-at", repr(start_at)], stdout=out, stderr=err)
            procs.append((p, out, err))
            first += n
        time.sleep(max(0.0, start_at - time.time()))
        c0, w0 = [benchlib.proc_cpu_s(c.pid) for c in procs_c], time.monotonic()
        for p, out, err in procs:
            p.wait(timeout=duration + 120)
            out.close()
            err.close()
        c1, w1 = [benchlib.proc_cpu_s(c.pid) for c in procs_c], time.monotonic()
        rss = [benchlib.proc_rss_bytes(c.pid) for c in procs_c]
        results = []
        for i, (p, _, _) in enumerate(procs):
            if p.returncode != 0:
                with open(os.path.join(tmp, f"client{i}.log"), errors="replace") as f:
                    raise RuntimeError(f"load client {i} failed: {f.read()[-2000:]}")
            with open(os.path.join(tmp, f"client{i}.json")) as f:
                results.append(json.loads(f.read().strip().splitlines()[-1]))
        texts = [c.metrics() for c in procs_c]
        stored = [benchlib.metric_value(t, "clusterwatch_ingest_samples_total") for t in texts]
        for c in procs_c:
            c.stop()
        with open(procs_c[0].log_path, errors="replace") as f:
            collector_log = [line.rstrip() for line in f if line.strip()][-3:]
    wall = w1 - w0
    per_collector = []
    for i, address in enumerate(addresses):
        got = {"sent": 0, "acked": 0, "batches": 0, "streams": 0}
        for r in results:
            for k, v in r["by_collector"].get(address, {}).items():
                got[k] += v
        cpu = c1[i] - c0[i]
        per_collector.append({"address": address, **got, "rate": got["acked"] / duration,
                              "messages_per_s": got["batches"] / duration, "cores": cpu / wall,
                              "rss": rss[i], "stored": stored[i],
                              "cpu_ms_per_1000": cpu / max(got["acked"], 1) * 1e6})
    sent = sum(r["sent"] for r in results)
    acked = sum(r["acked"] for r in results)
    cpu_all = sum(c1) - sum(c0)
    return {"per_collector": per_collector, "sent": sent, "acked": acked, "dropped": sent - acked,
            "rate": acked / duration, "cores": cpu_all / wall, "wall": wall,
            "cpu_ms_per_1000": cpu_all / max(acked, 1) * 1e6, "rss": sum(rss),
            "stored": sum(x for x in stored if x is not None) if all(x is not None for x in stored) else None,
            "delays": sorted(d for r in results for d in r["delays_ms"]),
            "settled": sorted(d for r in results for d in r["settled_ms"]),
            "errors": [" ".join(e.split()) for r in results for e in r["errors"]],
            "client_cpu": sum(r["client_cpu"] for r in results), "log": collector_log}


def one_table(one: dict, nodes: int, duration: float, interval: float, polls: int, clients: int) -> str:
    delays, settled, errors = one["delays"], one["settled"], one["errors"]
    stored, sent, acked, dropped = one["stored"], one["sent"], one["acked"], one["dropped"]
    rows = [
        ["nodes × processes at interval", f"{nodes:,} × 64 every {interval:g} s, {polls} polls a batch"],
        ["duration (sending) / wall incl. drain", f"{duration:g} s / {one['wall']:.1f} s"],
        ["samples offered per second", f"{nodes * 64 / interval:,.0f}"],
        ["samples/s ingested (acknowledged / duration)", f"{one['rate']:,.0f}"],
        ["collector CPU (cores, whole process)", f"{one['cores']:.2f}"],
        ["collector CPU per 1,000 samples", f"{one['cpu_ms_per_1000']:.1f} ms"],
        ["collector RSS at the end", f"{one['rss'] / benchlib.MiB:.0f} MiB"],
        ["ack delay p50 / p99 / max", f"{pct(delays, 0.5):.1f} / {pct(delays, 0.99):.1f} / "
                                      f"{(delays[-1] if delays else float('nan')):.1f} ms"],
        ["  the same, batches sent after the first 15 s", f"{pct(settled, 0.5):.1f} / {pct(settled, 0.99):.1f} / "
                                                          f"{(settled[-1] if settled else float('nan')):.1f} ms"],
        ["samples sent / acknowledged / collector's ingest_samples_total",
         f"{sent:,} / {acked:,} / {stored:,.0f}" if stored is not None else f"{sent:,} / {acked:,} / -"],
        ["dropped (sent − acknowledged)", f"{dropped:,}"],
        ["stream errors", str(len(errors)) + (f" (first: {errors[0][:90]})" if errors else "")],
        ["load clients: processes / CPU s total", f"{clients} / {one['client_cpu']:.1f}"],
    ]
    ok_rate = one["rate"] >= 0.99 * nodes * 64 / interval * (duration - interval * polls) / duration
    notes = [
        f"dropped must be 0: {verdict(dropped == 0 and (stored is None or stored == acked))}; "
        f"kept up with the offered rate: {verdict(ok_rate)}",
        f"The machine has {os.cpu_count()} cores shared by the collector and the load clients; the clients' CPU "
        "is not the collector's.",
    ]
    if errors and one["log"]:
        notes.append("collector log, last lines: " + " | ".join(line[:160] for line in one["log"]))
    return table("Load: simulated agents against one collector", ["figure", "value"], rows, notes)


def shards_table(one: dict, many: dict, nodes: int, duration: float, interval: float, polls: int) -> str:
    rows = []

    def row(name: str, f: dict, streams: int) -> list:
        stored = f["stored"]
        return [name, f"{streams:,}", f"{f['rate']:,.0f}", f"{f['messages_per_s']:,.0f}", f"{f['cores']:.2f}",
                f"{f['cpu_ms_per_1000']:.1f}", f"{f['rss'] / benchlib.MiB:,.0f}",
                f"{stored:,.0f}" if stored is not None else "-", f"{f['sent'] - f['acked']:,}"]

    single = {**one["per_collector"][0], "stored": one["stored"]}
    rows.append(row("one collector", single, single["streams"]))
    for i, f in enumerate(many["per_collector"]):
        rows.append(row(f"shard {i + 1} of {len(many['per_collector'])}", f, f["streams"]))
    streams = sum(f["streams"] for f in many["per_collector"])
    batches = sum(f["batches"] for f in many["per_collector"])
    total = {"rate": many["rate"], "messages_per_s": batches / duration, "cores": many["cores"],
             "cpu_ms_per_1000": many["cpu_ms_per_1000"], "rss": many["rss"], "stored": many["stored"],
             "sent": many["sent"], "acked": many["acked"]}
    rows.append(row(f"all {len(many['per_collector'])} shards", total, streams))
    errors = many["errors"]
    notes = [
        f"{nodes:,} nodes × 64 processes every {interval:g} s, {polls} polls a batch, {duration:g} s of sending, "
        f"the same load in both runs; dropped must be 0: {verdict(many['dropped'] == 0 and one['dropped'] == 0)}; "
        f"stream errors: {len(errors)}" + (f" (first: {errors[0][:90]})" if errors else ""),
        "a node whose own collector is not its job's keeps a second stream (its GPU readings), as the agent does: "
        "the messages beside the samples",
        f"this machine has {os.cpu_count()} cores, shared by the collectors and the load clients",
    ]
    return table(f"Load: the same nodes against one collector and against {len(many['per_collector'])} shards",
                 ["collector", "streams", "samples/s", "msgs/s", "cores", "ms/1k samples", "RSS MiB",
                  "ingest_samples_total", "dropped"], rows, notes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few seconds: 20 nodes for 3 s, one client process")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of sending")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between a node's batches")
    ap.add_argument("--polls", type=int, default=5, help="polls a batch joins (the agent at 1 Hz: 5)")
    ap.add_argument("--clients", type=int, default=4, help="load client processes")
    ap.add_argument("--collectors", type=int, default=1,
                    help="N > 1: after one collector's run, the same load against N shards of one deployment")
    ap.add_argument("--client", metavar="ADDRESS", help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client:
        res = client(args.client, args.first, args.count, args.duration, args.interval, args.start_at, args.polls)
        sys.stdout.write(json.dumps(res) + "\n")
    else:
        run(args.quick, args.nodes, args.duration, args.interval, args.clients, polls=args.polls,
            collectors=args.collectors)


if __name__ == "__main__":
    main()
