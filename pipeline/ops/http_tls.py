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

from pipeline.ops.http_config import HttpTlsConfig


class _EncryptedKey(Exception):
    """Raised from OpenSSL's password callback instead of prompting."""


def server_context(tls: HttpTlsConfig, bad: Callable[[str, str], Exception]) -> ssl.SSLContext:
    """A server context with the certificate chain and key of `tls` (both set);
    `bad(key, why)` makes the one-line error, which names files, never their text."""
    assert tls.cert_file is not None and tls.key_file is not None
    files = [("cert_file", tls.cert_file), ("key_file", tls.key_file), ("client_ca_file", tls.client_ca_file)]
    for name, path in files:
        if path is None:
            continue
        try:
            Path(path).open("rb").close()
        except OSError as exc:
            raise bad(f"metrics.tls.{name}", f"cannot read {path}: {exc.strerror}") from None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # TLS 1.2 or newer, the module's safe ciphers
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        # Certificates only: an error here is the certificate file's, so the next
        # step's "PEM lib" can only be the key's.
        ssl.create_default_context(cafile=tls.cert_file)
    except ssl.SSLError:
        raise bad("metrics.tls.cert_file", f"{tls.cert_file} holds no PEM certificate") from None
    try:
        ctx.load_cert_chain(tls.cert_file, tls.key_file, password=_no_password)
    except _EncryptedKey:
        raise bad("metrics.tls.key_file", f"{tls.key_file} is encrypted: give the key unencrypted "
                  "(protect the file with its permissions)") from None
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            why = f"{tls.key_file} is not the key of the certificate in metrics.tls.cert_file"
        else:
            why = f"{tls.key_file} holds no PEM private key"
        raise bad("metrics.tls.key_file", why) from None
    if tls.client_ca_file is not None:
        # OPTIONAL, not REQUIRED: the kubelet's probes and a Prometheus with a token send
        # no certificate. One that is sent must verify, or the handshake fails.
        ctx.verify_mode = ssl.CERT_OPTIONAL
        try:
            ctx.load_verify_locations(cafile=tls.client_ca_file)
        except ssl.SSLError:
            raise bad("metrics.tls.client_ca_file", f"{tls.client_ca_file} holds no PEM certificate") from None
    return ctx


def _no_password() -> bytes:
    raise _EncryptedKey
