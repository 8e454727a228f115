"""pipeline/faust/sasl_logs.py: aiokafka's debug line for a SASL login, as conn.py
writes it, keeps no password (PLAIN) or proof (SCRAM); other lines are left alone."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("aiokafka", reason="aiokafka is not installed (the [faust] extra)")

from aiokafka.protocol.admin import SaslAuthenticateRequest, SaslAuthenticateResponse_v1  # noqa: E402
from aiokafka.protocol.metadata import MetadataRequest  # noqa: E402

from pipeline.faust.sasl_logs import AIOKAFKA_CONN_LOGGER, HIDDEN, SaslTokenFilter, hide_sasl_tokens  # noqa: E402


@pytest.fixture
def conn_log(caplog: pytest.LogCaptureFixture):
    logger = logging.getLogger(AIOKAFKA_CONN_LOGGER)
    before = list(logger.filters)
    # An earlier test's make_app() may have installed the filter already: start without.
    logger.filters[:] = [f for f in before if not isinstance(f, SaslTokenFilter)]
    caplog.set_level(logging.DEBUG, logger=AIOKAFKA_CONN_LOGGER)
    yield logger
    logger.filters[:] = before


def send(logger: logging.Logger, request: object) -> None:
    """What aiokafka/conn.py's send() logs for a request struct."""
    logger.debug("Request to %s:%d %d: %s", "127.0.0.1", 9093, 7, request)


def plain_login(password: str) -> object:
    return SaslAuthenticateRequest(b"\x00tidebatch\x00" + password.encode()).prepare({36: (0, 1)})


def test_a_plain_login_leaks_without_the_filter(conn_log, caplog: pytest.LogCaptureFixture) -> None:
    send(conn_log, plain_login("hunter2-api-secret"))
    assert "hunter2-api-secret" in caplog.text  # what the filter is for


def test_the_plain_password_and_the_scram_proof_are_hidden(conn_log, caplog: pytest.LogCaptureFixture) -> None:
    hide_sasl_tokens()
    hide_sasl_tokens()  # once is enough
    assert sum(isinstance(f, SaslTokenFilter) for f in conn_log.filters) == 1
    send(conn_log, plain_login("hunter2-api-secret"))
    proof = b"c=biws,r=6ab17f8cf142465aa4166c3249837080,p=" + b"L" * 120  # longer than the repr's 100
    send(conn_log, SaslAuthenticateRequest(proof).prepare({36: (0, 1)}))
    conn_log.debug("Response from %s:%d %d: %s", "127.0.0.1", 9093, 7,
                   SaslAuthenticateResponse_v1(0, "", b"r=abc,s=salt,i=4096", 0))
    assert "hunter2" not in caplog.text and "LLLL" not in caplog.text and "salt" not in caplog.text
    assert caplog.text.count(HIDDEN) == 3
    assert "Request to 127.0.0.1:9093 7: SaslAuthenticateRequest_v1(sasl_auth_bytes=***)" in caplog.text
    assert "error_code=0" in caplog.text  # the rest of the line stays


def test_other_lines_are_untouched(conn_log, caplog: pytest.LogCaptureFixture) -> None:
    hide_sasl_tokens()
    request = MetadataRequest(["ctr.requests"]).prepare({3: (0, 5)})
    send(conn_log, request)
    conn_log.debug("Closing connection at %s:%s (%s, %s)", "127.0.0.1", 9093, None, None)
    assert f"Request to 127.0.0.1:9093 7: {request}" in caplog.text
    assert "Closing connection at 127.0.0.1:9093 (None, None)" in caplog.text
