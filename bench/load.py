#!/usr/bin/env python3
"""Load: simulated agents for 1,000 nodes × 64 processes at 1 Hz against one real collector.

    .venv/bin/python bench/load.py [--nodes 1000] [--duration 60] [--interval 1] [--polls 5] [--clients 4] [--quick]

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


def client(address: str, first: int, count: int, duration: float, interval: float, start_at: float,
           polls: int) -> dict:
    """Nodes first..first+count-1, each one stream, sending from start_at (Unix time) for `duration`."""

    async def main() -> dict:
        # the batches are built before the start (it takes seconds), so every node sends for `duration`
        sims = [benchlib.NodeSim(f"load-node{n:04d}", f"load-job{n:04d}") for n in range(first, first + count)]
        bbs = [benchlib.BatchBytes(s, polls=polls, interval=interval) for s in sims]
        every = interval * polls
        results = [benchlib.StreamResult() for _ in sims]
        channels = [benchlib.aio_channel(address) for _ in sims]
        delay = start_at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            print(f"load client: batches built {-delay:.1f} s after the common start", file=sys.stderr)
        until = time.monotonic() + duration
        c0 = time.process_time()
        await asyncio.gather(*(
            benchlib.agent_stream(ch, bb, r, interval=every, until=until, window=1_000_000,
                                  phase=every * i / count, drain_timeout=30.0)
            for i, (ch, bb, r) in enumerate(zip(channels, bbs, results, strict=True))
        ))
        cpu = time.process_time() - c0
        for ch in channels:
            await ch.close()
        delays = sorted(round(d * 1000, 2) for r in results for d in r.delays)
        # the same, for batches sent after the first 15 s (once every process is known to the collector)
        settled = sorted(round(d * 1000, 2) for r in results for d, t in zip(r.delays, r.sent_times, strict=True)
                         if t >= until - duration + 15.0)
        return {"sent": sum(r.samples_sent for r in results), "acked": sum(r.samples_acked for r in results),
                "batches": sum(r.sent for r in results), "delays_ms": delays, "settled_ms": settled, "client_cpu": cpu,
                "errors": [r.error for r in results if r.error]}

    return asyncio.run(main())


def pct(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def run(quick: bool = False, nodes: int = 1000, duration: float = 60.0, interval: float = 1.0,
        clients: int = 4, show: bool = True, polls: int = 5) -> dict:
    if quick:
        nodes, duration, clients = 20, 3.0, 1
    clients = max(1, min(clients, nodes))
    with benchlib.tmpdir("cw-load-") as tmp, Children() as children:
        collector = CollectorProc(children, tmp, name="load-collector")
        start_at = time.time() + 3.0 + nodes * polls / 250  # time for the clients to import and build their batches
        procs = []
        per = [nodes // clients + (1 if i < nodes % clients else 0) for i in range(clients)]
        first = 0
        for i, n in enumerate(per):
            out = open(os.path.join(tmp, f"client{i}.json"), "wb")
            err = open(os.path.join(tmp, f"client{i}.log"), "wb")
            p = children.start([PYTHON, HERE, "--client", collector.address, "--first", str(first), "--count",
                                str(n), "--duration", str(duration), "--interval", str(interval), "--polls", str(polls),
                                "--start-at", repr(start_at)], stdout=out, stderr=err)
            procs.append((p, out, err))
            first += n
        time.sleep(max(0.0, start_at - time.time()))
        c0, w0 = benchlib.proc_cpu_s(collector.pid), time.monotonic()
        for p, out, err in procs:
            p.wait(timeout=duration + 120)
            out.close()
            err.close()
        c1, w1 = benchlib.proc_cpu_s(collector.pid), time.monotonic()
        rss = benchlib.proc_rss_bytes(collector.pid)
        results = []
        for i, (p, _, _) in enumerate(procs):
            if p.returncode != 0:
                with open(os.path.join(tmp, f"client{i}.log"), errors="replace") as f:
                    raise RuntimeError(f"load client {i} failed: {f.read()[-2000:]}")
            with open(os.path.join(tmp, f"client{i}.json")) as f:
                results.append(json.loads(f.read().strip().splitlines()[-1]))
        t0 = time.process_time()
        text = collector.metrics()
        stored = benchlib.metric_value(text, "clusterwatch_ingest_samples_total")
        scrape = {"bytes": len(text), "fetch_s": time.process_time() - t0}
        collector.stop()
        with open(collector.log_path, errors="replace") as f:
            collector_log = [line.rstrip() for line in f if line.strip()][-3:]
    sent = sum(r["sent"] for r in results)
    acked = sum(r["acked"] for r in results)
    delays = sorted(d for r in results for d in r["delays_ms"])
    settled = sorted(d for r in results for d in r["settled_ms"])
    errors = [" ".join(e.split()) for r in results for e in r["errors"]]
    wall = w1 - w0
    cores = (c1 - c0) / wall
    rate = acked / duration
    dropped = sent - acked
    rows = [
        ["nodes × processes at interval", f"{nodes:,} × 64 every {interval:g} s, {polls} polls a batch"],
        ["duration (sending) / wall incl. drain", f"{duration:g} s / {wall:.1f} s"],
        ["samples offered per second", f"{nodes * 64 / interval:,.0f}"],
        ["samples/s ingested (acknowledged / duration)", f"{rate:,.0f}"],
        ["collector CPU (cores, whole process)", f"{cores:.2f}"],
        ["collector CPU per 1,000 samples", f"{(c1 - c0) / max(acked, 1) * 1e6:.1f} ms"],
        ["collector RSS at the end", f"{rss / benchlib.MiB:.0f} MiB"],
        ["ack delay p50 / p99 / max", f"{pct(delays, 0.5):.1f} / {pct(delays, 0.99):.1f} / "
                                      f"{(delays[-1] if delays else float('nan')):.1f} ms"],
        ["  the same, batches sent after the first 15 s", f"{pct(settled, 0.5):.1f} / {pct(settled, 0.99):.1f} / "
                                                          f"{(settled[-1] if settled else float('nan')):.1f} ms"],
        ["samples sent / acknowledged / collector's ingest_samples_total",
         f"{sent:,} / {acked:,} / {stored:,.0f}" if stored is not None else f"{sent:,} / {acked:,} / -"],
        ["dropped (sent − acknowledged)", f"{dropped:,}"],
        ["stream errors", str(len(errors)) + (f" (first: {errors[0][:90]})" if errors else "")],
        ["load clients: processes / CPU s total", f"{clients} / {sum(r['client_cpu'] for r in results):.1f}"],
    ]
    ok_rate = rate >= 0.99 * nodes * 64 / interval * (duration - interval * polls) / duration
    notes = [
        f"dropped must be 0: {verdict(dropped == 0 and (stored is None or stored == acked))}; "
        f"kept up with the offered rate: {verdict(ok_rate)}",
        f"final /metrics: {scrape['bytes']:,} bytes. The machine has {os.cpu_count()} cores shared by the "
        "collector and the load clients; the clients' CPU is not the collector's.",
    ]
    if errors and collector_log:
        notes.append("collector log, last lines: " + " | ".join(line[:160] for line in collector_log))
    out = table("Load: simulated agents against one collector", ["figure", "value"], rows, notes)
    if show:
        print(out, flush=True)
    return {"rate": rate, "cores": cores, "p99_ms": pct(delays, 0.99), "dropped": dropped, "table": out,
            "cpu_ms_per_1000": (c1 - c0) / max(acked, 1) * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few seconds: 20 nodes for 3 s, one client process")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of sending")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between a node's batches")
    ap.add_argument("--polls", type=int, default=5, help="polls a batch joins (the agent at 1 Hz: 5)")
    ap.add_argument("--clients", type=int, default=4, help="load client processes")
    ap.add_argument("--client", metavar="ADDRESS", help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client:
        res = client(args.client, args.first, args.count, args.duration, args.interval, args.start_at, args.polls)
        sys.stdout.write(json.dumps(res) + "\n")
    else:
        run(args.quick, args.nodes, args.duration, args.interval, args.clients, polls=args.polls)


if __name__ == "__main__":
    main()
