"""Who may read the worker's ops endpoints: the `Authorization` header check.

Basic auth is for people: a browser asks once on the dashboard and then sends the
same credentials with the page's own fetches of /api/stats (a page's script cannot
add a bearer token to a request the browser makes for it). A bearer token is for
machines: curl, scripts, Prometheus when `protect_metrics` is on. With both set,
either is accepted. With `metrics.tls.client_ca_file`, so is a connection whose client
certificate that CA signed (the TLS handshake verified it; pipeline/ops/http_tls.py).

Open whatever the config says: /healthz and /readyz (the kubelet's probes send no
credentials), and /metrics unless `metrics.auth.protect_metrics`. Every other path,
an unknown one included, needs credentials, so a new route is protected by default.

Comparisons go through hmac.compare_digest, so the time a wrong guess takes does not
say how much of it was right.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass

from consumers.client_settings import resolve_secret
from pipeline.errors import UserError
from pipeline.ops.http_config import HttpAuthConfig

REALM = "tidebatch"
PROBES = frozenset({"/healthz", "/readyz"})


@dataclass(frozen=True, repr=False)
class HttpAuth:
    """Resolved credentials: `basic` is b"user:password" as a browser encodes it;
    `client_certs`: a verified client certificate is accepted too."""

    basic: bytes | None
    token: bytes | None
    protect_metrics: bool = False
    client_certs: bool = False

    def __repr__(self) -> str:  # never the credentials themselves
        return f"HttpAuth(schemes={self.schemes()!r}, protect_metrics={self.protect_metrics})"

    @classmethod
    def from_config(
        cls, cfg: HttpAuthConfig, environ: Mapping[str, str] | None = None, *, client_certs: bool = False
    ) -> HttpAuth | None:
        """None when no credentials are configured (every endpoint open)."""
        if not cfg.enabled and not client_certs:
            return None
        env = os.environ if environ is None else environ
        basic = token = None
        if cfg.password is not None:
            password = _resolved("password", cfg.password, env)
            basic = f"{cfg.username}:{password}".encode()
        if cfg.bearer_token is not None:
            token = _resolved("bearer_token", cfg.bearer_token, env).encode()
        return cls(basic, token, cfg.protect_metrics, client_certs)

    def schemes(self) -> list[str]:
        named = [name for name, value in (("basic", self.basic), ("bearer", self.token)) if value is not None]
        return named + (["client-certificate"] if self.client_certs else [])

    def protects(self, path: str) -> bool:
        if path in PROBES:
            return False
        return self.protect_metrics or path != "/metrics"

    def allows(self, authorization: str | None, client_cert: bool = False) -> bool:
        """True when the header carries the configured user and password or token, or
        `client_cert` (the connection's certificate verified) and those are accepted."""
        if client_cert and self.client_certs:
            return True
        scheme, _, value = (authorization or "").strip().partition(" ")
        scheme, value = scheme.lower(), value.strip().encode()
        if scheme == "bearer" and self.token is not None:
            return hmac.compare_digest(value, self.token)
        if scheme == "basic" and self.basic is not None:
            try:
                given = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                return False
            return hmac.compare_digest(given, self.basic)
        return False

    def challenges(self) -> list[str]:
        """WWW-Authenticate values for a 401: Basic first, so a browser asks for it.
        HTTP has none for a client certificate: the 401's body lists every scheme."""
        out = []
        if self.basic is not None:
            out.append(f'Basic realm="{REALM}", charset="UTF-8"')
        if self.token is not None:
            out.append(f'Bearer realm="{REALM}"')
        return out


def _resolved(name: str, value: str, environ: Mapping[str, str]) -> str:
    key = f"metrics.auth.{name}"
    text = resolve_secret(key, value, environ, what="config key")
    if not text:  # an empty token would let an empty header in
        raise UserError(f"config key '{key}': resolves to an empty value")
    return text


def is_loopback(host: str) -> bool:
    """Only this machine can connect: 127.0.0.0/8, ::1, localhost. A name that
    resolves elsewhere, or 0.0.0.0 / :: (every interface), is not."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str, auth: HttpAuth | None) -> str | None:
    """The start-up warning for a server others can reach without credentials."""
    if auth is not None or is_loopback(host):
        return None
    return (
        f"ops endpoints bound to {host} without credentials: anyone who reaches this port can read "
        "the dashboard and /api/stats (topics, group, partitions, throughput). Set metrics.auth "
        "(username + password for the dashboard, bearer_token for scripts; e.g. "
        "TIDEBATCH_METRICS__AUTH__BEARER_TOKEN='${OPS_TOKEN}') or bind metrics.host to 127.0.0.1 "
        "(docs/OPERATIONS.md, \"Endpoints\")"
    )


def cleartext_warning(host: str, auth: HttpAuth | None, tls: ssl.SSLContext | None) -> str | None:
    """The start-up warning for credentials that cross the network unencrypted."""
    if auth is None or tls is not None or is_loopback(host):
        return None
    return (
        f"ops endpoints bound to {host} take credentials over plain HTTP: anyone on the path can read "
        "the password or token a client sends. Set metrics.tls.cert_file and metrics.tls.key_file "
        "(docs/OPERATIONS.md, \"HTTPS on the ops port\") or terminate TLS in front of the port"
    )
