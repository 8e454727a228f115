"""How `tidebatch status` (pipeline/ops/status_report.py) reads a worker's ops endpoints,
or Prometheus: with the credentials and the CA it was given.

    --username ops --password '${OPS_PASSWORD}'     # basic auth
    --token @file:/var/run/secrets/tidebatch/ops-token   # bearer
    --ca-file /etc/tidebatch/tls/ca.crt             # trust for https:// workers
    --cert-file me.crt --key-file me.key            # a client certificate (client_ca_file)

A secret is resolved like the worker's own (consumers/client_settings.resolve_secret):
`${VAR}` from the environment, `@file:/path` from the file, else the text itself (which
`ps` shows: prefer a reference). It is sent only in the Authorization header and never
printed. Errors a user fixes (a 401, a certificate that does not verify, a scheme the
port does not speak) are one line (UserError); a worker that does not answer is not an
error here but a `down` entry of the report, so other workers are still judged.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

from consumers.client_settings import resolve_secret
from pipeline.errors import UserError
from pipeline.ops.http_tls import PairError, load_pair

TIMEOUT_S = 3.0
_HOW = ("give --token, --username and --password (each may be '${VAR}' or @file:/path), "
        "or --cert-file and --key-file")


# OpenSSL's names for the TLS alerts a server sends about a client's certificate.
_CERT_ALERTS = frozenset({
    "TLSV1_ALERT_UNKNOWN_CA", "SSLV3_ALERT_BAD_CERTIFICATE", "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED", "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE", "TLSV13_ALERT_CERTIFICATE_REQUIRED",
})


class Unreachable(Exception):
    """The endpoint did not answer usefully: its one-line reason is the message."""


@dataclass(frozen=True, repr=False)
class OpsClient:
    """`authorization`: the header value, or None; `tls`: the context for https://;
    `client_cert`: `tls` presents a client certificate."""

    authorization: str | None = None
    tls: ssl.SSLContext | None = None
    client_cert: bool = False

    def __repr__(self) -> str:  # never the credentials
        scheme = self.authorization.split(" ", 1)[0] if self.authorization else None
        return f"OpsClient(auth={scheme!r}, tls={self.tls is not None}, client_cert={self.client_cert})"

    @classmethod
    def from_options(
        cls,
        username: str | None = None,
        password: str | None = None,
        token: str | None = None,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> OpsClient:
        env = os.environ if environ is None else environ
        if token is not None and (username is not None or password is not None):
            raise UserError("give --token or --username/--password, not both")
        if (username is None) != (password is None):
            raise UserError("basic auth needs both --username and --password")
        authorization = None
        if token is not None:
            authorization = "Bearer " + _secret("--token", token, env)
        elif username is not None and password is not None:
            if ":" in username:
                raise UserError("--username must not contain ':' (basic auth separates user and password with it)")
            pair = f"{username}:{_secret('--password', password, env)}"
            authorization = "Basic " + base64.b64encode(pair.encode()).decode()
        if (cert_file is None) != (key_file is None):
            raise UserError("a client certificate needs both --cert-file and --key-file")
        tls = None if ca_file is None else trust(ca_file)
        if cert_file is not None and key_file is not None:
            tls = tls or ssl.create_default_context()
            _present(tls, cert_file, key_file)
        return cls(authorization, tls, cert_file is not None)

    def get(self, url: str, what: str, timeout: float = TIMEOUT_S) -> str:
        """The body of a 200 answer. `what` names the endpoint in errors ("worker URL").
        Raises UserError for what the user must fix, Unreachable otherwise."""
        headers = {"Authorization": self.authorization} if self.authorization else {}
        request = urllib.request.Request(url, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=self.tls) as resp:
                return resp.read().decode()
        except urllib.error.HTTPError as exc:
            if exc.code == 401:
                raise UserError(self._refused(what, url, _schemes(exc))) from None
            raise Unreachable(f"HTTP {exc.code} {exc.reason}") from None
        except urllib.error.URLError as exc:
            raise _why(what, url, exc.reason) from None
        except (OSError, http.client.HTTPException) as exc:
            raise _why(what, url, exc) from None

    def _refused(self, what: str, url: str, schemes: list[str]) -> str:
        takes = f"it takes {' or '.join(schemes)} auth" if schemes else "HTTP 401"
        if self.authorization is None and not self.client_cert:
            return f"{what} {url} needs credentials ({takes}): {_HOW}"
        return f"{what} {url} refused the credentials given (HTTP 401, {takes}): check them; {_HOW}"


def trust(ca_file: str) -> ssl.SSLContext:
    """A client context that trusts `ca_file`'s certificates (and checks host names)."""
    try:
        return ssl.create_default_context(cafile=ca_file)
    except FileNotFoundError:
        raise UserError(f"--ca-file {ca_file}: no such file") from None
    except OSError as exc:  # ssl.SSLError included
        detail = exc.strerror if not isinstance(exc, ssl.SSLError) else "holds no PEM certificate"
        raise UserError(f"--ca-file {ca_file}: {detail}") from None


def _present(ctx: ssl.SSLContext, cert_file: str, key_file: str) -> None:
    """The client certificate sent in the handshake; errors name the files only."""
    try:
        load_pair(ctx, cert_file, key_file)
    except PairError as exc:
        option, path = ("--cert-file", cert_file) if exc.which == "cert" else ("--key-file", key_file)
        raise UserError(f"{option} {path}: {exc.why.replace('the certificate', '--cert-file')}") from None


def _schemes(exc: urllib.error.HTTPError) -> list[str]:
    """What a 401 says it takes: a tidebatch worker lists every scheme in its body
    (a client certificate has no WWW-Authenticate challenge); else the challenges."""
    try:
        listed = json.loads(exc.read() or b"{}").get("schemes")
    except (ValueError, AttributeError, OSError):
        listed = None
    if isinstance(listed, list) and all(isinstance(x, str) for x in listed):
        return listed
    return [c.split(" ", 1)[0].lower() for c in exc.headers.get_all("WWW-Authenticate") or []]


def _secret(option: str, value: str, env: Mapping[str, str]) -> str:
    text = resolve_secret(option, value, env, what="option")
    if not text:  # an empty token sends "Bearer ", which no worker accepts
        raise UserError(f"option {option}: resolves to an empty value")
    return text


def _why(what: str, url: str, reason: object) -> Exception:
    """A transport failure: UserError for TLS mistakes, else Unreachable."""
    if isinstance(reason, ssl.SSLCertVerificationError):
        return UserError(f"{what} {url}: its certificate does not verify ({reason.verify_message}): "
                         "give the CA that signed it with --ca-file")
    if isinstance(reason, ssl.SSLError) and reason.reason in _CERT_ALERTS:
        # An alert the server sent about the certificate this client presented.
        return UserError(f"{what} {url} refused the client certificate ({reason.reason}): give one that the CA "
                         "in its metrics.tls.client_ca_file signed")
    if isinstance(reason, ssl.SSLError) and reason.reason == "WRONG_VERSION_NUMBER":
        return UserError(f"{what} {url} does not speak TLS: use http://")
    if isinstance(reason, http.client.HTTPException | ConnectionResetError) and url.startswith("http://"):
        return Unreachable(f"no HTTP answer ({type(reason).__name__}); an https:// port?")
    text = str(getattr(reason, "strerror", None) or reason) or type(reason).__name__
    return Unreachable(text)
