"""A broker certificate that does not name the host the client connects to is said as
such, not as an untrusted CA (issue 44): librdkafka 2.16 words both alike ("certificate
verify failed: broker certificate could not be verified, verify that ssl.ca.location
is correctly configured"), so consumers/tls_check.py asks OpenSSL which check failed.

A SASL_SSL Apache Kafka of its own, whose certificate (from a CA made here) names only
wrong.example, is reached at 127.0.0.1: one JVM for the module, stopped after it.
tls_check itself is also checked against a Python TLS server (no broker)."""

from __future__ import annotations

import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from consumers.brokers.kafka import KafkaBroker
from consumers.brokers.kafka_security import KafkaSecurity
from consumers.tls_check import hostname_mismatch
from pipeline.commands.kafka_flags import EXIT_NO_KAFKA
from tests.integration.certs import CertFiles, make_ca, make_cert
from tests.integration.opsutil import REPO

WRONG_NAME = "wrong.example"
PASSWORD_ENV = "TB_TEST_KAFKA_PASSWORD"
MISMATCH = "the broker's certificate does not name the host connected to"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[CertFiles, CertFiles]:
    """(the CA, a broker certificate naming only wrong.example)."""
    directory = tmp_path_factory.mktemp("wrong-san-pki")
    ca = make_ca(directory)
    return ca, make_cert(ca, directory, "broker", [WRONG_NAME])


@pytest.fixture(scope="module")
def wrong_san_kafka(pki: tuple[CertFiles, CertFiles], tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    ca, leaf = pki
    keystore = leaf.key.parent / "broker-keystore.pem"  # Kafka's PEM keystore: key, then the chain
    keystore.write_text(leaf.key.read_text() + leaf.cert.read_text())
    with KafkaBroker(workdir=tmp_path_factory.mktemp("kafka-wrong-san"), security=KafkaSecurity(keystore, ca.cert)) as kafka:
        kafka.add_scram_user("producer", "pw-right")
        yield kafka


def produce(kafka: KafkaBroker, ca: Path) -> tuple[int, list[str], float]:
    """`tidebatch produce` through the SASL_SSL listener at 127.0.0.1, trusting `ca`."""
    args = [
        sys.executable, "-m", "pipeline.cli", "produce", "ctr", "--count", "1", "--connect-timeout", "20",
        "--bootstrap-servers", kafka.secure_bootstrap_servers,
        "-X", "security.protocol=SASL_SSL", "-X", "sasl.mechanism=SCRAM-SHA-512", "-X", "sasl.username=producer",
        "-X", f"sasl.password=${{{PASSWORD_ENV}}}", "-X", f"ssl.ca.location={ca}",
    ]
    began = time.monotonic()
    done = subprocess.run(args, cwd=REPO, env={**os.environ, PASSWORD_ENV: "pw-right"}, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=120)
    return done.returncode, done.stdout.splitlines(), time.monotonic() - began


def test_a_hostname_mismatch_is_one_line_saying_so(wrong_san_kafka: KafkaBroker, pki: tuple[CertFiles, CertFiles]) -> None:
    # Before: "TLS handshake with Kafka at ... failed: ... verify that ssl.ca.location is
    # correctly configured ..." (the CA was right).
    ca, _ = pki
    rc, lines, elapsed = produce(wrong_san_kafka, ca.cert)
    shown = "\n".join(lines)
    print(f"time to the line: {elapsed:.1f} s (interpreter start included)")
    assert rc == EXIT_NO_KAFKA, shown
    assert re.search(r"TLS handshake with Kafka at 127\.0\.0\.1:\d+ failed: " + MISMATCH, lines[-1]), shown
    assert "IP address mismatch" in lines[-1] and "SAN" in lines[-1], shown
    assert len([line for line in lines if MISMATCH in line]) == 1, shown  # said once, as the error
    assert "pw-right" not in shown


def test_an_untrusted_ca_is_not_called_a_hostname_mismatch(
    wrong_san_kafka: KafkaBroker, tmp_path: Path
) -> None:
    other = make_ca(tmp_path / "other", "other-ca")
    rc, lines, _ = produce(wrong_san_kafka, other.cert)
    shown = "\n".join(lines)
    assert rc == EXIT_NO_KAFKA, shown
    assert re.search(r"TLS handshake with Kafka at 127\.0\.0\.1:\d+ failed: .*certificate verify failed", lines[-1]), shown
    assert MISMATCH not in shown


# ------------------------------------------------------------------ tls_check, no broker
@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, CertFiles]]:
    """A TLS server on 127.0.0.1 serving a certificate for wrong.example: (address, its CA)."""
    ca = make_ca(tmp_path)
    leaf = make_cert(ca, tmp_path, "server", [WRONG_NAME])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(leaf.cert), str(leaf.key))
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            try:
                with context.wrap_socket(conn, server_side=True):
                    pass
            except (ssl.SSLError, OSError):
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"127.0.0.1:{listener.getsockname()[1]}", ca
    stop.set()
    thread.join(5)
    listener.close()


def test_tls_check_tells_a_mismatch_from_an_untrusted_ca(tls_server: tuple[str, CertFiles], tmp_path: Path) -> None:
    address, ca = tls_server
    said = hostname_mismatch(address, {"ssl.ca.location": str(ca.cert)})
    assert said is not None and "IP address mismatch" in said
    other = make_ca(tmp_path / "other", "other-ca")
    assert hostname_mismatch(address, {"ssl.ca.location": str(other.cert)}) is None
    assert hostname_mismatch(address, {"ssl.ca.location": str(ca.cert),
                                       "ssl.endpoint.identification.algorithm": "none"}) is None
