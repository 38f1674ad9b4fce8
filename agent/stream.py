"""The agent's one stream to the collector: numbered batches, acknowledgements, resend.

The poll loop hands each batch to `Sender.submit`; it gets the next number and waits
in a bounded buffer until the collector acknowledges it. A background thread keeps
one bidirectional gRPC stream open: a Hello, then every unacknowledged batch in
order, then new ones as they come. When the stream breaks (collector restarted,
network gone) the thread reconnects with exponential backoff and jitter and resends
everything unacknowledged; the collector drops batches it already stored. When the
buffer is full the oldest batch goes first, and its samples are counted as dropped.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
from clusterwatch.v1 import agent_pb2, agent_pb2_grpc

log = logging.getLogger("clusterwatch.agent")

# gRPC's own limit is 4 MiB; a batch of thousands of processes must still fit.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


@dataclass(slots=True)
class SenderCounters:
    """What the sender did since the agent started (printed on exit, sent with each batch)."""

    samples_sent: int = 0  # process samples put into batches
    samples_acked: int = 0  # ... acknowledged by the collector
    samples_dropped: int = 0  # ... dropped because the buffer overflowed
    reconnects: int = 0
    batches_resent: int = 0


class BatchBuffer:
    """Unacknowledged batches in order, bounded by the number of samples they hold."""

    def __init__(self, max_samples: int) -> None:
        self.max_samples = max_samples
        self._batches: OrderedDict[int, tuple[agent_pb2.Batch, int]] = OrderedDict()
        self.samples = 0

    def add(self, seq: int, batch: agent_pb2.Batch, samples: int) -> int:
        """Keep a batch; return how many samples had to be dropped (oldest batches first)."""
        self._batches[seq] = (batch, samples)
        self.samples += samples
        dropped = 0
        while self.samples > self.max_samples and len(self._batches) > 1:
            _, (_, n) = self._batches.popitem(last=False)
            self.samples -= n
            dropped += n
        return dropped

    def ack(self, seq: int) -> int:
        """Forget an acknowledged batch; return its sample count (0 if unknown or already gone)."""
        item = self._batches.pop(seq, None)
        if item is None:
            return 0
        self.samples -= item[1]
        return item[1]

    def after(self, seq: int) -> list[tuple[int, agent_pb2.Batch]]:
        """Batches numbered above seq, in order."""
        return [(s, b) for s, (b, _) in self._batches.items() if s > seq]

    def first_seq(self) -> int | None:
        return next(iter(self._batches), None)

    def __len__(self) -> int:
        return len(self._batches)


class Sender:
    """Keeps the stream to the collector and delivers batches at least once.

    Args:
        target: collector address, HOST:PORT.
        hello: builds the Hello sent first on every (re)connection.
        max_buffer_samples: bound of the unacknowledged buffer, in process samples.
        token: shared secret sent as `authorization: Bearer …` metadata, if set.
        channel_credentials: TLS credentials; None for a plaintext channel.
        on_signal: called with each SignalRequest the collector sends.
    """

    def __init__(
        self,
        target: str,
        hello: Callable[[], agent_pb2.Hello],
        max_buffer_samples: int,
        token: str | None = None,
        channel_credentials: grpc.ChannelCredentials | None = None,
        on_signal: Callable[[agent_pb2.SignalRequest], None] | None = None,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
    ) -> None:
        self.target = target
        self._hello = hello
        self._token = token
        self._creds = channel_credentials
        self._on_signal = on_signal
        self._backoff_initial = backoff_initial_s
        self._backoff_max = backoff_max_s
        self.buffer = BatchBuffer(max_buffer_samples)
        self.counters = SenderCounters()
        self.connected = False
        self.last_error = ""
        self._seq = 0
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="clusterwatch-sender", daemon=True)
        self._call: grpc.Future | None = None

    def start(self) -> None:
        self._thread.start()

    def submit(self, batch: agent_pb2.Batch, samples: int) -> int:
        """Number a batch, buffer it until acknowledged, and wake the stream; return its number."""
        with self._cond:
            self._seq += 1
            batch.seq = self._seq
            self.counters.samples_sent += samples
            self.counters.samples_dropped += self.buffer.add(self._seq, batch, samples)
            self._cond.notify_all()
            return self._seq

    def flush(self, timeout: float) -> bool:
        """Wait until every batch is acknowledged or timeout; True when none is left."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.buffer):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))
        return True

    def stop(self, timeout: float = 5.0) -> None:
        """Close the stream (after the batches already sent) and end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        call = self._call
        if call is not None:
            call.cancel()
        self._thread.join(timeout)

    # -- the stream thread ------------------------------------------------------------------

    def _run(self) -> None:
        delay = self._backoff_initial
        while not self._stopping:
            started = time.monotonic()
            try:
                self._one_stream()
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                if code == grpc.StatusCode.CANCELLED and self._stopping:
                    break
                details = exc.details() if hasattr(exc, "details") else str(exc)
                self._note_error(f"{code.name if code else 'error'}: {details}")
            except Exception as exc:  # never let the sender thread die: the agent would silently stop
                self._note_error(f"{type(exc).__name__}: {exc}")
            self.connected = False
            if self._stopping:
                break
            if time.monotonic() - started > 10:
                delay = self._backoff_initial  # the stream lived a while: start backing off afresh
            sleep = delay * random.uniform(0.8, 1.2)
            with self._cond:
                self._cond.wait_for(lambda: self._stopping, timeout=sleep)
            delay = min(delay * 1.6, self._backoff_max)
            self.counters.reconnects += 1

    def _note_error(self, text: str) -> None:
        if text != self.last_error:
            log.warning("collector %s: %s; retrying with backoff, batches are kept", self.target, text)
        self.last_error = text

    def _one_stream(self) -> None:
        options = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.http2.max_pings_without_data", 0),
        ]
        if self._creds is not None:
            channel = grpc.secure_channel(self.target, self._creds, options=options)
        else:
            channel = grpc.insecure_channel(self.target, options=options)
        metadata = [("authorization", f"Bearer {self._token}")] if self._token else None
        try:
            stub = agent_pb2_grpc.IngestStub(channel)
            call = stub.Stream(self._requests(), metadata=metadata, wait_for_ready=False)
            self._call = call
            for reply in call:
                kind = reply.WhichOneof("body")
                if kind == "ack":
                    if not self.connected:
                        self.connected = True
                        if self.last_error:
                            log.warning("collector %s: connected again", self.target)
                        self.last_error = ""
                    with self._cond:
                        self.counters.samples_acked += self.buffer.ack(reply.ack.seq)
                        self._cond.notify_all()
                elif kind == "signal" and self._on_signal is not None:
                    self._on_signal(reply.signal)
        finally:
            self._call = None
            channel.close()

    def _requests(self) -> Iterator[agent_pb2.AgentMessage]:
        yield agent_pb2.AgentMessage(hello=self._hello())
        first = self.buffer.first_seq()
        sent_upto = (first - 1) if first is not None else self._seq
        resending = self.counters.reconnects > 0
        while True:
            with self._cond:
                todo = self.buffer.after(sent_upto)
                while not todo and not self._stopping:
                    self._cond.wait(1.0)
                    todo = self.buffer.after(sent_upto)
                if not todo and self._stopping:
                    return
            for seq, batch in todo:
                if resending:
                    self.counters.batches_resent += 1
                yield agent_pb2.AgentMessage(batch=batch)
                sent_upto = seq
            resending = False
