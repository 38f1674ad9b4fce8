#!/usr/bin/env python3
"""The agent's stream to the collector: CPU of its threads, idle and per batch, beside a synchronous stream.

    .venv/bin/python bench/bench_sender.py [--quick] [--idle 30] [--batches 100]

Both clients talk to one real `clusterwatch collector` on loopback and send the same batches (five polls
of 64 processes, as the agent sends every 5 s at 1 Hz):

- clusterwatch's `Sender` (agent/stream.py: grpc.aio on an asyncio loop in one thread);
- the baseline: the synchronous grpc stream the agent used before (a thread iterating the replies, a
  request iterator grpc runs on a thread of its own), as a plain gRPC client would write it.

For each: CPU of the client process's threads other than the main one (schedstat, nanoseconds) while
nothing is sent (`--idle` seconds, the stream open), then per batch while `--batches` batches go out 20 a
second, each acknowledged before the next window ends. Every batch must be acknowledged.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchlib  # noqa: E402
from benchlib import Children, CollectorProc, NodeSim, table  # noqa: E402
from waiting import wait_for  # noqa: E402


class SyncStream:
    """The baseline: one synchronous bidirectional stream, replies read on a thread, acks counted."""

    def __init__(self, target: str, hello) -> None:
        import grpc
        from clusterwatch.v1 import agent_pb2, agent_pb2_grpc

        self._pb = agent_pb2
        self._hello = hello
        self._cond = threading.Condition()
        self._todo: list = []
        self._closed = False
        self.acked = 0
        self._channel = grpc.insecure_channel(target)
        self._call = agent_pb2_grpc.IngestStub(self._channel).Stream(self._requests())
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _requests(self):
        yield self._pb.AgentMessage(hello=self._hello)
        while True:
            with self._cond:
                while not self._todo and not self._closed:
                    self._cond.wait(1.0)
                if self._closed:
                    return
                todo, self._todo = self._todo, []
            for batch in todo:
                yield self._pb.AgentMessage(batch=batch)

    def _read(self) -> None:
        import grpc

        try:
            for reply in self._call:
                if reply.WhichOneof("body") == "ack":
                    with self._cond:
                        self.acked += 1
                        self._cond.notify_all()
        except grpc.RpcError:
            pass

    def submit(self, batch) -> None:
        with self._cond:
            self._todo.append(batch)
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._call.cancel()
        self._thread.join(5)
        self._channel.close()


class AgentSender:
    """clusterwatch's Sender, with the same three calls as the baseline."""

    def __init__(self, target: str, hello) -> None:
        from clusterwatch.agent.stream import Sender

        self._sender = Sender(target, lambda: hello, 10**7)
        self._sender.start()

    @property
    def acked(self) -> int:
        return self._sender.counters.samples_acked // SAMPLES

    def submit(self, batch) -> None:
        self._sender.submit(batch, SAMPLES)

    def close(self) -> None:
        self._sender.stop()


SAMPLES = 5 * 64  # five polls of the 64 processes


def other_threads_cpu_ms() -> float:
    """CPU ms of this process's threads except the calling (main) one."""
    total = benchlib.threads_cpu_s(os.getpid()) * 1000
    return total - time.thread_time() * 1000


def measure(kind: str, target: str, sim: NodeSim, idle_s: float, batches: int) -> dict:
    hello = sim.hello().hello
    made = [sim.batch(polls=5).batch for _ in range(batches + 1)]
    client = (AgentSender if kind == "aio" else SyncStream)(target, hello)
    try:
        client.submit(made[0])
        wait_for(lambda: client.acked >= 1, timeout=30, interval=0.05, what=f"{kind}: the first ack")
        time.sleep(1.0)  # settle: channel up, threads started
        c0, w0 = other_threads_cpu_ms(), time.monotonic()
        time.sleep(idle_s)
        idle_ms_per_s = (other_threads_cpu_ms() - c0) / (time.monotonic() - w0)
        c0, w0 = other_threads_cpu_ms(), time.monotonic()
        for batch in made[1:]:
            client.submit(batch)
            time.sleep(0.05)
        wait_for(lambda: client.acked >= batches + 1, timeout=60, interval=0.05, what=f"{kind}: every ack")
        cpu_ms, wall = other_threads_cpu_ms() - c0, time.monotonic() - w0
        per_batch = (cpu_ms - idle_ms_per_s * wall) / batches
        return {"idle": idle_ms_per_s, "per_batch": per_batch, "acked": client.acked, "sent": batches + 1,
                "at_agent_rhythm": idle_ms_per_s + per_batch / 5.0}
    finally:
        client.close()


def run(quick: bool = False, idle_s: float = 30.0, batches: int = 100, show: bool = True) -> dict:
    if quick:
        idle_s, batches = 2.0, 10
    with benchlib.tmpdir("cw-bench-sender-") as tmp, Children() as children:
        collector = CollectorProc(children, tmp, name="sender-bench-collector")
        try:
            res = {kind: measure(kind, collector.address, NodeSim(f"sender-{kind}", "7"), idle_s, batches)
                   for kind in ("sync", "aio")}
        finally:
            collector.stop()
    sync, aio = res["sync"], res["aio"]
    rows = [
        ["baseline: synchronous grpc stream", sync["idle"], sync["per_batch"], sync["at_agent_rhythm"],
         f"{sync['acked']}/{sync['sent']}"],
        ["clusterwatch Sender (grpc.aio, one thread)", aio["idle"], aio["per_batch"], aio["at_agent_rhythm"],
         f"{aio['acked']}/{aio['sent']}"],
    ]
    notes = [
        f"idle: {idle_s:g} s with the stream open and nothing to send; per batch: {batches} batches of "
        f"{SAMPLES} samples 50 ms apart, the idle cost of that time taken off.",
        "at 1 Hz: idle ms a second + a fifth of a batch (the agent sends five polls every 5 s).",
        "CPU of every thread but the main one (which only submits), from /proc/self/task/*/schedstat.",
    ]
    out = table("Agent stream: CPU of the sending side", ["client", "idle ms/s", "ms/batch", "ms/s at 1 Hz",
                                                           "acked/sent"], rows, notes)
    if show:
        print(out, flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few seconds: 2 s idle, 10 batches")
    ap.add_argument("--idle", type=float, default=30.0, help="seconds of idle stream measured")
    ap.add_argument("--batches", type=int, default=100)
    args = ap.parse_args()
    run(args.quick, args.idle, args.batches)


if __name__ == "__main__":
    main()
