"""A configured Kafka secret never shows: not in what the worker or `produce` print,
not in /api/stats, not on the dashboard; nor do the credentials of the worker's own
endpoints (metrics.auth), which guard /api/stats and the dashboard here. The secrets ride on a PLAINTEXT listener, where
librdkafka ignores them, so every client still connects and the worker scores requests:
the settings reached real clients and the run did everything it prints on.

Secrets are kept out by what they are (issue 44), not by a word in their key: a client
private key given inline (`ssl.key.pem`, a real one), its certificate, an OAUTHBEARER
config and a SASL user name, at DEBUG with librdkafka's `debug=conf` on, which makes
librdkafka itself print every setting it does not mark sensitive (the certificate among
them) at each client's start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.integration.certs import make_ca, make_cert
from tests.integration.opsutil import (
    REPO,
    ResultCollector,
    http_get,
    make_topics,
    start_worker_process,
    wait_for,
    wait_ready,
)

# Distinct per source, so a leak says which path leaked.
FROM_X = "XsecretViaFlag71"
FROM_ENV = "XsecretViaEnv72"
FROM_FILE = "XsecretViaFile73"
FROM_PRODUCE = "XsecretViaProduce74"
OPS_PASSWORD = "XsecretOpsPassword75"
OPS_TOKEN = "XsecretOpsToken76"
OAUTH_CONFIG = "principal=XsecretOauthPrincipal77 scope=XsecretOauthScope78"
SASL_USER = "XsecretSaslUser79"
SECRETS = [FROM_X, FROM_ENV, FROM_FILE, FROM_PRODUCE, OPS_PASSWORD, OPS_TOKEN, "XsecretOauthPrincipal77",
           "XsecretOauthScope78", SASL_USER]


def _leaks(text: str) -> list[str]:
    return [s[:40] for s in SECRETS if s in text]


def _pem_secrets(tmp_path: Path) -> tuple[str, str]:
    """A real client key and certificate, inline PEM text; each long line of the key
    joins SECRETS (a line of a key is a leak too), and the certificate body's first."""
    ca = make_ca(tmp_path / "ca")
    client = make_cert(ca, tmp_path / "client", "client", common_name="tidebatch-client")
    key, cert = client.key.read_text(), client.cert.read_text()
    for pem in (key, cert):
        body = [line for line in pem.splitlines() if not line.startswith("-----")]
        SECRETS.extend(body[:-1] if pem is key else body[:1])
    return key, cert


def test_no_configured_secret_is_printed_or_served(
    kafka_broker, kafka_topic_factory, unique_group_id: str, tmp_path: Path
) -> None:
    topics = make_topics(kafka_topic_factory, 2)
    secret_file = tmp_path / "admin-secret"
    secret_file.write_text(FROM_FILE + "\n")
    token_file = tmp_path / "ops-token"
    token_file.write_text(OPS_TOKEN + "\n")
    key_pem, cert_pem = _pem_secrets(tmp_path)
    worker = start_worker_process(
        kafka_broker, topics, unique_group_id, tmp_path, "worker",
        args=("--log-level", "DEBUG", "-X", "security.protocol=PLAINTEXT", "-X", f"ssl.key.password={FROM_X}",
              "-X", f"ssl.key.pem={key_pem}", "-X", f"ssl.certificate.pem={cert_pem}",
              "-X", f"sasl.oauthbearer.config={OAUTH_CONFIG}", "-X", f"sasl.username={SASL_USER}",
              "-X", "debug=conf"),
        # The env var names a reference, resolved from KAFKA_TEST_PW: both paths at once.
        TIDEBATCH_KAFKA__PRODUCER__SASL_PASSWORD="${KAFKA_TEST_PW}",
        KAFKA_TEST_PW=FROM_ENV,
        TIDEBATCH_KAFKA__ADMIN__SSL_KEYSTORE_PASSWORD=f"@file:{secret_file}",
        TIDEBATCH_CREATE_TOPICS="true",  # the admin client runs, with its settings
        # Every interface, as in a pod, with the endpoints' own credentials.
        TIDEBATCH_METRICS__HOST="0.0.0.0",
        TIDEBATCH_METRICS__AUTH__USERNAME="ops",
        TIDEBATCH_METRICS__AUTH__PASSWORD="${OPS_TEST_PW}",
        OPS_TEST_PW=OPS_PASSWORD,
        TIDEBATCH_METRICS__AUTH__BEARER_TOKEN=f"@file:{token_file}",
    )
    results = ResultCollector(kafka_broker.bootstrap_servers, topics.output)
    try:
        wait_ready(worker.url, timeout=90)
        produced = subprocess.run(
            [sys.executable, "-m", "pipeline.cli", "produce", "ctr", "--bootstrap-servers",
             kafka_broker.bootstrap_servers, "--topic", topics.input, "--partitions", "2", "--count", "200", "--rate", "2000",
             "--quiet", "-X", f"sasl.password={FROM_PRODUCE}", "-X", f"ssl.key.pem={key_pem}",
             "--log-level", "DEBUG", "--log-format", "json", "-X", "debug=conf"],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )
        assert produced.returncode == 0, produced.stdout + produced.stderr
        wait_for(lambda: len(results.counts) >= 200, 90, "200 results")
        bearer = {"Authorization": f"Bearer {OPS_TOKEN}"}
        refused = {path: http_get(worker.url + path)[0] for path in ("/api/stats", "/")}
        served = {path: http_get(worker.url + path, headers=bearer)[2] for path in ("/api/stats", "/", "/metrics")}
    finally:
        code = worker.stop()
        results.close()
    printed = worker.log_path.read_text(errors="replace")
    assert "kafka client settings" in printed and "***" in printed, printed[-2000:]
    # librdkafka did print its settings (so the check below reads real debug output).
    assert "ssl.certificate.pem" in printed or "Client configuration" in printed, printed[:3000]
    assert code == 0, worker.log_tail()
    assert refused == {"/api/stats": 401, "/": 401}
    assert '"scored"' in served["/api/stats"], "the token was accepted: the leak check reads the real page"
    assert "auth needed on all but /healthz /readyz /metrics" in printed
    assert not _leaks(printed), f"worker printed a secret: {_leaks(printed)}"
    assert not _leaks(produced.stdout + produced.stderr)
    for path, body in served.items():
        assert not _leaks(body), f"{path} served a secret: {_leaks(body)}"
