"""Who is sending: the token check, certificate names, and the warning for a collector open to anyone."""
from __future__ import annotations

import pytest
from clusterwatch.collector.ingest.agent_auth import (
    certificate_node_names,
    has_token,
    is_loopback_listen,
    node_identity_error,
)

from tests.support.helpers import Collector

WARNING = "agents are not authenticated"


@pytest.mark.parametrize("listen, loopback", [
    ("127.0.0.1:50051", True), ("127.3.4.5:1", True), ("[::1]:50051", True), ("localhost:50051", True),
    ("0.0.0.0:50051", False), ("[::]:50051", False), (":50051", False), ("10.1.2.3:50051", False),
    ("collector.example.org:50051", False),
])
def test_loopback_listen_addresses(listen, loopback):
    assert is_loopback_listen(listen) is loopback


def test_certificate_names_are_the_cn_and_the_dns_names():
    ctx = {"x509_common_name": [b"gpu-a01"], "peer_dns": [b"GPU-A01.example.org", b"alias"],
           "peer_ip": [b"10.0.0.1"], "x509_subject_alternative_name": [b"10.0.0.1", b"alias"],
           "transport_security_type": [b"ssl"]}
    names = certificate_node_names(ctx)
    assert names == {"gpu-a01", "gpu-a01.example.org", "alias"}
    assert node_identity_error("gpu-a01", names) is None
    assert node_identity_error("ALIAS", names) is None
    assert node_identity_error("10.0.0.1", names) is not None  # an IP name is not a node name
    assert "not for node 'gpu-a02'" in node_identity_error("gpu-a02", names)
    assert node_identity_error("gpu-a0", names) is not None  # exact names, not prefixes
    # no client certificate (plain TLS or none): nothing to bind
    assert certificate_node_names({}) is None
    assert certificate_node_names({"transport_security_type": [b"insecure"]}) is None
    assert node_identity_error("anything", None) is None


def test_token_in_metadata():
    assert has_token([("authorization", "Bearer s3cret")], "s3cret")
    for md in ([("authorization", "Bearer s3cre")], [("authorization", "s3cret")], [("x-token", "Bearer s3cret")],
               [("authorization", b"Bearer s3cret")], [], None):
        assert not has_token(md, "s3cret")


@pytest.mark.e2e
def test_a_collector_without_agent_authentication_says_so_once(tmp_path):
    open_ = Collector(tmp_path, "--agent-auth", "none", listen="0.0.0.0:0", name="open")
    local = Collector(tmp_path, "--agent-auth", "none", name="local")
    closed = Collector(tmp_path, "--token", "t0ken", listen="0.0.0.0:0", name="closed")
    try:
        lines = [line for line in open_.text().splitlines() if WARNING in line]
        assert len(lines) == 1 and "0.0.0.0:0" in lines[0] and "--token" in lines[0]
        assert "no action reaches a process" in lines[0]
        # on loopback too: every user of the host reaches it
        assert len([line for line in local.text().splitlines() if WARNING in line]) == 1
        assert WARNING not in closed.text()
    finally:
        for p in (open_, local, closed):
            p.stop()
