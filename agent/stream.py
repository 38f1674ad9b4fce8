"""The agent's one stream to the collector: numbered batches, acknowledgements, resend.

The poll loop hands each batch to `Sender.submit`; it gets the next number and waits
in a bounded buffer until the collector acknowledges it. A background thread keeps
one bidirectional gRPC stream open (grpc.aio): a Hello, then every unacknowledged
batch in order, then new ones as they come. When the stream breaks (collector restarted,
network gone) the thread reconnects with exponential backoff and jitter and resends
everything unacknowledged; the collector drops batches it already stored. When the
buffer is full the oldest batch goes first, and its samples are counted as dropped.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from clusterwatch.v1 import agent_pb2, agent_pb2_grpc

from clusterwatch.backoff import Backoff
from clusterwatch.log_once import SaidOnce
from clusterwatch.thread_names import name_os_thread

from .munge_credential import MungeCredentials, MungeUnavailable

log = logging.getLogger("clusterwatch.agent")

# How long a stream whose write failed waits for the call's status (it comes with the replies' end).
STATUS_WAIT_S = 1.0
# While a flush waits (the agent is stopping), the stream retries this often at most.
FLUSH_RETRY_S = 0.5
# Answers to TrainRequests held for the stream (a py-spy dump is at most 60000 bytes each).
MAX_TRAIN_ANSWERS = 512
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
    streams_refused: int = 0  # streams the collector refused (wrong token, a certificate for another node)
    samples_unsent: int = 0  # samples still unacknowledged when the sender stopped (lost with the agent)


# The collector refuses who is sending, not what: said as such, and tried again (it may be fixed).
_REFUSALS = {
    grpc.StatusCode.UNAUTHENTICATED: "the agent is not authenticated; give it the collector's token "
    "(--token or CLUSTERWATCH_TOKEN, the same secret as the collector's)",
    grpc.StatusCode.PERMISSION_DENIED: "the collector does not accept this agent's identity; give it a "
    "client certificate that names its node (--tls-cert), or --node the name the certificate holds; under "
    "munge, run it as root on the host its node name was first sent from",
    grpc.StatusCode.ALREADY_EXISTS: "another stream speaks for this node: a second agent with the same --node, "
    "or this agent's old stream the collector has not yet noticed closed",
}


class _NoCredential(Exception):
    """--agent-auth munge and munge made no credential: the stream is not opened, and retried."""


class BufferBudget:
    """The bound of all an agent's streams together (one per collector of a sharded deployment), in samples.

    The node's memory is what the bound protects, so the streams share one `--buffer-samples`: while one
    collector is down its stream may hold nearly all of it (the others, acknowledged within a second,
    hold a batch or two). A stream gives way for the shared bound only when it holds at least its fair
    share of what is buffered, so a healthy stream never drops its batch in flight because another's
    collector is away.
    """

    def __init__(self, max_samples: int) -> None:
        self.max_samples = max_samples
        self.samples = 0
        self.streams = 0
        self._lock = threading.Lock()

    def change(self, n: int) -> None:
        with self._lock:
            self.samples += n

    def over(self, own: int) -> bool:
        """Whether a stream holding `own` samples must drop its oldest batch for the shared bound."""
        total = self.samples
        return total > self.max_samples and own * max(self.streams, 1) >= total


class BatchBuffer:
    """Unacknowledged batches in order, bounded by the number of samples they hold (and by a budget shared
    with the agent's other streams, when given)."""

    def __init__(self, max_samples: int, budget: BufferBudget | None = None) -> None:
        self.max_samples = max_samples
        self._budget = budget
        if budget is not None:
            budget.streams += 1
        self._batches: OrderedDict[int, tuple[agent_pb2.Batch, int]] = OrderedDict()
        self.samples = 0
        # What the bound counts: a batch weighs its samples, and at least 1, so that batches without a process
        # (a node stream's GPU readings, a node with no job) are bounded too while their collector is away.
        self.weight = 0

    def _over(self) -> bool:
        if self.weight > self.max_samples:
            return True
        return self._budget is not None and self._budget.over(self.weight)

    def add(self, seq: int, batch: agent_pb2.Batch, samples: int) -> int:
        """Keep a batch; return how many samples had to be dropped (oldest batches first)."""
        self._batches[seq] = (batch, samples)
        self._count(samples)
        dropped = 0
        while len(self._batches) > 1 and self._over():
            _, (_, n) = self._batches.popitem(last=False)
            self._count(n, -1)
            dropped += n
        return dropped

    def _count(self, n: int, sign: int = 1) -> None:
        """Count a batch of `n` samples in (sign 1) or out (sign -1)."""
        w = sign * max(n, 1)
        self.samples += sign * n
        self.weight += w
        if self._budget is not None:
            self._budget.change(w)

    def ack(self, seq: int) -> int:
        """Forget an acknowledged batch; return its sample count (0 if unknown or already gone)."""
        item = self._batches.pop(seq, None)
        if item is None:
            return 0
        self._count(item[1], -1)
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

    The stream lives on an asyncio loop (grpc.aio) in one background thread: the synchronous gRPC
    stream keeps three threads that each wake ten times a second inside grpc's waits, which an idle
    agent cannot afford (bench/bench_sender.py measures both).

    Args:
        target: collector address, HOST:PORT.
        hello: builds the Hello sent first on every (re)connection.
        max_buffer_samples: bound of the unacknowledged buffer, in process samples.
        token: shared secret sent as `authorization: Bearer …` metadata, if set.
        channel_credentials: TLS credentials; None for a plaintext channel.
        on_signal: called (on the sender's thread) with each SignalRequest the collector sends.
        on_train_request: called (on the sender's thread; it must not block) with each TrainRequest the
            collector sends and the function that sends its answers back on this stream (agent/train_asks.py).
        munge: makes a fresh munge credential for each stream (agent/munge_credential.py); None: none sent.
    """

    def __init__(
        self,
        target: str,
        hello: Callable[[], agent_pb2.Hello],
        max_buffer_samples: int,
        token: str | None = None,
        channel_credentials: grpc.ChannelCredentials | None = None,
        on_signal: Callable[[agent_pb2.SignalRequest], None] | None = None,
        on_train_request: Callable[[agent_pb2.TrainRequest, Callable[[agent_pb2.TrainAnswer], None]], None]
        | None = None,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        budget: BufferBudget | None = None,
        munge: MungeCredentials | None = None,
    ) -> None:
        self.target = target
        self._munge = munge
        self._hello = hello
        self._token = token
        self._creds = channel_credentials
        self._on_signal = on_signal
        self._on_train_request = on_train_request
        # answers to the collector's TrainRequests, written before batches; kept while the stream is down
        self._answers: deque[agent_pb2.TrainAnswer] = deque(maxlen=MAX_TRAIN_ANSWERS)
        self._backoff_initial = backoff_initial_s
        self._backoff = Backoff(backoff_initial_s, backoff_max_s, factor=1.6, jitter=(0.8, 1.2))
        self.buffer = BatchBuffer(max_buffer_samples, budget)
        self.counters = SenderCounters()
        self.connected = False
        self.last_error = ""
        self._said = SaidOnce(log)  # the failures said since the stream was last up
        self._seq = 0
        # Guards the buffer, the counters and the sequence number between the poll thread and the sender's.
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._thread_main, name="clusterwatch-sender", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main_task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None  # set (on the loop) when a batch is submitted
        # set (on the loop) to end a reconnect backoff early: a flush at stop must not wait out 30 s
        self._retry: asyncio.Event | None = None
        self._flushing = False  # while a flush waits, reconnect at the initial backoff
        self._hello_due = False  # a fresh Hello is to be written on the open stream
        self._started = threading.Event()

    def start(self) -> None:
        self._thread.start()
        self._started.wait()

    def submit(self, batch: agent_pb2.Batch, samples: int, read_errors: int = 0,
               samples_dropped: int | None = None) -> int:
        """Number a batch, stamp the sender's counters on it, buffer it until acknowledged, and wake the
        stream; return its number.

        The counters stamped are those before this batch is buffered, except samples_sent, which counts
        this batch's `samples`; `read_errors` is the agent's count of failed reads, sent as it is, and
        `samples_dropped` the agent's drops over all its streams where it has several (else this one's).
        """
        with self._cond:
            self._seq += 1
            batch.seq = self._seq
            stamped = batch.counters
            stamped.samples_sent = self.counters.samples_sent + samples
            stamped.samples_dropped = self.counters.samples_dropped if samples_dropped is None else samples_dropped
            stamped.read_errors = read_errors
            stamped.buffered_batches = len(self.buffer)
            self.counters.samples_sent += samples
            self.counters.samples_dropped += self.buffer.add(self._seq, batch, samples)
            self._cond.notify_all()
            seq = self._seq
        self._on_loop(self._wake_writer)
        return seq

    def send_hello(self) -> None:
        """Write a fresh Hello on the open stream (what it says changed); a new stream sends one anyway."""
        self._hello_due = True
        self._on_loop(self._wake_writer)

    def send_answer(self, answer: agent_pb2.TrainAnswer) -> None:
        """Send an answer to a TrainRequest on the stream, from any thread (the oldest go past MAX_TRAIN_ANSWERS)."""
        self._answers.append(answer)
        self._on_loop(self._wake_writer)

    def flush(self, timeout: float) -> bool:
        """Wait until every batch is acknowledged or timeout; True when none is left."""
        deadline = time.monotonic() + timeout
        self._flushing = True
        self._on_loop(self._retry_now)
        try:
            with self._cond:
                while len(self.buffer):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(min(left, 0.1))
            return True
        finally:
            self._flushing = False

    def stop(self, timeout: float = 5.0) -> None:
        """Close the stream (after the batches already sent) and end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._on_loop(self._cancel_main)
        self._thread.join(timeout)
        with self._cond:
            self.counters.samples_unsent = self.buffer.samples

    # -- the sender's thread and its loop -----------------------------------------------------------

    def _on_loop(self, fn: Callable[[], None]) -> None:
        """Run fn on the sender's loop, from any thread; nothing if the loop is not running."""
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(fn)
        except RuntimeError:  # the loop has closed: the sender has stopped
            pass

    def _wake_writer(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _retry_now(self) -> None:
        if self._retry is not None:
            self._retry.set()

    def _cancel_main(self) -> None:
        if self._main_task is not None:
            self._main_task.cancel()

    def _thread_main(self) -> None:
        name_os_thread("cw-sender")
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._run())
        except asyncio.CancelledError:
            pass
        finally:
            self._loop = None
            self._started.set()  # never leave start() waiting, even if the loop failed to run
            loop.close()

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._main_task = asyncio.current_task()
        self._wake = asyncio.Event()
        self._retry = asyncio.Event()
        self._started.set()
        while not self._stopping:
            started = time.monotonic()
            try:
                await self._one_stream()
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                details = exc.details() if hasattr(exc, "details") else str(exc)
                if code in _REFUSALS:
                    self.counters.streams_refused += 1
                    self._note_refused(code, details)
                else:
                    self._note_error(f"{code.name if code else 'error'}: {details}")
            except _NoCredential as exc:
                self._note_error(str(exc))
            except Exception as exc:  # never let the sender die: the agent would silently stop sending
                self._note_error(f"{type(exc).__name__}: {exc}")
            self.connected = False
            if self._stopping:
                break
            if time.monotonic() - started > 10:
                self._backoff.reset()  # the stream lived a while: start backing off afresh
            if self._flushing:
                self._backoff.reset(min(self._backoff_initial, FLUSH_RETRY_S))
            self._retry.clear()
            try:
                await asyncio.wait_for(self._retry.wait(), self._backoff.next_wait())
            except TimeoutError:
                pass
            self.counters.reconnects += 1

    def _note_refused(self, code: grpc.StatusCode, details: str) -> None:
        text = f"{code.name}: {details}"
        if self._first_time(text):
            log.warning("collector %s refuses this agent's stream (%s): %s. Retrying with backoff in case the "
                        "collector is what is wrong; batches are kept meanwhile, refusals counted "
                        "(streams_refused)", self.target, text, _REFUSALS[code])
        self.last_error = text

    def _note_error(self, text: str) -> None:
        if self._first_time(text):
            log.warning("collector %s: %s; retrying with backoff, batches are kept", self.target, text)
        self.last_error = text

    def _first_time(self, text: str) -> bool:
        """Whether `text` is new since the stream was last up: each failure said once while it lasts, even
        where two alternate (a refused write can end as INTERNAL, its status lost in gRPC's core)."""
        return self._said.first(text)

    async def _one_stream(self) -> None:
        """One stream, from connecting to its end; raises what ended it (grpc.RpcError when it broke)."""
        options = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.http2.max_pings_without_data", 0),
            # a fresh subchannel each (re)connection: gRPC's shared one keeps its own backoff (up to
            # 120 s) from the failures before, and would fail a flush's retry fast while the collector is up
            ("grpc.use_local_subchannel_pool", 1),
        ]
        if self._creds is not None:
            channel = grpc.aio.secure_channel(self.target, self._creds, options=options)
        else:
            channel = grpc.aio.insecure_channel(self.target, options=options)
        metadata = [("authorization", f"Bearer {self._token}")] if self._token else []
        if self._munge is not None:
            try:
                metadata += await self._munge.metadata()
            except MungeUnavailable as exc:
                await channel.close()
                raise _NoCredential(str(exc)) from None
        try:
            call = agent_pb2_grpc.IngestStub(channel).Stream(metadata=tuple(metadata) or None, wait_for_ready=False)
            # The stream ends when either side does: the replies end (or break), or a write fails.
            reader = asyncio.ensure_future(self._read(call))
            writer = asyncio.ensure_future(self._write(call))
            try:
                done, _ = await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
                if reader not in done:
                    # A write on a call the collector ended fails with no status ("RPC already finished",
                    # INTERNAL); the replies end with the status that says why (a refused token): wait for it.
                    done |= (await asyncio.wait({reader}, timeout=STATUS_WAIT_S))[0]
            finally:
                call.cancel()
                for task in (reader, writer):
                    task.cancel()
                await asyncio.gather(reader, writer, return_exceptions=True)
            for task in (reader, writer):  # the replies' error first: it carries the call's status
                if task in done:
                    task.result()  # raises what ended the stream
        finally:
            await channel.close()

    async def _read(self, call) -> None:
        async for reply in call:
            kind = reply.WhichOneof("body")
            if kind == "ack":
                if not self.connected:
                    self.connected = True
                    if self.last_error:
                        log.warning("collector %s: connected again", self.target)
                    self.last_error = ""
                    self._said.clear()
                with self._cond:
                    self.counters.samples_acked += self.buffer.ack(reply.ack.seq)
                    self._cond.notify_all()
            elif kind == "signal" and self._on_signal is not None:
                self._on_signal(reply.signal)
            elif kind == "train_request" and self._on_train_request is not None:
                self._on_train_request(reply.train_request, self.send_answer)

    async def _write(self, call) -> None:
        """The Hello, then every unacknowledged batch in order, then new ones as they come (never returns)."""
        self._hello_due = False
        await call.write(agent_pb2.AgentMessage(hello=self._hello()))
        with self._cond:
            first = self.buffer.first_seq()
            sent_upto = (first - 1) if first is not None else self._seq
        resending = self.counters.reconnects > 0
        wake = self._wake
        while True:
            wake.clear()  # before looking: a batch submitted after the look sets it again
            if self._hello_due:
                self._hello_due = False
                await call.write(agent_pb2.AgentMessage(hello=self._hello()))
            while self._answers:
                await call.write(agent_pb2.AgentMessage(train_answer=self._answers.popleft()))
            with self._cond:
                todo = self.buffer.after(sent_upto)
            if not todo:
                await wake.wait()
                continue
            for seq, batch in todo:
                if resending:
                    self.counters.batches_resent += 1
                await call.write(agent_pb2.AgentMessage(batch=batch))
                sent_upto = seq
            resending = False
