"""The agents' side of the collector: one stream per agent, a Hello then numbered batches, each acked once durable.

A flooding agent is slowed down by a token bucket (its acks come later), never allowed to starve
the others; its token, when the collector has one, was checked by agent_auth.TokenInterceptor, and what
else it proves (a munge credential, a certificate) by agent_auth.AgentAuth at its Hello.

One stream speaks for a node at a time: a second Hello for a node that is connected is refused
(ALREADY_EXISTS) unless it proves the same identity as the first (the certificate that names the node,
or a munge credential of the same host), so nobody takes over a node's requests and answers. An agent
reconnecting before its old stream is noticed dead (the server's keepalive closes it) retries.
Requests to processes (signals, TrainRequests) go only to a node whose stream is authenticated.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import grpc
from clusterwatch.v1 import agent_pb2, agent_pb2_grpc

from ..serving.grpc_guard import peer_host, say_once
from ..state.core import CollectorCore
from .agent_auth import AgentAuth, AgentProof, StreamRefused, certificate_node_names, node_identity_error
from .bounds import hello_refusal

# One agent's batch holds its node's processes: thousands at most. More is a bug or an attack.
MAX_SAMPLES_PER_BATCH = 50_000
# A node polled every second with a thousand processes sends 1,000 samples/s; fifty times that
# from one stream is a flood, slowed down so it cannot starve the other agents.
MAX_SAMPLES_PER_S_PER_AGENT = 50_000.0
# An agent sends its Hello as soon as its stream opens; a stream silent this long is closed.
HELLO_TIMEOUT_S = 20.0
# Acks wait for the store: a batch is acknowledged only once durable (at most this late).
FLUSH_S = 0.2


class TokenBucket:
    """Allows `rate` samples a second on average, bursts of `burst_s` seconds' worth.

    `take` returns how long the caller should wait before going on (0 when within budget).
    """

    def __init__(self, rate: float, burst_s: float) -> None:
        self.rate = rate
        self.capacity = rate * burst_s
        self.tokens = self.capacity
        self.last = time.monotonic()

    def take(self, n: int, now: float) -> float:
        self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)
        self.last = now
        self.tokens -= n
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


async def _hello_in_time(request_iterator, context, count: Callable[[str], None]):
    """The stream's messages; the first must come within HELLO_TIMEOUT_S (an agent sends its Hello at once);
    `count` (CollectorCore.count) takes a stream that misses it as rejected.

    A stream that opens and says nothing would otherwise hold its connection for ever.
    """
    messages = request_iterator.__aiter__()
    try:
        first = await asyncio.wait_for(messages.__anext__(), HELLO_TIMEOUT_S)
    except StopAsyncIteration:
        return
    except asyncio.TimeoutError:
        count("rejected")
        await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                            f"no hello within {HELLO_TIMEOUT_S:.0f} s of opening the stream")
    yield first
    async for msg in messages:
        yield msg


class AgentOutboxes:
    """node → the queue of messages (acks, signal requests) its agent's stream sends, while it is connected.

    Made before the servicer, so that the alert actions (built before the core) can send signals.
    """

    def __init__(self) -> None:
        self.by_node: dict[str, asyncio.Queue] = {}
        # node → what its connected stream proved (AgentProof): requests go only where it is authenticated
        self.proofs: dict[str, AgentProof] = {}

    def why_not(self, node: str) -> str | None:
        """Why nothing may be sent to `node`'s processes now; None when its authenticated agent is connected."""
        if node not in self.by_node:
            return f"the agent of {node} is not connected to this collector"
        if not self.proofs.get(node, AgentProof()).authenticated:
            return (f"the agent of {node} is not authenticated (no token, certificate or munge credential), so "
                    "nothing is sent to its processes; see docs/operators.md, Tokens and TLS")
        return None

    def _outbox(self, node: str, what: str) -> asyncio.Queue | None:
        refusal = self.why_not(node)
        if refusal is None:
            return self.by_node[node]
        if node in self.by_node:  # connected, unauthenticated: said once, the caller records its own refusal
            say_once(f"unauthenticated action {node}", "%s not sent: %s", what, refusal)
        return None

    def send_signal(self, node: str, pid: int, start_time: float, signum: int, reason: str) -> bool:
        """Queue a signal request for a node's agent; False when that agent is not connected, or not
        authenticated."""
        outbox = self._outbox(node, "a signal")
        if outbox is None:
            return False
        req = agent_pb2.SignalRequest(pid=pid, start_time=start_time, signal=signum, reason=reason)
        outbox.put_nowait(agent_pb2.CollectorMessage(signal=req))
        return True

    def send_train_request(self, node: str, req: agent_pb2.TrainRequest) -> bool:
        """Queue a request to a training process for its node's agent; False when that agent is not connected,
        or not authenticated."""
        outbox = self._outbox(node, "a request to a training process")
        if outbox is None:
            return False
        outbox.put_nowait(agent_pb2.CollectorMessage(train_request=req))
        return True


class IngestServicer(agent_pb2_grpc.IngestServicer):
    """One stream per agent: a Hello, then batches; each stored batch is acknowledged.

    Args:
        core: the collector's core, which takes the hellos and batches.
        outboxes: the connected agents' outboxes (shared with what sends to processes); None: its own.
        max_samples_per_s: one agent's rate past which its batches are slowed down.
        auth: what agents must prove; None: nothing.
        on_train_answer: where the agents' answers to TrainRequests go (TrainAsks.on_answer); None: refused.
    """

    def __init__(self, core: CollectorCore, outboxes: AgentOutboxes | None = None,
                 max_samples_per_s: float = MAX_SAMPLES_PER_S_PER_AGENT, auth: AgentAuth | None = None,
                 on_train_answer: Callable[[str, agent_pb2.TrainAnswer], None] | None = None) -> None:
        self.core = core
        self.outboxes = outboxes if outboxes is not None else AgentOutboxes()
        self.on_train_answer = on_train_answer
        self.auth = auth if auth is not None else AgentAuth("none")  # what agents must prove (agent_auth.py)
        self.max_samples_per_s = max_samples_per_s
        # acks held until the next durable flush
        self.after_flush: list[tuple[asyncio.Queue, agent_pb2.CollectorMessage]] = []
        # hellos refused because the agent's certificate does not name the node it speaks for
        self.identity_refused = 0
        # hellos refused because another stream speaks for their node
        self.node_taken = 0

    COUNTS = ("identity_refused", "node_taken")

    def counts(self) -> dict[str, int]:
        """The servicer's own counts (COUNTS), by name (collector/export/counter_metrics.py)."""
        return {"identity_refused": self.identity_refused, "node_taken": self.node_taken}

    async def Stream(self, request_iterator, context):
        # the token, when there is one, was checked by TokenInterceptor before this
        outbox: asyncio.Queue = asyncio.Queue()
        reader = asyncio.ensure_future(self._read(request_iterator, context, outbox))
        reader.add_done_callback(lambda _: outbox.put_nowait(None))
        try:
            while True:
                msg = await outbox.get()
                if msg is None:
                    break
                yield msg
            exc = reader.exception() if reader.done() and not reader.cancelled() else None
            if exc is not None:
                raise exc
            # The agent half-closed its side: its last batches are stored but their acks wait for
            # the next durable flush. Deliver them before ending the stream, or they would be resent.
            while any(box is outbox for box, _ in self.after_flush):
                await asyncio.sleep(FLUSH_S / 4)
            while not outbox.empty():
                msg = outbox.get_nowait()
                if msg is not None:
                    yield msg
        finally:
            reader.cancel()

    async def _read(self, request_iterator, context, outbox: asyncio.Queue) -> None:
        """Store each batch; its ack is queued once the flusher has made it durable."""
        node = boot_id = proof = None
        bucket = TokenBucket(self.max_samples_per_s, burst_s=10.0)
        try:
            async for msg in _hello_in_time(request_iterator, context, self.core.count):
                kind = msg.WhichOneof("body")
                if kind == "hello":
                    refused = hello_refusal(msg.hello)  # ingest_bounds: before its node is named anywhere
                    if refused is not None:
                        self.core.count("rejected")
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, refused)
                    if node is not None and msg.hello.node != node:
                        self.core.count("rejected")
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                            f"a stream speaks for one node: this one is {node!r}'s")
                    if proof is None:  # once a stream: a munge credential is good once
                        proof = await self._prove(msg.hello.node, context)
                        await self._take_node(msg.hello.node, proof, outbox, context)
                    node, boot_id = self.core.hello(msg.hello, proof.authenticated), msg.hello.boot_id
                    self.core.node_notes.hello(msg.hello)  # e.g. GPU memory it cannot tie to processes
                elif kind == "batch":
                    if node is None:
                        self.core.count("rejected")
                        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "a batch before the hello")
                    n = len(msg.batch.processes.pid)
                    if n > MAX_SAMPLES_PER_BATCH:
                        self.core.count("rejected")
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                            f"a batch of {n} process samples; at most {MAX_SAMPLES_PER_BATCH}")
                    # a flooding agent is slowed down (its acks come later), never allowed to starve the rest
                    delay = bucket.take(n, time.monotonic())
                    if delay > 0:
                        self.core.count("throttled")
                        await asyncio.sleep(delay)
                    self.core.batch(node, boot_id, msg.batch)  # a refused batch is acked too, or resent forever
                    ack = agent_pb2.CollectorMessage(ack=agent_pb2.Ack(seq=msg.batch.seq))
                    self.after_flush.append((outbox, ack))
                elif kind == "train_answer" and node is not None and self.on_train_answer is not None:
                    self.on_train_answer(node, msg.train_answer)  # it checks the node is the one asked
                else:
                    self.core.count("rejected")
        finally:
            # a stream that was taken over leaves the node to the one that took it
            if node is not None and self.outboxes.by_node.get(node) is outbox:
                del self.outboxes.by_node[node]
                self.outboxes.proofs.pop(node, None)
                self.core.disconnected(node)

    async def _refuse(self, context, code: grpc.StatusCode, refusal: str, node: str) -> None:
        peer = peer_host(context.peer())
        say_once(f"refused {code.name} {peer} {node}", "stream from %s for node %r refused: %s", peer, node, refusal)
        await context.abort(code, refusal)

    async def _prove(self, node: str, context) -> AgentProof:
        """What the stream proves (AgentAuth), and that its proof may speak for `node`; aborts it otherwise."""
        refusal = node_identity_error(node, certificate_node_names(context.auth_context()))
        if refusal is not None:
            self.identity_refused += 1
            self.core.count("unauthenticated")
            await self._refuse(context, grpc.StatusCode.PERMISSION_DENIED, refusal, node)
        try:
            proof = await self.auth.prove(context.invocation_metadata(), context.auth_context())
        except StreamRefused as exc:
            self.core.count("unauthenticated")
            await self._refuse(context, exc.code, str(exc), node)
        refusal = self.auth.bind(node, proof)
        if refusal is not None:
            self.identity_refused += 1
            self.core.count("unauthenticated")
            await self._refuse(context, grpc.StatusCode.PERMISSION_DENIED, refusal, node)
        return proof

    async def _take_node(self, node: str, proof: AgentProof, outbox: asyncio.Queue, context) -> None:
        """Make this stream its node's, or refuse it while another one speaks for the node.

        The stream that proves the same identity as the connected one (an agent reconnecting before its old
        stream is noticed dead) takes its place, and the old one is ended.
        """
        boxes = self.outboxes
        current = boxes.by_node.get(node)
        if current is not None and current is not outbox:
            mine = proof.identity(node)
            if mine is None or mine != boxes.proofs.get(node, AgentProof()).identity(node):
                self.node_taken += 1
                await self._refuse(context, grpc.StatusCode.ALREADY_EXISTS, (
                    f"another stream speaks for node {node!r} now: a second agent on it (check --node), or its "
                    "own old stream not yet closed (retried until the collector notices it gone)"), node)
            current.put_nowait(None)  # ends the old stream's replies; its reader is cancelled with it
        boxes.by_node[node] = outbox
        boxes.proofs[node] = proof

    def flushed(self) -> None:
        """The flusher made everything durable: release the acks that waited for it."""
        waiting, self.after_flush = self.after_flush, []
        for outbox, ack in waiting:
            outbox.put_nowait(ack)
