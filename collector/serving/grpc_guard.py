"""Messages that do not parse: refused, counted, said once per peer, never a traceback each.

gRPC decodes a request before any servicer code runs; a DecodeError there, left to gRPC, is logged
with a traceback once per message and counted nowhere. Here every method's
decoder keeps what does not parse as a Malformed marker instead, and the method's wrapper
refuses it (INVALID_ARGUMENT) the moment it is read.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

import grpc

from clusterwatch.log_once import SaidOnce

log = logging.getLogger("clusterwatch.collector")

# What was said once already: a bounded memory, so a flood of peers cannot grow it.
MAX_SAID = 10_000
_said = SaidOnce(log, limit=MAX_SAID)


def say_once(key: str, message: str, *args) -> None:
    """Log `message` (a warning) the first time `key` is seen; counters say how often since."""
    _said.warning(key, message, *args)


def peer_host(peer: str | None) -> str:
    """The address of a gRPC peer without its port ("ipv4:10.0.0.5:40112" → "10.0.0.5")."""
    if not peer:
        return "an unknown peer"
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rpartition(":")[0].strip("[]") or rest
    return peer


class Malformed:
    """A request that did not decode; stands in for the message until the wrapper refuses it."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _tolerant(decode: Callable[[bytes], object] | None) -> Callable[[bytes], object] | None:
    if decode is None:
        return None

    def tolerant(data: bytes):
        try:
            return decode(data)
        except Exception as exc:  # DecodeError, and whatever a decoder may raise on hostile bytes
            return Malformed(f"{type(exc).__name__}: {exc}")

    return tolerant


class MalformedMessageInterceptor(grpc.aio.ServerInterceptor):
    """Refuse, count and (once per peer) say a request that is not the method's message.

    Args:
        on_malformed: called once for each refused request (the collector counts it as rejected).
    """

    def __init__(self, on_malformed: Callable[[], None]) -> None:
        self.on_malformed = on_malformed

    async def _refuse(self, context, method: str, bad: Malformed) -> None:
        self.on_malformed()
        peer = peer_host(context.peer())
        say_once(f"malformed {peer}", "%s sent %s a message that does not parse (%s): refused, and counted in "
                 "clusterwatch_ingest_rejected_total; not said again for that peer", peer, method, bad.reason)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                            f"the request to {method} is not a message of that method (it does not parse)")

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        decode = _tolerant(handler.request_deserializer)
        encode = handler.response_serializer
        refuse = self._refuse

        async def checked(requests, context):
            async for request in requests:
                if isinstance(request, Malformed):
                    await refuse(context, method, request)
                yield request

        if handler.unary_unary:
            inner = handler.unary_unary

            async def unary_unary(request, context):
                if isinstance(request, Malformed):
                    await refuse(context, method, request)
                return await inner(request, context)

            return grpc.unary_unary_rpc_method_handler(unary_unary, decode, encode)
        if handler.unary_stream:
            inner = handler.unary_stream

            async def unary_stream(request, context):
                if isinstance(request, Malformed):
                    await refuse(context, method, request)
                async for response in inner(request, context):
                    yield response

            return grpc.unary_stream_rpc_method_handler(unary_stream, decode, encode)
        if handler.stream_unary:
            inner = handler.stream_unary

            async def stream_unary(requests, context):
                return await inner(checked(requests, context), context)

            return grpc.stream_unary_rpc_method_handler(stream_unary, decode, encode)
        inner = handler.stream_stream

        async def stream_stream(requests, context):
            async for response in inner(checked(requests, context), context):
                yield response

        return grpc.stream_stream_rpc_method_handler(stream_stream, decode, encode)
