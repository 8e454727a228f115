"""A real worker (`tidebatch run`, against Apache Kafka) with HTTPS on its ops port
(metrics.tls) and credentials on every endpoint but the probes (metrics.auth with
protect_metrics), read by a real `tidebatch status` process: with the right
credentials and CA it reports the pipeline OK; without credentials, with wrong ones,
or without the CA it is one line and exit 2, never a traceback, never a secret. The
probes answer over HTTPS without credentials, as the kubelet sends none. Config
validation of the files is tests/unit/test_http_tls.py."""

from __future__ import annotations

import json
import os
import re
import ssl
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.certs import CertFiles, make_ca, make_cert
from tests.integration.opsutil import (
    REPO,
    Topics,
    WorkerProcess,
    get_json,
    http_get,
    start_worker_process,
    wait_ready,
)

OPS_PASSWORD = "XopsHttpsPassword91"
OPS_TOKEN = "XopsHttpsToken92"


class HttpsWorker:
    def __init__(self, proc: WorkerProcess, ca: CertFiles, token_file: Path, client: CertFiles,
                 stranger: CertFiles) -> None:
        self.proc, self.ca, self.token_file = proc, ca, token_file
        self.client = client  # signed by the CA in metrics.tls.client_ca_file
        self.stranger = stranger  # signed by another CA
        self.trust = ssl.create_default_context(cafile=str(ca.cert))


@pytest.fixture(scope="module")
def https_worker(kafka_broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpsWorker]:
    """One worker for the module (start-up and the group join cost seconds on 2 cores)."""
    d = tmp_path_factory.mktemp("ops-https")
    ca = make_ca(d / "pki")
    server = make_cert(ca, d / "pki", "ops", ["127.0.0.1", "localhost"])
    client = make_cert(ca, d / "pki", "status-client")
    stranger = make_cert(make_ca(d / "other-pki", "other-ca"), d / "other-pki", "stranger")
    token_file = d / "ops-token"
    token_file.write_text(OPS_TOKEN + "\n")
    suffix = uuid.uuid4().hex[:10]
    names = {f"ops-https-req-{suffix}": 1, f"ops-https-res-{suffix}": 1,
             f"ops-https-dlq-{suffix}": 1, f"ops-https-late-{suffix}": 1}
    kafka_broker.create_topics(names)
    proc = start_worker_process(
        kafka_broker, Topics(*names), f"ops-https-{suffix}", d, "worker",
        TIDEBATCH_METRICS__TLS__CERT_FILE=str(server.cert),
        TIDEBATCH_METRICS__TLS__KEY_FILE=str(server.key),
        TIDEBATCH_METRICS__TLS__CLIENT_CA_FILE=str(ca.cert),
        TIDEBATCH_METRICS__AUTH__USERNAME="ops",
        TIDEBATCH_METRICS__AUTH__PASSWORD="${OPS_TEST_PW}",
        OPS_TEST_PW=OPS_PASSWORD,
        TIDEBATCH_METRICS__AUTH__BEARER_TOKEN=f"@file:{token_file}",
        TIDEBATCH_METRICS__AUTH__PROTECT_METRICS="true",
    )
    worker = HttpsWorker(proc, ca, token_file, client, stranger)
    try:
        assert proc.url.startswith("https://")
        wait_ready(proc.url, timeout=90, context=worker.trust)
        yield worker
    finally:
        code = proc.stop()
        printed = proc.log_path.read_text(errors="replace")
        kafka_broker.delete_topics(list(names))
        assert code == 0, proc.log_tail()
        assert OPS_PASSWORD not in printed and OPS_TOKEN not in printed


def _status(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "status", "--interval", "0.5", *args],
        cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})},
    )


def _no_leak(done: subprocess.CompletedProcess) -> None:
    out = done.stdout + done.stderr
    assert "Traceback" not in out, out
    assert OPS_PASSWORD not in out and OPS_TOKEN not in out


def test_the_worker_serves_https_and_its_probes_need_no_credentials(https_worker: HttpsWorker) -> None:
    url, trust = https_worker.proc.url, https_worker.trust
    assert get_json(url + "/healthz", trust)[0] == 200
    code, body = get_json(url + "/readyz", trust)
    assert code == 200 and body["ready"] is True
    # protect_metrics: /metrics too needs credentials, and the bearer token opens it.
    assert http_get(url + "/metrics", context=trust)[0] == 401
    code, _, text = http_get(url + "/metrics", headers={"Authorization": f"Bearer {OPS_TOKEN}"}, context=trust)
    assert code == 200 and "tidebatch_ready" in text
    # Plain HTTP on the port gets no answer, and the server goes on serving HTTPS.
    plain = "http://" + url.split("://", 1)[1]
    with pytest.raises(OSError):
        http_get(plain + "/healthz")
    assert get_json(url + "/healthz", trust)[0] == 200
    printed = https_worker.proc.log_path.read_text(errors="replace")
    assert f"tidebatch worker metrics: {url}/metrics" in printed
    assert f"ops endpoints on {url} " in printed
    assert "Traceback" not in printed and "over plain HTTP" not in printed


def test_status_reads_the_worker_with_a_token_or_basic_auth(https_worker: HttpsWorker) -> None:
    url, ca = https_worker.proc.url, str(https_worker.ca.cert)
    done = _status(url, "--ca-file", ca, "--token", f"@file:{https_worker.token_file}")
    _no_leak(done)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[1].split()[0] == "ctr" and done.stdout.rstrip().endswith("OK"), done.stdout

    done = _status(url + "/metrics", "--json", "--ca-file", ca, "--username", "ops", "--password", "${OPS_PW}",
                   env={"OPS_PW": OPS_PASSWORD})
    _no_leak(done)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True and report["down"] == {}
    (ctr,) = report["pipelines"]
    assert (ctr["pipeline"], ctr["workers_up"], ctr["verdict"], ctr["assigned"]) == ("ctr", 1, "OK", 1)


@pytest.mark.parametrize(("args", "expect"), [
    ((), r"^worker https://127\.0\.0\.1:\d+/metrics needs credentials \(it takes basic or bearer or "
         r"client-certificate auth\): give --token, --username and --password \(each may be .*, or --cert-file"),
    (("--token", "XwrongToken93"), r"^worker https://\S+ refused the credentials given \(HTTP 401, it takes "
                                   r"basic or bearer or client-certificate auth\): check"),
    (("--username", "ops", "--password", "XwrongPassword94"), r"^worker https://\S+ refused the credentials given"),
])
def test_status_without_the_right_credentials_is_one_line(https_worker: HttpsWorker, args: tuple, expect: str) -> None:
    done = _status(https_worker.proc.url, "--ca-file", str(https_worker.ca.cert), *args)
    _no_leak(done)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert re.search(expect, line.removeprefix("tidebatch: error: ")), line
    assert "XwrongToken93" not in line and "XwrongPassword94" not in line


def test_status_reads_the_worker_with_a_client_certificate(https_worker: HttpsWorker) -> None:
    client = https_worker.client
    done = _status(https_worker.proc.url, "--json", "--ca-file", str(https_worker.ca.cert),
                   "--cert-file", str(client.cert), "--key-file", str(client.key))
    _no_leak(done)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["pipelines"][0]["verdict"] == "OK"
    # The probes stay open to a client without a certificate (the kubelet's).
    assert get_json(https_worker.proc.url + "/readyz", https_worker.trust)[0] == 200


def test_status_with_a_certificate_of_another_ca_is_one_line(https_worker: HttpsWorker) -> None:
    stranger = https_worker.stranger
    done = _status(https_worker.proc.url, "--ca-file", str(https_worker.ca.cert),
                   "--cert-file", str(stranger.cert), "--key-file", str(stranger.key))
    _no_leak(done)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "refused the client certificate" in line, line


def test_status_without_the_ca_or_with_the_wrong_scheme(https_worker: HttpsWorker) -> None:
    url, token = https_worker.proc.url, f"@file:{https_worker.token_file}"
    done = _status(url, "--token", token)
    _no_leak(done)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "its certificate does not verify" in line and "--ca-file" in line, line

    # http:// to the HTTPS port: this worker is down as far as plain HTTP goes, with why.
    plain = "http://" + url.split("://", 1)[1]
    done = _status(plain, "--token", token, "--json")
    _no_leak(done)
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert list(report["down"]) == [plain + "/metrics"]
    assert "https://" in report["down"][plain + "/metrics"], report["down"]
