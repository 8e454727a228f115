"""Secrets masked by value (consumers/secret_values.py) in every printed form: the log
formatters of pipeline/observe/logs.py (text and JSON, tracebacks included), foreign handlers
through the record factory, and the forms a value takes when printed inside a repr or a
JSON string."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from consumers.secret_values import MASK, SECRETS, SecretValues, scrub_log_records
from pipeline.observe import logs

PEM = (
    "-----BEGIN PRIVATE KEY-----\n"
    "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj\n"
    "MzEfYyjiWA4R4/M2bS1GB4t7NXp98C3SC6dVMvDuictGeurT8jNbvJZHtCSuYEvu\n"
    "-----END PRIVATE KEY-----\n"
)
PASSWORD = "XsecretUnitPw91"


@pytest.fixture
def secrets() -> Iterator[SecretValues]:
    SECRETS.clear()
    SECRETS.register(PASSWORD)
    SECRETS.register(PEM)
    yield SECRETS
    SECRETS.clear()


def test_every_printed_form_is_masked(secrets: SecretValues) -> None:
    line = " ".join([PASSWORD, PEM, repr({"k": PEM}), json.dumps({"k": PEM}), PEM.splitlines()[2]])
    shown = secrets.scrub(line)
    assert PASSWORD not in shown
    for body_line in PEM.splitlines()[1:3]:
        assert body_line not in shown
    assert "\\n" not in shown.replace(MASK, "")  # no escaped remnant of the key either
    assert shown.count(MASK) >= 5


def test_short_and_empty_values_are_not_registered() -> None:
    values = SecretValues()
    for value in ("", None, "abc", "   "):
        values.register(value)
    assert len(values) == 0
    assert values.scrub("abc def") == "abc def"


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_log_lines_and_tracebacks_are_masked(secrets: SecretValues, fmt: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    root = logging.getLogger()
    before = (root.handlers[:], root.level)
    monkeypatch.setattr("sys.stderr", out)
    logs.configure("DEBUG", fmt)
    try:
        log = logging.getLogger("tests.secret_values")
        log.debug("settings %s", {"ssl.key.pem": PEM})
        try:
            raise RuntimeError(f"cannot log in with {PASSWORD}")
        except RuntimeError:
            log.exception("failed")
    finally:
        root.handlers[:] = before[0]  # the next tests log where they did before
        root.setLevel(before[1])
    printed = out.getvalue()
    assert "settings" in printed and "Traceback" in printed
    assert PASSWORD not in printed
    for body_line in PEM.splitlines()[1:3]:
        assert body_line not in printed


def test_foreign_handlers_see_masked_messages(secrets: SecretValues) -> None:
    # A handler this project did not set up (Faust installs its own), with a plain
    # logging.Formatter: the record itself carries the masked message.
    scrub_log_records()
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger("tests.secret_values.foreign")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("password is %s, port %d", PASSWORD, 9092)
        log.warning("nothing here %s", "at all")
    finally:
        log.removeHandler(handler)
    assert out.getvalue().splitlines() == [f"password is {MASK}, port 9092", "nothing here at all"]
