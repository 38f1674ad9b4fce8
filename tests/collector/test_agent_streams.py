"""One stream speaks for a node, and actions reach only an authenticated agent's processes: real gRPC streams
to a real IngestServicer on loopback."""
from __future__ import annotations

import asyncio

import grpc
from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.ingest.agent_auth import AgentAuth, TokenInterceptor
from clusterwatch.collector.ingest.service import AgentOutboxes, IngestServicer
from clusterwatch.collector.state.core import CollectorCore
from clusterwatch.collector.state.store import Store, open_db
from clusterwatch.v1 import agent_pb2, agent_pb2_grpc

TOKEN = "t0ken-of-the-agents"


async def _serve(auth: AgentAuth, token: str | None):
    core = CollectorCore(CollectorConfig(), Store(open_db(":memory:")))
    outboxes = AgentOutboxes()
    servicer = IngestServicer(core, outboxes, auth=auth)
    interceptors = [TokenInterceptor(token, lambda: None)] if token else []
    server = grpc.aio.server(interceptors=interceptors)
    agent_pb2_grpc.add_IngestServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port, servicer, outboxes


class Agent:
    """A client stream: a Hello for `node`, then whatever the collector sends is kept in `got`."""

    def __init__(self, port: int, node: str, metadata=None) -> None:
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self.queue: asyncio.Queue = asyncio.Queue()
        self.call = agent_pb2_grpc.IngestStub(self.channel).Stream(self._messages(), metadata=metadata)
        self.queue.put_nowait(agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=node, boot_id=f"b-{id(self)}")))
        self.got: list = []
        self.ended: asyncio.Future = asyncio.ensure_future(self._read())

    async def _messages(self):
        while True:
            msg = await self.queue.get()
            if msg is None:
                return
            yield msg

    async def _read(self):
        try:
            async for reply in self.call:
                self.got.append(reply)
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details()
        return grpc.StatusCode.OK, ""

    async def close(self) -> None:
        self.queue.put_nowait(None)
        await asyncio.wait_for(self.ended, 10)
        await self.channel.close()


async def _until(predicate, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_a_second_hello_for_a_connected_node_does_not_take_it_over() -> None:
    async def run():
        server, port, servicer, outboxes = await _serve(AgentAuth("token"), TOKEN)
        md = (("authorization", f"Bearer {TOKEN}"),)
        first = Agent(port, "n1", md)
        await _until(lambda: "n1" in outboxes.by_node)
        second = Agent(port, "n1", md)  # holds the token too: the token says nothing of which node
        code, details = await asyncio.wait_for(second.ended, 10)
        assert code == grpc.StatusCode.ALREADY_EXISTS and "another stream speaks for node 'n1'" in details
        assert servicer.node_taken == 1
        # the first keeps its node's requests
        assert outboxes.send_signal("n1", 10, 1.0, 15, "test")
        await _until(lambda: any(m.WhichOneof("body") == "signal" for m in first.got))
        assert not first.ended.done()
        # once it is gone, the node is free again (an agent reconnecting after its old stream closed)
        await first.close()
        await _until(lambda: "n1" not in outboxes.by_node)
        third = Agent(port, "n1", md)
        await _until(lambda: "n1" in outboxes.by_node)
        assert outboxes.send_signal("n1", 10, 1.0, 15, "test")
        await _until(lambda: any(m.WhichOneof("body") == "signal" for m in third.got))
        await third.close()
        await second.channel.close()
        await server.stop(None)

    asyncio.run(run())


def test_nothing_reaches_the_processes_of_an_unauthenticated_agent() -> None:
    async def run():
        server, port, servicer, outboxes = await _serve(AgentAuth("none"), None)
        agent = Agent(port, "n1")
        await _until(lambda: "n1" in outboxes.by_node)
        assert outboxes.send_signal("n1", 10, 1.0, 15, "test") is False
        assert outboxes.send_train_request("n1", agent_pb2.TrainRequest(id="r1", pid=10, kind="stack")) is False
        assert "not authenticated" in outboxes.why_not("n1")
        assert servicer.core.state.nodes["n1"].authenticated is False
        await asyncio.sleep(0.3)
        assert [m for m in agent.got if m.WhichOneof("body") in ("signal", "train_request")] == []
        await agent.close()
        await server.stop(None)

    asyncio.run(run())
