"""Nobody let in: tokens, mutual TLS, munge-identified queries, and malformed or oversized input."""
from __future__ import annotations

import json
import subprocess
import sys

import grpc
import pytest
from clusterwatch.cli.common import MUNGE_PAYLOAD
from clusterwatch.v1 import agent_pb2, agent_pb2_grpc, query_pb2, query_pb2_grpc

from clusterwatch.model import ProcessSample
from clusterwatch.wire import processes_to_table
from tests.support.helpers import AGENT_METADATA, CLI, Collector, Proc, cli, metric_value, wait_for

pytestmark = pytest.mark.e2e

SLEEPER = "import time; time.sleep(600)"


def _agent(tmp_path, collector, pid, *extra, name="agent"):
    return Proc([*CLI, "agent", "--collector", f"localhost:{collector.grpc_port}", "--node", "sec-node",
                 "--interval", "0.3", "--gpu-source", "none", "--pid", str(pid), "--job-id", "sec-1",
                 "--no-provenance", "--spool-dir", str(tmp_path / "spool"), "--train-socket",
                 str(tmp_path / f"{name}.sock"), *extra], tmp_path / f"{name}.log")


def _samples(collector) -> float:
    return metric_value(collector.metrics(), "clusterwatch_ingest_samples_total") or 0


def test_token_required(tmp_path):
    collector = Collector(tmp_path, "--token", "s3cret-token")
    sleeper = Proc([sys.executable, "-c", SLEEPER], tmp_path / "sleeper.log")
    bad = _agent(tmp_path, collector, sleeper.pid, "--token", "wrong", name="bad")
    good = None
    try:
        wait_for(lambda: (metric_value(collector.metrics(), "clusterwatch_ingest_unauthenticated_total") or 0) >= 1,
                 what="the wrong token counted")
        wait_for(lambda: "UNAUTHENTICATED" in bad.text(), what="the agent saying why")
        assert _samples(collector) == 0
        assert "s3cret-token" not in bad.text() and "wrong" not in collector.text()
        bad.stop()
        good = _agent(tmp_path, collector, sleeper.pid, "--token", "s3cret-token", name="good")
        wait_for(lambda: _samples(collector) > 0, what="samples with the right token")
    finally:
        for p in (good, bad, sleeper, collector):
            if p is not None:
                p.stop()


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _make_pki(d):
    """A CA, a server certificate for localhost/127.0.0.1 and node certificates, as docs/how-to/secure.md says.

    client: the node sec-node's (its CN); alias: CN another name, sec-node among its DNS names;
    other: another node's (other-node), which may not speak for sec-node.
    """
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=clusterwatch-ca",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=d)
    for name, cn, san in (("server", "server", "subjectAltName=DNS:localhost,IP:127.0.0.1"),
                          ("client", "sec-node", None),
                          ("alias", "gpu-a01.example.org", "subjectAltName=DNS:gpu-a01,DNS:SEC-NODE,IP:10.0.0.1"),
                          ("other", "other-node", "subjectAltName=DNS:other-node.example.org,IP:127.0.0.1")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", cwd=d)
        extra = []
        if san:
            (d / "san.ext").write_text(san + "\n")
            extra = ["-extfile", "san.ext"]
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-out", f"{name}.pem", *extra, cwd=d)


def test_mutual_tls(tmp_path):
    pki = tmp_path / "pki"
    pki.mkdir()
    _make_pki(pki)
    collector = Collector(tmp_path, "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"),
                          "--tls-client-ca", str(pki / "ca.pem"), "--query-listen", "127.0.0.1:0")
    sleeper = Proc([sys.executable, "-c", SLEEPER], tmp_path / "sleeper.log")
    no_cert = _agent(tmp_path, collector, sleeper.pid, "--tls-ca", str(pki / "ca.pem"), name="nocert")
    agent = None
    try:
        wait_for(lambda: "UNAVAILABLE" in no_cert.text() or "handshake" in no_cert.text().lower(),
                 what="the agent without a client certificate refused")
        assert _samples(collector) == 0
        no_cert.stop()
        agent = _agent(tmp_path, collector, sleeper.pid, "--tls-ca", str(pki / "ca.pem"), "--tls-cert",
                       str(pki / "client.pem"), "--tls-key", str(pki / "client.key"))
        wait_for(lambda: _samples(collector) > 0, what="samples over mutual TLS")
        # a login node has no client certificate: status goes to the query port, TLS with the CA only
        query = json.loads(collector.ports_file.read_text())["query"]
        r = cli("status", "sec-1", "--collector", f"localhost:{query}", "--tls-ca", str(pki / "ca.pem"), "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["job"]["job_id"] == "sec-1"
        # without the CA the TLS port does not answer a plaintext client
        r = cli("status", "sec-1", "--collector", f"localhost:{query}")
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    finally:
        for p in (agent, no_cert, sleeper, collector):
            if p is not None:
                p.stop()


def test_mutual_tls_binds_the_node_to_its_certificate(tmp_path):
    """Under mTLS an agent speaks only for a node its certificate names (CN or DNS name): no other."""
    pki = tmp_path / "pki"
    pki.mkdir()
    _make_pki(pki)
    collector = Collector(tmp_path, "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"),
                          "--tls-client-ca", str(pki / "ca.pem"))
    sleeper = Proc([sys.executable, "-c", SLEEPER], tmp_path / "sleeper.log")
    tls = ("--tls-ca", str(pki / "ca.pem"))
    impostor = _agent(tmp_path, collector, sleeper.pid, *tls, "--tls-cert", str(pki / "other.pem"),
                      "--tls-key", str(pki / "other.key"), name="impostor")
    agent = None
    try:
        wait_for(lambda: (metric_value(collector.metrics(), "clusterwatch_ingest_identity_refused_total") or 0) >= 2,
                 what="the other node's certificate refused (and refused again on its retry)")
        wait_for(lambda: "PERMISSION_DENIED" in impostor.text(), what="the agent saying why")
        assert "certificate is for other-node, other-node.example.org, not for node 'sec-node'" in impostor.text()
        assert _samples(collector) == 0
        # said once for that peer and node, however often the agent retries
        assert collector.text().count("certificate is for other-node") == 1
        assert (metric_value(collector.metrics(), "clusterwatch_ingest_unauthenticated_total") or 0) >= 2
        impostor.stop()
        # a DNS name of the certificate is the node's name too (host names compare without case)
        agent = _agent(tmp_path, collector, sleeper.pid, *tls, "--tls-cert", str(pki / "alias.pem"),
                       "--tls-key", str(pki / "alias.key"), name="alias")
        wait_for(lambda: _samples(collector) > 0, what="samples from the node its certificate names")
    finally:
        for p in (agent, impostor, sleeper, collector):
            if p is not None:
                p.stop()


def test_munge_identified_queries(tmp_path, munged):
    collector = Collector(tmp_path, "--query-auth", "munge", "--munge-socket", str(munged))
    sleeper = Proc([sys.executable, "-c", SLEEPER], tmp_path / "sleeper.log")
    agent = _agent(tmp_path, collector, sleeper.pid)
    env = {"CLUSTERWATCH_MUNGE_SOCKET": str(munged)}
    try:
        wait_for(lambda: _samples(collector) > 0, what="samples")
        # root sees the job (root's own, and root is an admin anyway)
        r = cli("status", "sec-1", "--collector", collector.address, "--json", env=env)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["job"]["user"] == "root"
        # another user (a real munge credential of uid nobody) is refused root's job and lists no job
        cred = subprocess.run(["runuser", "-u", "nobody", "--", "munge", "-s", MUNGE_PAYLOAD,
                               f"--socket={munged}"],
                              capture_output=True, text=True, timeout=30, check=True).stdout.strip()
        channel = grpc.insecure_channel(collector.address)
        stub = query_pb2_grpc.QueryStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.GetJob(query_pb2.GetJobRequest(job_id="sec-1"), timeout=10,
                        metadata=[("x-clusterwatch-munge", cred)])
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "job sec-1 is not yours" in err.value.details()
        assert "root" not in err.value.details()  # nor whose it is
        cred = subprocess.run(["runuser", "-u", "nobody", "--", "munge", "-s", MUNGE_PAYLOAD,
                               f"--socket={munged}"],
                              capture_output=True, text=True, timeout=30, check=True).stdout.strip()
        jobs = stub.ListJobs(query_pb2.ListJobsRequest(), timeout=10, metadata=[("x-clusterwatch-munge", cred)])
        assert list(jobs.jobs) == []
        # a credential is good once: replaying it is refused
        with pytest.raises(grpc.RpcError) as err:
            stub.ListJobs(query_pb2.ListJobsRequest(), timeout=10, metadata=[("x-clusterwatch-munge", cred)])
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        channel.close()
        # no credential at all (munge unreachable here): refused with what to do
        r = cli("status", "sec-1", "--collector", collector.address,
                env={"CLUSTERWATCH_MUNGE_SOCKET": str(tmp_path / "no-such.socket")})
        assert r.returncode == 1 and "munge credential" in r.stderr
        assert (metric_value(collector.metrics(), "clusterwatch_ingest_unauthenticated_total") or 0) >= 1
    finally:
        for p in (agent, sleeper, collector):
            p.stop()


def test_malformed_and_oversized_messages_are_refused_and_counted(tmp_path):
    collector = Collector(tmp_path)
    try:
        channel = grpc.insecure_channel(collector.address, options=[("grpc.max_send_message_length", -1)])
        stub = agent_pb2_grpc.IngestStub(channel)
        # a batch before the hello
        batch = agent_pb2.AgentMessage(batch=agent_pb2.Batch(seq=1))
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Stream(iter([batch]), metadata=AGENT_METADATA, timeout=10))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        # a hello without a node name
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Stream(iter([agent_pb2.AgentMessage(hello=agent_pb2.Hello())]), metadata=AGENT_METADATA,
                             timeout=10))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # an oversized message (beyond the 64 MiB limit)
        huge = agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="x" * (65 * 1024 * 1024)))
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Stream(iter([huge]), metadata=AGENT_METADATA, timeout=30))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # a process table whose columns disagree: refused whole, with the reason said once, and acknowledged
        # (an agent would otherwise resend it forever, and every batch behind it would wait)
        bad = agent_pb2.Batch(seq=1)
        processes_to_table([ProcessSample(1.0, "n", 5, 1.0, job_id="9")], bad.processes)
        bad.processes.rss_bytes.append(7)  # a second rss for one row
        replies = list(stub.Stream(iter([agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="n", boot_id="b")),
                                         agent_pb2.AgentMessage(batch=bad)]), metadata=AGENT_METADATA, timeout=10))
        assert [r.ack.seq for r in replies if r.WhichOneof("body") == "ack"] == [1]
        assert metric_value(collector.metrics(), "clusterwatch_ingest_refused_inconsistent_total") == 1
        assert "column rss_bytes has 2 rows, pid has 1" in collector.text()
        assert metric_value(collector.metrics(), "clusterwatch_ingest_samples_total") in (None, 0)
        # bytes that are not a message at all
        raw = channel.stream_stream("/clusterwatch.v1.Ingest/Stream", request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError):
            list(raw(iter([b"\xff\xff\xff garbage"]), metadata=AGENT_METADATA, timeout=10))
        channel.close()
        text = collector.metrics()
        assert (metric_value(text, "clusterwatch_ingest_rejected_total") or 0) >= 3
        assert collector.popen.poll() is None  # still running, still answering
        assert cli("jobs", "--collector", collector.address).returncode == 0
    finally:
        collector.stop()


def test_garbage_frames_are_refused_counted_and_said_once_per_peer(tmp_path):
    collector = Collector(tmp_path)
    try:
        channel = grpc.insecure_channel(collector.address)
        raw_stream = channel.stream_stream("/clusterwatch.v1.Ingest/Stream", request_serializer=lambda b: b,
                                           response_deserializer=lambda b: b)
        raw_get = channel.unary_unary("/clusterwatch.v1.Query/GetJob", request_serializer=lambda b: b,
                                      response_deserializer=lambda b: b)
        garbage = b"\xff\xff\xff garbage"
        for _ in range(5):
            with pytest.raises(grpc.RpcError) as err:
                list(raw_stream(iter([garbage]), metadata=AGENT_METADATA, timeout=10))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "does not parse" in err.value.details()
        # a good hello, then garbage: the stream is refused at the bad frame
        hello = agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="n", boot_id="b")).SerializeToString()
        with pytest.raises(grpc.RpcError) as err:
            list(raw_stream(iter([hello, garbage]), metadata=AGENT_METADATA, timeout=10))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as err:
            raw_get(garbage, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        channel.close()
        assert metric_value(collector.metrics(), "clusterwatch_ingest_rejected_total") == 7
        log = collector.text()
        assert "Traceback" not in log and "DecodeError] raised by servicer" not in log
        assert log.count("does not parse") == 1, log
        # well-formed requests still answered
        assert cli("jobs", "--collector", collector.address).returncode == 0
    finally:
        collector.stop()


def test_a_flooding_agent_is_slowed_down_and_an_absurd_batch_refused(tmp_path):
    collector = Collector(tmp_path, "--agent-rate-limit", "200")
    try:
        channel = grpc.insecure_channel(collector.address, options=[("grpc.max_send_message_length", -1)])
        stub = agent_pb2_grpc.IngestStub(channel)

        def flood():
            yield agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="flood", boot_id="f1"))
            for seq in range(1, 11):  # 10 × 500 samples: 2.5× the 10 s burst of 2,000
                b = agent_pb2.Batch(seq=seq)
                processes_to_table([ProcessSample(float(seq), "flood", 10_000 + i, 1.0) for i in range(500)],
                                   b.processes)
                yield agent_pb2.AgentMessage(batch=b)

        acks = [m.ack.seq for m in stub.Stream(flood(), metadata=AGENT_METADATA, timeout=120)]
        assert acks == list(range(1, 11))  # slowed down, but nothing lost
        text = collector.metrics()
        assert (metric_value(text, "clusterwatch_ingest_throttled_total") or 0) >= 1
        assert metric_value(text, "clusterwatch_ingest_samples_total") == 5000

        def absurd():
            yield agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="flood", boot_id="f2"))
            b = agent_pb2.Batch(seq=1)
            processes_to_table([ProcessSample(1.0, "flood", i, 1.0) for i in range(50_001)], b.processes)
            yield agent_pb2.AgentMessage(batch=b)

        with pytest.raises(grpc.RpcError) as err:
            list(stub.Stream(absurd(), metadata=AGENT_METADATA, timeout=60))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "at most 50000" in err.value.details()
        channel.close()
    finally:
        collector.stop()
