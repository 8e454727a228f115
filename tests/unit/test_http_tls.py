"""`metrics.tls` (HTTPS on the ops port) and the credentials of `tidebatch status`:
the config keys and their validation at load (pipeline/ops/http_config.py,
pipeline/ops/http_tls.py), the warning for credentials over plain HTTP, and the
status client's options (pipeline/ops/http_client.py). Serving over HTTPS against a
real worker is tests/integration/test_ops_https.py."""

from __future__ import annotations

import base64
import logging
import socket
import ssl
import struct
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.clock import FakeClock
from pipeline.config import load_config
from pipeline.errors import UserError
from pipeline.generation.ops import GenerateOpsView
from pipeline.ops.http import OpsServer
from pipeline.ops.http_auth import HttpAuth, cleartext_warning
from pipeline.ops.http_client import OpsClient
from pipeline.ops.http_config import HttpAuthConfig, HttpTlsConfig, MetricsConfig
from pipeline.ops.http_tls import server_context
from tests.integration.certs import CertFiles, encrypt_key, make_ca, make_cert
from tests.unit.test_generation_loop import Producer, _loop, decoder  # noqa: F401 (fixture)

PASSWORD = "pw-Tq4LmX9c"
TOKEN = "tok-Hs7Wn2Pk"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CertFiles]:
    d = tmp_path_factory.mktemp("pki")
    ca = make_ca(d)
    return {"ca": ca, "server": make_cert(ca, d, "server", ["127.0.0.1"]), "other": make_cert(ca, d, "other")}


def _tls(cert: object, key: object, environ: dict | None = None):
    tls = {k: str(v) for k, v in (("cert_file", cert), ("key_file", key)) if v is not None}
    return load_config(overrides={"metrics": {"tls": tls}}, environ=environ or {})


# ----------------------------------------------------------------------------- config
def test_tls_is_off_by_default_and_on_with_both_files(pki) -> None:
    assert load_config(environ={}).metrics.tls == HttpTlsConfig()
    assert not load_config(environ={}).metrics.tls.enabled
    server = pki["server"]
    cfg = _tls(server.cert, server.key)
    assert cfg.metrics.tls.enabled and cfg.metrics.tls.cert_file == str(server.cert)
    assert isinstance(server_context(cfg.metrics.tls, lambda k, w: UserError(w)), ssl.SSLContext)


def test_tls_from_the_environment(pki) -> None:
    server = pki["server"]
    env = {"TIDEBATCH_METRICS__TLS__CERT_FILE": str(server.cert), "TIDEBATCH_METRICS__TLS__KEY_FILE": str(server.key)}
    tls = load_config(environ=env).metrics.tls
    assert (tls.cert_file, tls.key_file) == (str(server.cert), str(server.key))


@pytest.mark.parametrize(("cert", "key", "message"), [
    ("server.cert", None, r"'metrics.tls.key_file': HTTPS needs both metrics.tls.cert_file and metrics.tls.key_file"),
    (None, "server.key", r"'metrics.tls.cert_file': HTTPS needs both"),
    ("", "server.key", r"'metrics.tls.cert_file': is empty"),
    ("missing.crt", "server.key", r"'metrics.tls.cert_file': .*/missing.crt: cannot read it: No such file or directory$"),
    ("server.cert", "missing.key", r"'metrics.tls.key_file': .*/missing.key: cannot read it: No such file or directory$"),
    ("server.cert", "other.key", r"'metrics.tls.key_file': .*/other.key: is not the key of the certificate in "
                                 r"metrics.tls.cert_file$"),
    ("server.key", "server.key", r"'metrics.tls.cert_file': .*/server.key: holds no PEM certificate$"),
    ("server.cert", "server.cert", r"'metrics.tls.key_file': .*/server.crt: holds no PEM private key$"),
    ("server.cert", "encrypted", r"'metrics.tls.key_file': .*/server-encrypted.key: is encrypted: give the key "
                                 r"unencrypted"),
])
def test_tls_files_are_checked_when_the_config_loads(pki, tmp_path: Path, cert: str, key: str, message: str) -> None:
    def path(spec: str | None) -> object:
        if spec in (None, ""):
            return spec
        if spec.startswith("missing"):
            return tmp_path / spec
        if spec == "encrypted":  # never prompts for the passphrase: refused at once
            return encrypt_key(pki["server"], tmp_path, "Xpassphrase1")
        name, attr = spec.split(".")
        return getattr(pki[name], attr)

    with pytest.raises(UserError, match=message) as err:
        _tls(path(cert), path(key))
    assert "\n" not in str(err.value) and "PRIVATE KEY" not in str(err.value)


@pytest.fixture
def root_logging() -> Iterator[None]:
    """The CLI reconfigures the root logger onto capsys's stderr (pipeline/observe/logs.py
    configure); put it back, or later tests log into a closed stream."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_config_check_and_run_refuse_a_key_of_another_certificate(pki, tmp_path: Path, capsys, root_logging) -> None:
    """Through the CLI: one line on stderr and exit 2, before `run` connects anywhere
    (its bootstrap address here is a port nothing listens on)."""
    config = tmp_path / "worker.yaml"
    config.write_text(f"bootstrap_servers: 127.0.0.1:9\nmetrics:\n  tls:\n    cert_file: {pki['server'].cert}\n"
                      f"    key_file: {pki['other'].key}\n")
    for argv in (["config", "check", "--no-env", str(config)], ["run", "--config", str(config)]):
        assert main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1, err
        assert err.startswith("tidebatch: error: config key 'metrics.tls.key_file': ") and "is not the key of" in err


# ----------------------------------------------------------------------------- client certificates
def test_client_certificates_from_a_ca_are_a_credential(pki) -> None:
    server = pki["server"]
    tls = {"cert_file": str(server.cert), "key_file": str(server.key), "client_ca_file": str(pki["ca"].cert)}
    # Alone they guard the endpoints, /metrics too with protect_metrics.
    cfg = load_config(overrides={"metrics": {"tls": tls, "auth": {"protect_metrics": True}}}, environ={})
    assert server_context(cfg.metrics.tls, lambda k, w: UserError(w)).verify_mode == ssl.CERT_OPTIONAL
    auth = HttpAuth.from_config(cfg.metrics.auth, environ={}, client_certs=True)
    assert auth is not None and auth.schemes() == ["client-certificate"] and auth.protects("/metrics")
    assert auth.allows(None, client_cert=True) and not auth.allows(None) and not auth.allows(f"Bearer {TOKEN}")
    assert auth.challenges() == []
    with_token = HttpAuth.from_config(HttpAuthConfig(bearer_token=TOKEN), environ={}, client_certs=True)
    assert with_token is not None and with_token.schemes() == ["bearer", "client-certificate"]
    assert with_token.allows(f"Bearer {TOKEN}") and with_token.allows("Bearer wrong", client_cert=True)
    without = HttpAuth.from_config(HttpAuthConfig(bearer_token=TOKEN), environ={})
    assert without is not None and not without.allows(None, client_cert=True), "no client_ca_file: a cert is nothing"
    assert server_context(_tls(server.cert, server.key).metrics.tls, lambda k, w: UserError(w)).verify_mode == (
        ssl.CERT_NONE)


@pytest.mark.parametrize(("tls", "message"), [
    ({"client_ca_file": "ca"}, r"'metrics.tls.client_ca_file': client certificates need HTTPS"),
    ({"cert_file": "server.cert", "key_file": "server.key", "client_ca_file": "not-pem"},
     r"'metrics.tls.client_ca_file': .*/not-pem.txt: holds no PEM certificate$"),
    ({"cert_file": "server.cert", "key_file": "server.key", "client_ca_file": "missing"},
     r"'metrics.tls.client_ca_file': .*/missing: cannot read it: No such file or directory$"),
])
def test_client_ca_file_validation(pki, tmp_path: Path, tls: dict, message: str) -> None:
    (tmp_path / "not-pem.txt").write_text("not a certificate\n")
    files = {"ca": pki["ca"].cert, "server.cert": pki["server"].cert, "server.key": pki["server"].key,
             "not-pem": tmp_path / "not-pem.txt", "missing": tmp_path / "missing"}
    with pytest.raises(UserError, match=message):
        load_config(overrides={"metrics": {"tls": {k: str(files[v]) for k, v in tls.items()}}}, environ={})


def test_protect_metrics_needs_some_credential() -> None:
    with pytest.raises(UserError, match=r"'metrics.auth.protect_metrics': needs credentials to check: set a password, "
                                        r"a bearer_token or metrics.tls.client_ca_file"):
        load_config(overrides={"metrics": {"auth": {"protect_metrics": True}}}, environ={})


def test_status_client_certificate_options(pki) -> None:
    other = pki["other"]
    client = OpsClient.from_options(ca_file=str(pki["ca"].cert), cert_file=str(other.cert), key_file=str(other.key),
                                    environ={})
    assert client.client_cert and client.tls is not None and client.authorization is None
    with pytest.raises(UserError, match=r"^a client certificate needs both --cert-file and --key-file$"):
        OpsClient.from_options(cert_file=str(other.cert), environ={})
    with pytest.raises(UserError, match=r"^--key-file .*/server.key: is not the key of --cert-file$"):
        OpsClient.from_options(cert_file=str(other.cert), key_file=str(pki["server"].key), environ={})
    with pytest.raises(UserError, match=r"^--cert-file /nonexistent.crt: cannot read it: No such file or directory$"):
        OpsClient.from_options(cert_file="/nonexistent.crt", key_file=str(other.key), environ={})


# ----------------------------------------------------------------------------- warning
def test_a_warning_when_credentials_would_cross_the_network_unencrypted(pki) -> None:
    auth = HttpAuth.from_config(HttpAuthConfig(bearer_token=TOKEN), environ={})
    tls = server_context(HttpTlsConfig(str(pki["server"].cert), str(pki["server"].key)), lambda k, w: UserError(w))
    warning = cleartext_warning("0.0.0.0", auth, None)
    assert warning is not None and "plain HTTP" in warning and "metrics.tls.cert_file" in warning
    assert TOKEN not in warning
    assert cleartext_warning("0.0.0.0", auth, tls) is None
    assert cleartext_warning("127.0.0.1", auth, None) is None
    assert cleartext_warning("0.0.0.0", None, None) is None  # exposure_warning's case, not this one


# ----------------------------------------------------------------------------- status client
def _decoded(client: OpsClient) -> str:
    assert client.authorization is not None and client.authorization.startswith("Basic ")
    return base64.b64decode(client.authorization.split()[1]).decode()


def test_status_credentials_from_text_env_and_file(tmp_path: Path) -> None:
    assert OpsClient.from_options().authorization is None
    assert _decoded(OpsClient.from_options("ops", PASSWORD, environ={})) == f"ops:{PASSWORD}"
    assert _decoded(OpsClient.from_options("ops", "${OPS_PW}", environ={"OPS_PW": PASSWORD})) == f"ops:{PASSWORD}"
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    client = OpsClient.from_options(token=f"@file:{token_file}", environ={})
    assert client.authorization == f"Bearer {TOKEN}"
    assert TOKEN not in repr(client) and repr(client) == "OpsClient(auth='Bearer', tls=False, client_cert=False)"


@pytest.mark.parametrize(("options", "message"), [
    ({"username": "ops"}, r"^basic auth needs both --username and --password$"),
    ({"password": PASSWORD}, r"^basic auth needs both"),
    ({"username": "ops", "password": PASSWORD, "token": TOKEN}, r"^give --token or --username/--password, not both$"),
    ({"username": "o:ps", "password": PASSWORD}, r"^--username must not contain ':'"),
    ({"token": "${OPS_TOKEN}"}, r"^option --token: environment variable OPS_TOKEN is not set$"),
    ({"token": "${EMPTY}"}, r"^option --token: resolves to an empty value$"),
    ({"username": "ops", "password": "@file:/nonexistent/pw"}, r"^option --password: cannot read /nonexistent/pw"),
    ({"ca_file": "/nonexistent/ca.crt"}, r"^--ca-file /nonexistent/ca.crt: no such file$"),
])
def test_status_credential_errors_are_one_line_without_the_secret(options: dict, message: str) -> None:
    with pytest.raises(UserError, match=message) as err:
        OpsClient.from_options(**options, environ={"EMPTY": ""})
    assert PASSWORD not in str(err.value) and TOKEN not in str(err.value)


def test_status_ca_file_must_hold_a_certificate(pki, tmp_path: Path) -> None:
    assert OpsClient.from_options(ca_file=str(pki["ca"].cert), environ={}).tls is not None
    not_pem = tmp_path / "ca.txt"
    not_pem.write_text("not a certificate\n")
    with pytest.raises(UserError, match=r"^--ca-file .*/ca.txt: holds no PEM certificate$"):
        OpsClient.from_options(ca_file=str(not_pem), environ={})


@pytest.fixture
def plain_http() -> Iterator[str]:
    """A plain HTTP server (stdlib) on a free loopback port: its host:port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"# nothing\n")

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_status_says_when_an_https_url_names_a_plain_http_port(plain_http: str) -> None:
    client = OpsClient.from_options(token=TOKEN, environ={})
    assert client.get(f"http://{plain_http}/metrics", "worker") == "# nothing\n"
    with pytest.raises(UserError, match=rf"^worker https://{plain_http}/metrics does not speak TLS: use http://$"):
        client.get(f"https://{plain_http}/metrics", "worker")


# ----------------------------------------------------------------------------- the server
def _server(decoder, metrics: MetricsConfig) -> OpsServer:  # noqa: F811
    """The ops server on the generate worker's view (no Kafka, no worker thread)."""
    view = GenerateOpsView(_loop(decoder, FakeClock(), Producer()), policy="continuous", group_id="g",
                           input_topic="in", provider="cpu", metrics_config=metrics)
    return OpsServer(view, port=0)


def _logged(caplog: pytest.LogCaptureFixture, text: str, timeout: float = 10.0) -> str:
    """The first log message containing `text`, polled for: the server thread logs it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [r.getMessage() for r in caplog.records if text in r.getMessage()]
        if found:
            return found[0]
        time.sleep(0.02)
    raise AssertionError(f"no log line with {text!r} within {timeout:g} s")


def test_https_server_survives_plain_http_quietly(decoder, pki, caplog, capfd) -> None:  # noqa: F811
    caplog.set_level(logging.DEBUG, logger="pipeline.ops.http")
    tls = HttpTlsConfig(str(pki["server"].cert), str(pki["server"].key))
    trust = ssl.create_default_context(cafile=str(pki["ca"].cert))
    with _server(decoder, MetricsConfig(tls=tls)) as server:
        assert server.url.startswith("https://127.0.0.1:")
        with pytest.raises(OSError):  # no HTTP answer on an HTTPS port
            urllib.request.urlopen(server.url.replace("https://", "http://") + "/healthz", timeout=5)
        assert "TLS handshake with 127.0.0.1 failed" in _logged(caplog, "TLS handshake")
        with urllib.request.urlopen(server.url + "/healthz", timeout=5, context=trust) as resp:
            assert resp.status == 200
    assert "Exception occurred during processing of request" not in capfd.readouterr().err  # socketserver's


def test_a_connection_reset_mid_request_is_a_debug_line_not_a_traceback(decoder, caplog, capfd) -> None:  # noqa: F811
    """socketserver printed a traceback to stderr for this (checked before the fix)."""
    caplog.set_level(logging.DEBUG, logger="pipeline.ops.http")
    with _server(decoder, MetricsConfig()) as server:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # headers not finished
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # linger 0: a reset, not a clean close
        _logged(caplog, "ops endpoints: connection from 127.0.0.1 failed")
    assert "Exception occurred during processing of request" not in capfd.readouterr().err  # socketserver's
