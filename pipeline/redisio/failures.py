"""What a failed Redis connection means, and the one line that says so.

Three kinds (docs/REDIS.md "AUTH and TLS"):
- "outage": refused, reset, timed out; the server is away and will come back by itself.
- "auth": the server answered and rejected the credentials (wrong password, unknown or
  disabled ACL user, no password where one is required). Retrying will not fix it;
  a corrected secret (a rotated password, a remounted file) will, so the worker keeps
  retrying, but it is a configuration fault: logged once as an ERROR, readiness false.
- "tls": the handshake failed on a certificate: the server's is not trusted (wrong
  redis.tls_ca_file, or its name does not match the URL's host), or the server wanted
  a client certificate. Same treatment as "auth".

An abrupt EOF during a TLS write is an outage, not "tls": a server killed under an
open TLS connection produces exactly that. A server refusing a missing client
certificate (TLS 1.3: after the handshake) gives either that EOF or its alert
CERTIFICATE_REQUIRED, depending on timing; the alert is "tls", and link.py keeps a
"tls" problem through the EOFs that follow it.
"""

from __future__ import annotations

import ssl

import redis

OUTAGE, AUTH, TLS = "outage", "auth", "tls"


def classify(exc: BaseException) -> str:
    """OUTAGE, AUTH or TLS for an exception from a Redis call or connect."""
    if isinstance(exc, redis.AuthenticationError):
        return AUTH
    cause = _ssl_cause(exc)
    if isinstance(cause, ssl.SSLCertVerificationError):
        return TLS
    if isinstance(cause, ssl.SSLError) and "CERTIFICATE" in (getattr(cause, "reason", None) or ""):
        return TLS  # an alert from the server: certificate required / unknown / bad
    return OUTAGE


def describe(kind: str, exc: BaseException, url: str, user: str) -> str:
    """The line for an AUTH or TLS failure; `url` is already redacted. Neither branch
    quotes anything we sent: the server's reply and the TLS library's reason only."""
    if kind == AUTH:
        return (f"redis: authentication failed for user {user!r} at {url} (wrong password or unknown "
                f"user; check redis.username / redis.password): {first_line(exc).rstrip('.')}")
    reason = first_line(_ssl_cause(exc) or exc)
    return (f"redis: TLS handshake with {url} failed (server certificate not trusted or not for this "
            f"host, check redis.tls_ca_file; or the server requires a client certificate, "
            f"redis.tls_cert_file / redis.tls_key_file): {reason}")


def first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__


def _ssl_cause(exc: BaseException) -> ssl.SSLError | None:
    """The ssl error under redis-py's ConnectionError (it raises from inside `except`,
    so the original is the context, not the cause)."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 5:
        if isinstance(current, ssl.SSLError):
            return current
        current = current.__cause__ or current.__context__
        seen += 1
    return None
