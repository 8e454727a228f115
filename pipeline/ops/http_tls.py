"""HTTPS for the ops endpoints: the `metrics.tls` section as an ssl.SSLContext (and,
with `client_ca_file`, the CA whose client certificates count as credentials).

Python's ssl module, no proxy in front: the same port then speaks TLS only (a plain
HTTP request fails its handshake; the server logs that at debug level and goes on).
The files are read twice: when the config is validated (pipeline/ops/http_config.py),
so a missing file or a key of another certificate is one line naming the key before
anything connects, and again when the server starts.

The key must be unencrypted: a password-protected key would make OpenSSL prompt on
the terminal of a worker that has none. File permissions (a Kubernetes Secret
mounted 0400) protect it, as they protect the Kafka client's keys.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Protocol


class TlsFiles(Protocol):
    """The `metrics.tls` section (pipeline/ops/http_config.py HttpTlsConfig, which
    imports this module to validate itself: hence a protocol, not that class)."""

    cert_file: str | None
    key_file: str | None
    client_ca_file: str | None


class PairError(Exception):
    """Why a certificate and key pair did not load: `which` is "cert" or "key" (the
    file at fault), `why` the reason without the file's name or text."""

    def __init__(self, which: str, why: str) -> None:
        super().__init__(why)
        self.which, self.why = which, why


class _EncryptedKey(Exception):
    """Raised from OpenSSL's password callback instead of prompting."""


def load_pair(ctx: ssl.SSLContext, cert_file: str, key_file: str) -> None:
    """`ctx` presents the certificate (chain) in `cert_file` with the key in `key_file`:
    the server's own, or a client certificate (pipeline/ops/http_client.py)."""
    for which, path in (("cert", cert_file), ("key", key_file)):
        try:
            Path(path).open("rb").close()
        except OSError as exc:
            raise PairError(which, f"cannot read it: {exc.strerror}") from None
    try:
        # Certificates only: an error here is the certificate file's, so the next
        # step's "PEM lib" can only be the key's.
        ssl.create_default_context(cafile=cert_file)
    except ssl.SSLError:
        raise PairError("cert", "holds no PEM certificate") from None
    try:
        ctx.load_cert_chain(cert_file, key_file, password=_no_password)
    except _EncryptedKey:
        raise PairError("key", "is encrypted: give the key unencrypted (protect the file with its permissions)") from None
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise PairError("key", "is not the key of the certificate") from None
        raise PairError("key", "holds no PEM private key") from None


def server_context(tls: TlsFiles, bad: Callable[[str, str], Exception]) -> ssl.SSLContext:
    """A server context with the certificate chain and key of `tls` (both set);
    `bad(key, why)` makes the one-line error, which names files, never their text."""
    assert tls.cert_file is not None and tls.key_file is not None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # TLS 1.2 or newer, the module's safe ciphers
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        load_pair(ctx, tls.cert_file, tls.key_file)
    except PairError as exc:
        path = tls.cert_file if exc.which == "cert" else tls.key_file
        why = exc.why.replace("the certificate", "the certificate in metrics.tls.cert_file")
        raise bad(f"metrics.tls.{exc.which}_file", f"{path}: {why}") from None
    if tls.client_ca_file is not None:
        # OPTIONAL, not REQUIRED: the kubelet's probes and a Prometheus with a token send
        # no certificate. One that is sent must verify, or the handshake fails.
        ctx.verify_mode = ssl.CERT_OPTIONAL
        try:
            ctx.load_verify_locations(cafile=tls.client_ca_file)
        except ssl.SSLError:
            raise bad("metrics.tls.client_ca_file", f"{tls.client_ca_file}: holds no PEM certificate") from None
        except OSError as exc:
            raise bad("metrics.tls.client_ca_file", f"{tls.client_ca_file}: cannot read it: {exc.strerror}") from None
    return ctx


def _no_password() -> bytes:
    raise _EncryptedKey
