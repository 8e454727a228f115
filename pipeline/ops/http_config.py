"""The `metrics` section of the worker config: where the ops endpoints listen and who
may read them (docs/OPERATIONS.md, "Endpoints").

    metrics:
      host: 0.0.0.0
      port: 9400
      auth:
        username: ops                     # basic auth, for people with a browser
        password: ${TIDEBATCH_OPS_PASSWORD}
        bearer_token: "@file:/var/run/secrets/tidebatch/ops-token"   # for machines
        protect_metrics: false            # /metrics stays open for Prometheus
      tls:                                # HTTPS instead of HTTP (pipeline/ops/http_tls.py)
        cert_file: /etc/tidebatch/tls/ops.crt   # PEM, the chain after the leaf if any
        key_file: /etc/tidebatch/tls/ops.key    # PEM, unencrypted
        client_ca_file: /etc/tidebatch/tls/clients-ca.crt   # optional: client certificates

The password and the token are references like the `kafka:` block's secrets
(consumers/client_settings.py), resolved when the server starts
(pipeline/ops/http_auth.py); a dumped config shows them as ***. Environment
overrides: TIDEBATCH_METRICS__AUTH__BEARER_TOKEN='${OPS_TOKEN}',
TIDEBATCH_METRICS__TLS__CERT_FILE=/etc/tidebatch/tls/ops.crt and so on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields

from consumers.client_settings import redacted

SECRET_FIELDS = ("password", "bearer_token")


@dataclass(repr=False)
class HttpAuthConfig:
    """Unset (the default): every endpoint is open, as on loopback it may well be."""

    username: str | None = None
    password: str | None = None
    bearer_token: str | None = None
    # /metrics needs credentials too; Prometheus then sends the bearer token
    # (scrape_config `authorization`) or basic auth (`basic_auth`).
    protect_metrics: bool = False

    @property
    def enabled(self) -> bool:
        return self.password is not None or self.bearer_token is not None

    def __repr__(self) -> str:  # a dumped config must not show a secret
        shown = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        return "HttpAuthConfig(" + ", ".join(f"{k}={v!r}" for k, v in redacted(shown, SECRET_FIELDS).items()) + ")"


@dataclass
class HttpTlsConfig:
    """Unset (the default): plain HTTP. Both files set: HTTPS only, on the same port.
    `client_ca_file`: a client certificate this CA signed is a credential like the
    password or the token (pipeline/ops/http_auth.py); a client may still send none."""

    cert_file: str | None = None
    key_file: str | None = None
    client_ca_file: str | None = None

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None


@dataclass
class MetricsConfig:
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 9400
    auth: HttpAuthConfig = field(default_factory=HttpAuthConfig)
    tls: HttpTlsConfig = field(default_factory=HttpTlsConfig)


def validate_metrics(metrics: MetricsConfig, bad: Callable[[str, str], Exception]) -> None:
    """What can be checked before the references are resolved; messages name keys only."""
    if not 0 <= metrics.port <= 65535:
        raise bad("metrics.port", "must be a TCP port (0 picks a free one)")
    auth = metrics.auth
    for name in ("username", *SECRET_FIELDS):
        if getattr(auth, name) == "":
            raise bad(f"metrics.auth.{name}", "is empty: leave it out, or give a value")
    if (auth.username is None) != (auth.password is None):
        missing = "password" if auth.password is None else "username"
        raise bad(f"metrics.auth.{missing}", "basic auth needs both metrics.auth.username and metrics.auth.password")
    if auth.username is not None and ":" in auth.username:
        raise bad("metrics.auth.username", "must not contain ':' (basic auth separates user and password with it)")
    tls = metrics.tls
    if auth.protect_metrics and not auth.enabled and tls.client_ca_file is None:
        raise bad("metrics.auth.protect_metrics",
                  "needs credentials to check: set a password, a bearer_token or metrics.tls.client_ca_file")
    for name in ("cert_file", "key_file", "client_ca_file"):
        if getattr(tls, name) == "":
            raise bad(f"metrics.tls.{name}", "is empty: leave it out, or give a path")
    if (tls.cert_file is None) != (tls.key_file is None):
        missing = "key_file" if tls.key_file is None else "cert_file"
        raise bad(f"metrics.tls.{missing}", "HTTPS needs both metrics.tls.cert_file and metrics.tls.key_file")
    if tls.client_ca_file is not None and not tls.enabled:
        raise bad("metrics.tls.client_ca_file", "client certificates need HTTPS: set metrics.tls.cert_file and key_file")
    if tls.enabled:
        # Here, not when the server starts: a config that names a missing file or a key
        # of another certificate fails `tidebatch config check` and the start alike.
        from pipeline.ops.http_tls import server_context

        server_context(tls, bad)
