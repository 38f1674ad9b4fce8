#!/usr/bin/env python3
"""Collector ingest in samples/s per core, beside the bare gRPC receive rate of the same batches.

    .venv/bin/python bench/bench_ingest.py [--quick] [--rounds 3] [--streams 8] [--batches 300] [--polls 5]
                                           [--profile]

Batches as an agent polling every second sends them with its default 5 s send interval: five
polls of 64 processes (8 ranks × 7 DataLoader workers, each rank on a GPU, realistic field
values, plus 8 GPU samples a poll), 320 process samples a batch (`--polls 1`: one poll a
batch, as at a 5 s poll interval). Several streams, each with its own node and a window of
16 unacknowledged batches; the batches of a stream follow one another on their own timeline
(a second a poll), so the rules see what a live node would show them. In the same run,
alternating, a client process sends the same number of batches to:

- a trivial gRPC server: the generated Ingest servicer on grpc.aio with the collector's
  options, which parses each AgentMessage and answers an Ack, nothing else (the floor);
- a real `clusterwatch collector` process (CollectorCore.batch as wired at the time of the
  run: the table says whether the rules engine ran on the ingest path).

Server CPU is utime + stime of the server process (all its threads) from /proc/<pid>/stat,
across the client's run; samples/s per core = samples acknowledged / server CPU seconds.
A third row times CollectorCore.batch in this process on pre-parsed batches (no gRPC).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchlib  # noqa: E402
from benchlib import PYTHON, Children, CollectorProc, median, spread, table, verdict  # noqa: E402
from waiting import wait_for  # noqa: E402

TARGET = 250_000
HERE = os.path.abspath(__file__)


# -- the trivial server (run as a child process) ------------------------------------------------

def serve_trivial(ports_file: str) -> None:
    import signal

    import grpc
    from clusterwatch.v1 import agent_pb2, agent_pb2_grpc

    class AckOnly(agent_pb2_grpc.IngestServicer):
        async def Stream(self, request_iterator, context):
            async for msg in request_iterator:
                if msg.WhichOneof("body") == "batch":
                    yield agent_pb2.CollectorMessage(ack=agent_pb2.Ack(seq=msg.batch.seq))

    async def main() -> None:
        server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", 64 * benchlib.MiB),
            ("grpc.max_send_message_length", 64 * benchlib.MiB),
        ])
        agent_pb2_grpc.add_IngestServicer_to_server(AckOnly(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        with open(ports_file + ".tmp", "w") as f:
            json.dump({"grpc": port, "metrics": 0}, f)
        os.replace(ports_file + ".tmp", ports_file)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await server.stop(1)

    asyncio.run(main())


# -- the client (run as a child process) ---------------------------------------------------------

def client(address: str, streams: int, batches: int, window: int, tag: str, polls: int) -> dict:
    async def main() -> dict:
        sims = [benchlib.NodeSim(f"ingest-{tag}-{i}", f"job-{tag}-{i}") for i in range(streams)]
        bbs = [benchlib.BatchBytes(s, polls=polls, realtime=False) for s in sims]
        results = [benchlib.StreamResult() for _ in sims]
        channels = [benchlib.aio_channel(address) for _ in sims]
        t0 = time.monotonic()
        await asyncio.gather(*(benchlib.agent_stream(ch, bb, r, batches=batches, window=window)
                               for ch, bb, r in zip(channels, bbs, results, strict=True)))
        wall = time.monotonic() - t0
        for ch in channels:
            await ch.close()
        return {"sent": sum(r.samples_sent for r in results), "acked": sum(r.samples_acked for r in results),
                "wall": wall, "errors": [r.error for r in results if r.error]}

    return asyncio.run(main())


def run_client(address: str, streams: int, batches: int, window: int, tag: str, polls: int) -> dict:
    out = subprocess.run([PYTHON, HERE, "--client", address, "--streams", str(streams), "--batches", str(batches),
                          "--window", str(window), "--tag", tag, "--polls", str(polls)],
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"ingest client failed: {out.stderr[-2000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if res["errors"]:
        raise RuntimeError(f"ingest client streams failed: {res['errors'][:3]}")
    return res


def measure_server(pid: int, address: str, streams: int, batches: int, window: int, tag: str, polls: int) -> dict:
    time.sleep(0.3)  # let the server go idle
    c0 = benchlib.proc_cpu_s(pid)
    res = run_client(address, streams, batches, window, tag, polls)
    c1 = benchlib.proc_cpu_s(pid)
    res["cpu"] = c1 - c0
    res["rate"] = res["acked"] / res["cpu"] if res["cpu"] > 0 else float("nan")
    return res


# -- CollectorCore.batch in this process ----------------------------------------------------------

def inprocess(streams: int, batches: int, polls: int, profile: bool = False) -> dict:
    from clusterwatch.collector.serving.gc_tuning import tune_gc
    from clusterwatch.v1 import agent_pb2

    with benchlib.tmpdir("cw-bench-ingest-") as tmp:
        server, core, note = benchlib.collector_server_core(tmp)
        tune_gc()  # as the collector's start does
        sims = [benchlib.NodeSim(f"inproc-{i}", f"job-inproc-{i}") for i in range(streams)]
        for s in sims:
            core.hello(s.hello().hello)
        bbs = [benchlib.BatchBytes(s, polls=polls) for s in sims]
        t0 = time.time() - 3600.0
        raw = []
        for k in range(batches):
            for s, bb in zip(sims, bbs, strict=True):
                raw.append((s, bb.next(t0 + k * polls)[1]))
        p0 = time.process_time()
        msgs = [(s, agent_pb2.AgentMessage.FromString(b)) for s, b in raw]
        parse = time.process_time() - p0
        prof = None
        if profile:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        p0 = time.process_time()
        for s, m in msgs:
            core.batch(s.node, s.boot_id, m.batch)
        cpu = time.process_time() - p0
        if prof is not None:
            prof.disable()
        samples = core.counters.samples
    return {"rate": samples / cpu, "us_per_batch": cpu / len(msgs) * 1e6, "parse_us": parse / len(msgs) * 1e6,
            "note": note, "prof": prof, "samples": samples}


def run(quick: bool = False, rounds: int = 3, streams: int = 8, batches: int = 100, window: int = 16,
        profile: bool = False, show: bool = True, polls: int = 5) -> dict:
    if quick:
        rounds, streams, batches = 1, 2, 20
    trivial, real, inproc = [], [], []
    note = ""
    with benchlib.tmpdir("cw-bench-ingest-") as tmp, Children() as children:
        ports = os.path.join(tmp, "trivial-ports.json")
        tlog = open(os.path.join(tmp, "trivial.log"), "ab")
        tp = children.start([PYTHON, HERE, "--serve-trivial", ports], stdout=tlog, stderr=subprocess.STDOUT)
        wait_for(lambda: os.path.exists(ports) or tp.poll() is not None, timeout=30.0, interval=0.05,
                 what="trivial server")
        if tp.poll() is not None:
            raise RuntimeError("the trivial server exited; see " + tlog.name)
        with open(ports) as f:
            taddr = f"127.0.0.1:{json.load(f)['grpc']}"
        collector = CollectorProc(children, tmp, name="ingest-collector")
        for r in range(rounds):
            trivial.append(measure_server(tp.pid, taddr, streams, batches, window, f"t{r}", polls))
            real.append(measure_server(collector.pid, collector.address, streams, batches, window, "real", polls))
            res = inprocess(streams, batches, polls)
            inproc.append(res)
            note = res["note"]
        profiled = inprocess(streams, batches, polls, profile=True) if profile else None  # not in the figures
        metrics_samples = benchlib.metric_value(collector.metrics(), "clusterwatch_ingest_samples_total")
        collector.stop()
        children.stop(tp)
        tlog.close()
    t_rate, r_rate, i_rate = (median(x["rate"] for x in xs) for xs in (trivial, real, inproc))
    per_batch = streams * batches
    rows = [
        ["bare gRPC receive (ack-only servicer)", t_rate, spread([x["rate"] for x in trivial]),
         median(x["cpu"] for x in trivial) / per_batch * 1e6, "1.0×"],
        ["clusterwatch collector (gRPC + CollectorCore.batch)", r_rate, spread([x["rate"] for x in real]),
         median(x["cpu"] for x in real) / per_batch * 1e6, f"{t_rate / r_rate:.1f}× the floor's CPU"],
        ["CollectorCore.batch alone, in process (no gRPC)", i_rate, spread([x["rate"] for x in inproc]),
         median(x["us_per_batch"] for x in inproc), "-"],
    ]
    sent = sum(x["sent"] for x in real)
    acked = sum(x["acked"] for x in real)
    notes = [
        f"{streams} streams × {batches} batches × {polls} polls × 64 samples a round, window 16, {rounds} round(s) "
        "alternating; "
        "median of rounds; 'runs' = min–max.",
        f"server CPU = utime+stime of the server process (all threads) during the client's run; "
        f"parsing an AgentMessage in Python costs {median(x['parse_us'] for x in inproc):.0f} µs a batch "
        "(inside the gRPC rows, not in the in-process row).",
        note,
        f"real collector: {sent:,} samples sent, {acked:,} acknowledged, /metrics "
        f"clusterwatch_ingest_samples_total = {metrics_samples:,.0f}",
        f"target ≥ {TARGET:,} samples/s per core with the rules on: {r_rate:,.0f} → {verdict(r_rate >= TARGET)}"
        + ("" if note.startswith("rules ON") else " (the rules are not on this path)"),
    ]
    out = table("Collector ingest: samples per second per core (server CPU, not wall)",
                ["path", "samples/s/core", "runs", "CPU µs/batch", "vs floor"], rows, notes)
    if show:
        print(out, flush=True)
    if profiled is not None:
        import io
        import pstats

        s = io.StringIO()
        pstats.Stats(profiled["prof"], stream=s).sort_stats("tottime").print_stats(20)
        print(s.getvalue())
    return {"trivial": t_rate, "real": r_rate, "inproc": i_rate, "rules": note, "table": out,
            "cpu_s_per_1000": 1000 / r_rate}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few seconds: 1 round, 2 streams × 60 batches")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--batches", type=int, default=100, help="batches per stream per round")
    ap.add_argument("--window", type=int, default=16, help="unacknowledged batches in flight per stream")
    ap.add_argument("--polls", type=int, default=5, help="polls a batch joins (the agent at 1 Hz: 5)")
    ap.add_argument("--profile", action="store_true", help="also print a cProfile of CollectorCore.batch")
    ap.add_argument("--serve-trivial", metavar="PORTS_FILE", help=argparse.SUPPRESS)
    ap.add_argument("--client", metavar="ADDRESS", help=argparse.SUPPRESS)
    ap.add_argument("--tag", default="x", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_trivial:
        serve_trivial(args.serve_trivial)
    elif args.client:
        print(json.dumps(client(args.client, args.streams, args.batches, args.window, args.tag, args.polls)))
    else:
        run(args.quick, args.rounds, args.streams, args.batches, args.window, args.profile, polls=args.polls)


if __name__ == "__main__":
    main()
