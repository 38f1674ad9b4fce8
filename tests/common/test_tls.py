"""clusterwatch.tls: the one place TLS credentials are built; a bad file is one line naming flag and path."""
import subprocess

import grpc
import pytest

from clusterwatch import tls
from clusterwatch.errors import ConfigError


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                    "/CN=test", "-keyout", "k.pem", "-out", "c.pem"], cwd=d, check=True, capture_output=True,
                   timeout=60)
    return d


def test_plaintext_is_none():
    assert tls.channel_credentials(None) is None
    assert tls.server_credentials(None, None) is None


def test_credentials_from_real_files(pki):
    ca, cert, key = str(pki / "c.pem"), str(pki / "c.pem"), str(pki / "k.pem")
    assert isinstance(tls.channel_credentials(ca), grpc.ChannelCredentials)
    assert isinstance(tls.channel_credentials(ca, cert, key), grpc.ChannelCredentials)
    assert isinstance(tls.server_credentials(cert, key), grpc.ServerCredentials)
    assert isinstance(tls.server_credentials(cert, key, client_ca=ca), grpc.ServerCredentials)


def test_missing_file_is_one_line_naming_flag_and_path(tmp_path, pki):
    gone = str(tmp_path / "nope.pem")
    with pytest.raises(ConfigError) as e:
        tls.channel_credentials(gone)
    assert str(e.value).startswith(f"cannot read --tls-ca {gone}: ") and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="--tls-client-ca"):
        tls.server_credentials(str(pki / "c.pem"), str(pki / "k.pem"), client_ca=gone)
    with pytest.raises(ConfigError, match="--tls-key"):
        tls.server_credentials(str(pki / "c.pem"), gone)


def test_unreadable_path(tmp_path):
    """A folder where a file belongs (a permission test would pass as root, which reads any file)."""
    with pytest.raises(ConfigError, match="cannot read --tls-cert .*directory"):
        tls.server_credentials(str(tmp_path), str(tmp_path))


def test_empty_file_and_pairs(tmp_path, pki):
    empty = tmp_path / "empty.pem"
    empty.write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        tls.channel_credentials(str(empty))
    with pytest.raises(ConfigError, match="go together"):
        tls.channel_credentials(str(pki / "c.pem"), cert=str(pki / "c.pem"))
    with pytest.raises(ConfigError, match="needs --tls-ca"):
        tls.channel_credentials(None, cert=str(pki / "c.pem"), key=str(pki / "k.pem"))
    with pytest.raises(ConfigError, match="go together"):
        tls.server_credentials(str(pki / "c.pem"), None)
    with pytest.raises(ConfigError, match="needs --tls-cert"):
        tls.server_credentials(None, None, client_ca=str(pki / "c.pem"))
