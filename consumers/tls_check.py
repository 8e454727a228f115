"""Why a broker's certificate failed verification: a CA the client does not trust, or a
certificate that does not name the host the client connected to.

librdkafka 2.16 says the same for both ("SSL handshake failed: error:0A000086:SSL
routines::certificate verify failed: broker certificate could not be verified, verify
that ssl.ca.location is correctly configured ..."), measured against a broker whose
certificate names only wrong.example: an operator with a hostname mismatch was sent
to check the CA (issue 44). OpenSSL knows which check failed (verify error 62,
hostname mismatch; 64, IP address mismatch) but librdkafka does not pass it on. So
after such a failure the start-up check (consumers/kafka_reachable.py) makes one TLS
handshake of its own, with Python's ssl, the same CA and the host name check on, and
reads OpenSSL's verify code.
"""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Mapping
from typing import Any

# OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH.
_NAME_MISMATCH_CODES = frozenset({62, 64})
TIMEOUT_S = 3.0


def _context(settings: Mapping[str, Any]) -> ssl.SSLContext:
    """Trust what librdkafka would: ssl.ca.location (a file, a directory, or "probe"
    for the system's), ssl.ca.pem, else OpenSSL's default paths."""
    context = ssl.create_default_context(cafile=None)
    location = str(settings.get("ssl.ca.location") or "")
    if location and location != "probe":
        if os.path.isdir(location):
            context.load_verify_locations(capath=location)
        else:
            context.load_verify_locations(cafile=location)
    if settings.get("ssl.ca.pem"):
        context.load_verify_locations(cadata=str(settings["ssl.ca.pem"]))
    context.check_hostname = True
    return context


def hostname_mismatch(address: str, settings: Mapping[str, Any], timeout_s: float = TIMEOUT_S) -> str | None:
    """OpenSSL's words ("IP address mismatch, certificate is not valid for '127.0.0.1'.")
    when the broker at `address` (host:port) serves a certificate that the configured
    CA trusts but that does not name the host; None when it is not that (untrusted,
    named, no answer, or host names are not checked: ssl.endpoint.identification.algorithm
    none)."""
    if str(settings.get("ssl.endpoint.identification.algorithm", "https")).lower() == "none":
        return None
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        context = _context(settings)
        with (
            socket.create_connection((host, int(port)), timeout=timeout_s) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            return None
    except ssl.SSLCertVerificationError as exc:
        if exc.verify_code in _NAME_MISMATCH_CODES:
            return str(exc.verify_message)
        return None
    except (OSError, ValueError):  # no answer, or a CA file Python cannot read: no verdict
        return None
