"""Redis with AUTH and TLS for real (docs/REDIS.md "AUTH and TLS"): a private
redis-server with an ACL user (the `default` user off), a TLS port only (plain port
off) and client certificates required, all generated here (certs.py).

- A worker scores end to end through it: features looked up, scores stored, copies
  flagged (the same check as on the plain server, redis_helpers.score_twins_end_to_end).
- A wrong password: one ERROR line, readiness false, retries without a line each; the
  server accepting that password (a rotation) brings it back without a restart.
- An untrusted server certificate, or none of the client's: one line naming TLS.
- No password, from the `password` key or from the URL, shows in anything the worker
  prints or serves, nor in `tidebatch status`.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry

from pipeline.redisio.config import RedisConfig
from pipeline.redisio.link import RedisLink
from pipeline.redisio.metrics import register_redis_metrics
from tests.integration.certs import CertFiles, make_ca, make_cert
from tests.integration.opsutil import (
    REPO,
    get_json,
    http_get,
    make_topics,
    start_worker_process,
    wait_for,
    wait_ready,
)
from tests.integration.redis_helpers import metric, score_twins_end_to_end
from tests.integration.redis_server import RedisServer, redis_server

USER = "tidebatch"
PASSWORD = "XredisRight91"  # the server's; distinct strings say which path leaked
VIA_URL = "XredisViaUrl92"
VIA_KEY = "XredisViaKey93"
SECRETS = (PASSWORD, VIA_URL, VIA_KEY)


@dataclass(frozen=True)
class Pki:
    server: CertFiles
    client: CertFiles
    other_ca: CertFiles  # a CA that signed nothing of this server's


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    ca = make_ca(root)
    return Pki(
        server=make_cert(ca, root, "redis", ["127.0.0.1", "localhost"]),
        client=make_cert(ca, root, "tidebatch-worker"),
        other_ca=make_ca(root / "other", "other-ca"),
    )


@pytest.fixture
def secured_redis(tmp_path: Path, pki: Pki) -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not on PATH (scripts/ensure_redis.sh installs it)")
    with redis_server(tmp_path / "redis", user=USER, password=PASSWORD, tls=pki.server, client_tls=pki.client) as server:
        yield server


def _leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


def test_a_worker_scores_through_redis_with_an_acl_user_on_tls_only(
    broker, topic_factory, unique_group_id, secured_redis: RedisServer, tmp_path: Path, caplog
) -> None:
    caplog.set_level(logging.DEBUG)
    # Really secured: no plain text, no anonymous user, no client without a certificate.
    with pytest.raises(redis.ConnectionError):
        secured_redis.client(ssl=False, socket_timeout=2).ping()
    with pytest.raises(redis.AuthenticationError):
        secured_redis.client(username=None, password=None, socket_timeout=2).ping()
    with pytest.raises(redis.ConnectionError):
        secured_redis.client(ssl_certfile=None, ssl_keyfile=None, socket_timeout=2).ping()

    registry = score_twins_end_to_end(broker, topic_factory, unique_group_id, secured_redis, tmp_path)
    assert metric(registry, "tidebatch_redis_outages_total") == 0
    assert not _leaks(caplog.text), _leaks(caplog.text)


def _reconnect_errors(url: str) -> float:
    text = http_get(url + "/metrics")[2]
    m = re.search(r'^tidebatch_redis_errors_total\{op="reconnect"\} (\S+)$', text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


def _status(url: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "status", url, "--interval", "0.5"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    return done.stdout + done.stderr


def test_a_wrong_password_is_one_line_not_ready_and_recovers_when_the_server_accepts_it(
    broker, topic_factory, unique_group_id, secured_redis: RedisServer, pki: Pki, tmp_path: Path
) -> None:
    topics = make_topics(topic_factory, 1)
    # The URL carries one wrong password, the `password` key another (it wins): neither
    # may show anywhere.
    url = secured_redis.url.replace("rediss://", f"rediss://{USER}:{VIA_URL}@")
    worker = start_worker_process(
        broker, topics, unique_group_id, tmp_path, "worker",
        TIDEBATCH_REDIS__URL=url, TIDEBATCH_REDIS__PASSWORD=VIA_KEY,
        TIDEBATCH_REDIS__TLS_CA_FILE=str(pki.server.ca),
        TIDEBATCH_REDIS__TLS_CERT_FILE=str(pki.client.cert), TIDEBATCH_REDIS__TLS_KEY_FILE=str(pki.client.key),
        TIDEBATCH_REDIS__FEATURES__ENABLED="true", TIDEBATCH_REDIS__STORE__ENABLED="true",
        TIDEBATCH_REDIS__DEDUP__ENABLED="true",
        TIDEBATCH_REDIS__BACKOFF_MAX_S="0.2",  # many retries quickly: none may log a line
    )
    served: dict[str, str] = {}
    try:
        def only_redis_unready() -> dict | None:
            try:
                status, body = get_json(worker.url + "/readyz")
            except OSError:
                return None
            reasons = body.get("reasons", [])
            return body if status == 503 and reasons and all(r.startswith("redis: auth") for r in reasons) else None

        body = wait_for(only_redis_unready, 90, f"/readyz failing on the password alone\n{worker.log_tail()}")
        assert body["checks"]["redis"]["up"] is False
        assert f"user '{USER}' at rediss://{USER}:***@127.0.0.1:{secured_redis.port}/0" in body["reason"]
        wait_for(lambda: _reconnect_errors(worker.url) >= 5, 60, "five failed reconnect attempts")
        served = {path: http_get(worker.url + path)[2] for path in ("/readyz", "/api/stats", "/", "/metrics")}
        served["tidebatch status (unready)"] = _status(worker.url)

        # Rotation: the server now accepts the password the worker has.
        secured_redis.client().execute_command("ACL", "SETUSER", USER, f">{VIA_KEY}")
        ready = wait_ready(worker.url, timeout=60)
        assert ready["checks"]["redis"] == {"up": True, "problem": None}
        served["/readyz (ready)"] = http_get(worker.url + "/readyz")[2]
        served["tidebatch status (ready)"] = _status(worker.url)
    finally:
        code = worker.stop()
    printed = worker.log_path.read_text(errors="replace")
    assert code == 0, worker.log_tail()
    auth_lines = [line for line in printed.splitlines() if "authentication failed" in line]
    assert len(auth_lines) == 1, auth_lines
    assert "ERROR" in auth_lines[0] and "wrong password or unknown user" in auth_lines[0]
    assert not re.search(r"redis at \S+ unavailable", printed), "an auth failure was also logged as an outage"
    assert re.search(r"redis at \S+ is back after", printed), worker.log_tail()
    assert not _leaks(printed), f"worker printed a password: {_leaks(printed)}"
    for where, text in served.items():
        assert not _leaks(text), f"{where} showed a password: {_leaks(text)}"


@pytest.mark.parametrize("case", ["untrusted server certificate", "no client certificate"])
def test_a_tls_failure_is_one_line_naming_tls(case: str, secured_redis: RedisServer, pki: Pki, caplog) -> None:
    caplog.set_level(logging.INFO, logger="pipeline.redisio.link")
    keys = {**secured_redis.redis_section(), "backoff_max_s": 0.1}
    if case == "untrusted server certificate":
        keys["tls_ca_file"], reason = str(pki.other_ca.cert), "CERTIFICATE_VERIFY_FAILED"
    else:
        del keys["tls_cert_file"], keys["tls_key_file"]
        reason = "CERTIFICATE_REQUIRED"  # the server's alert, on the attempts that read it
    registry = CollectorRegistry()
    link = RedisLink(RedisConfig(**keys), register_redis_metrics(registry)).start()
    try:
        wait_for(lambda: link.problem and metric(registry, "tidebatch_redis_errors_total", {"op": "reconnect"}) >= 5,
                 30, "a TLS problem and five failed reconnect attempts")
        assert not link.up
    finally:
        link.close()
    records = [r for r in caplog.records if r.name == "pipeline.redisio.link"]
    errors = [r.getMessage() for r in records if r.levelname == "ERROR"]
    assert len(errors) == 1 and len(records) <= 2, [r.getMessage() for r in records]  # at most a WARNING before it
    assert errors[0].startswith(f"redis: TLS handshake with {secured_redis.url} failed"), errors[0]
    assert reason in errors[0] and "redis.tls_ca_file" in errors[0] and "redis.tls_cert_file" in errors[0]
    assert not _leaks(caplog.text)


def test_requirepass_without_an_acl_user(tmp_path: Path) -> None:
    """The other common set-up: one password for the `default` user, no TLS."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not on PATH (scripts/ensure_redis.sh installs it)")
    with redis_server(tmp_path / "redis", password=PASSWORD) as server:
        for password, up in ((PASSWORD, True), (VIA_KEY, False)):
            link = RedisLink(RedisConfig(url=server.url, password=password), register_redis_metrics(CollectorRegistry()))
            try:
                link.start()
                assert link.up is up
                if up:
                    assert link.problem is None
                else:
                    assert link.problem.startswith("redis: authentication failed for user 'default'")
            finally:
                link.close()
