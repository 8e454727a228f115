"""The test-certificate helper (certs.py) makes a chain that openssl and Python's ssl
both accept, the way a TLS server and client will use it."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

from tests.integration.certs import make_ca, make_cert


def test_leaf_certificates_verify_against_their_ca_and_load_in_python(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    server = make_cert(ca, tmp_path, "server", ["127.0.0.1", "localhost", "::1"])
    client = make_cert(ca, tmp_path, "client")
    for leaf in (server, client):
        assert leaf.ca == ca.cert and leaf.key.read_text().startswith("-----BEGIN PRIVATE KEY-----")
        ok = subprocess.run(["openssl", "verify", "-CAfile", str(ca.cert), str(leaf.cert)], capture_output=True, text=True)
        assert ok.returncode == 0, ok.stderr
    text = subprocess.run(["openssl", "x509", "-noout", "-text", "-in", str(server.cert)],
                          capture_output=True, text=True, check=True).stdout
    assert "IP Address:127.0.0.1" in text and "DNS:localhost" in text and "CN = 127.0.0.1" in text
    ctx = ssl.create_default_context(cafile=str(ca.cert))
    ctx.verify_flags |= getattr(ssl, "VERIFY_X509_STRICT", 0)  # what newer Pythons check by default
    ctx.load_cert_chain(str(client.cert), str(client.key))
    assert not list(tmp_path.glob("*.csr")) and not list(tmp_path.glob("*.ext"))


def test_another_ca_does_not_verify(tmp_path: Path) -> None:
    ca, other = make_ca(tmp_path / "a"), make_ca(tmp_path / "b", "other-ca")
    leaf = make_cert(ca, tmp_path / "a", "server", ["127.0.0.1"])
    bad = subprocess.run(["openssl", "verify", "-CAfile", str(other.cert), str(leaf.cert)], capture_output=True)
    assert bad.returncode != 0
