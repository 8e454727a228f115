"""The worker's ops endpoints against a real Worker on the embedded broker:
/healthz, /readyz (503 before assignment, 200 after), /metrics naming conventions and
`promtool check metrics`, /api/stats, the static files, and `tidebatch status`."""

from __future__ import annotations

import argparse
import base64
import json
import logging
import re
import shutil
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from email.message import Message

import pytest
from prometheus_client.parser import text_string_to_metric_families

from consumers.admin import delete_topics, ensure_topics
from pipeline.commands import status
from pipeline.ops import stats as S
from tests.integration.opsutil import (
    LiveWorker,
    ResultCollector,
    Topics,
    get_json,
    http_get,
    live_worker,
    make_topics,
    produce_ctr,
    wait_for,
    wait_ready,
    worker_config,
)


def test_readyz_is_503_until_partitions_are_assigned_then_200(broker, topic_factory, unique_group_id):
    topics = make_topics(topic_factory, 2)
    cfg = worker_config(broker, topics, unique_group_id)
    with live_worker(cfg, start=False) as live:
        # Server up, run() not started: alive (loading is no reason to restart) but not ready.
        code, body = get_json(live.url + "/readyz")
        assert code == 503
        assert body["ready"] is False
        assert "not started" in body["reason"]
        assert body["checks"]["assigned_partitions"] == []
        assert get_json(live.url + "/healthz")[0] == 200

        live.run()
        ready = wait_ready(live.url, timeout=60)
        assert sorted(ready["checks"]["assigned_partitions"]) == [f"{topics.input}[0]", f"{topics.input}[1]"]
        assert ready["checks"]["model_provider"]
        assert get_json(live.url + "/healthz") == (200, {"alive": True, "started": True, "stopping": False})
        assert _metric(live, "tidebatch_ready") == 1.0

        # Stopped: the source loop exits, so the process is neither alive nor ready.
        live.stop()
        code, body = get_json(live.url + "/healthz")
        assert code == 503 and "exited" in body["reason"]
        code, body = get_json(live.url + "/readyz")
        assert code == 503 and body["ready"] is False


@pytest.fixture(scope="module")
def busy_worker(broker) -> Iterator[tuple[LiveWorker, list[str]]]:
    """One worker that has scored a few hundred requests (module-scoped: start-up and
    the group join cost seconds on two cores). topic_factory is per test, so the
    topics are made and deleted here."""
    suffix = uuid.uuid4().hex[:10]
    names = {f"ops-http-req-{suffix}": 2, f"ops-http-res-{suffix}": 2,
             f"ops-http-dlq-{suffix}": 1, f"ops-http-late-{suffix}": 1}
    ensure_topics(broker.bootstrap_servers, names)
    topics = Topics(*names)
    cfg = worker_config(broker, topics, f"ops-http-{suffix}")
    try:
        with live_worker(cfg) as live:
            wait_ready(live.url)
            collector = ResultCollector(broker.bootstrap_servers, topics.output)
            try:
                ids = produce_ctr(broker.bootstrap_servers, topics.input, 300, seed=11)
                wait_for(lambda: not collector.missing(ids), 90, "results for all 300 requests")
            finally:
                collector.close()
            yield live, ids
    finally:
        delete_topics(broker.bootstrap_servers, list(names))


def _metric(live: LiveWorker, name: str) -> float | None:
    samples = S.from_text(http_get(live.url + "/metrics")[2])
    series = samples.get(name, {})
    return sum(series.values()) if series else None


def test_metrics_follow_the_naming_conventions(busy_worker):
    live, ids = busy_worker
    code, ctype, text = http_get(live.url + "/metrics")
    assert code == 200 and ctype.startswith("text/plain")
    families = list(text_string_to_metric_families(text))
    names = {f.name for f in families}
    for family in families:
        assert family.name.startswith("tidebatch_"), family.name
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples), family.name
        if family.type == "histogram" and re.search(r"latency|wait|time|duration|inference", family.name):
            assert family.name.endswith("_seconds"), f"{family.name}: durations are in seconds"
        assert not re.search(r"_(ms|milliseconds|us|bytes_kb|minutes)$", family.name), family.name
        for sample in family.samples:
            bad = {"request_id", "request", "id", "key", "user_id", "offset"} & set(sample.labels)
            assert not bad, f"{sample.name} has high-cardinality labels {bad}"
    for expected in ("tidebatch_records", "tidebatch_end_to_end_latency_seconds", "tidebatch_batch_rows",
                     "tidebatch_consumer_lag_messages", "tidebatch_pipeline_lag_messages",
                     "tidebatch_slo_seconds", "tidebatch_ready", "tidebatch_last_commit_timestamp_seconds"):
        assert expected in names, f"{expected} missing from /metrics"
    # Every request got exactly one outcome, and the histogram saw each scored one.
    assert _metric(live, "tidebatch_records_total") >= len(ids)
    assert _metric(live, "tidebatch_end_to_end_latency_seconds_count") >= len(ids)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: run scripts/ensure_prometheus.sh")
def test_promtool_check_metrics_accepts_a_live_worker(busy_worker):
    live, _ = busy_worker
    text = http_get(live.url + "/metrics")[2]
    proc = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "" and proc.stderr.strip() == "", "promtool lint findings:\n" + proc.stdout + proc.stderr


def test_api_stats_has_a_rolling_window_per_pipeline(busy_worker):
    live, _ = busy_worker

    def saw_the_requests() -> dict | None:
        # The sampler takes a point a second; the fixture can see all 300 results
        # before the next point counts them (4 of 6 runs did: a point with 0.0 as the
        # newest), so wait for the point, not for any two.
        _, doc = get_json(live.url + "/api/stats")
        ctr = doc["pipelines"].get("ctr")
        if not ctr or len(ctr["t"]) < 2:
            return None
        seen = [any(v is not None and v > 0 for v in ctr[k]) for k in ("throughput_rps", "batch_rows", "p99_ms")]
        return doc if all(seen) else None

    doc = wait_for(saw_the_requests, 30, "a stats point that counted the 300 requests")
    ctr = doc["pipelines"]["ctr"]
    for key in ("t", "throughput_rps", "p50_ms", "p99_ms", "batch_rows", "queue_rows", "lag"):
        assert len(ctr[key]) == len(ctr["t"]), key
    assert ctr["slo_ms"] == 100.0
    assert doc["worker"]["pipeline"] == "ctr" and doc["worker"]["ready"] is True
    assert len(doc["worker"]["assigned"]) == 2
    assert doc["worker"]["stats"]["scored"] >= 300
    assert doc["latest"]["ctr"]["lag"] == 0


def test_dashboard_files_are_served_and_nothing_else(busy_worker):
    live, _ = busy_worker
    code, ctype, html = http_get(live.url + "/")
    assert code == 200 and ctype.startswith("text/html")
    for src in re.findall(r'(?:src|href)="(/static/[^"]+)"', html):
        code, ctype, _ = http_get(live.url + src)
        assert code == 200, src
    assert http_get(live.url + "/static/../http.py")[0] == 404
    assert http_get(live.url + "/static/%2e%2e%2fhttp.py")[0] == 404
    assert http_get(live.url + "/nope")[0] == 404


def test_status_command_reads_live_workers(busy_worker, capsys):
    live, _ = busy_worker
    parser = argparse.ArgumentParser()
    status.add_parser(parser.add_subparsers())
    args = parser.parse_args(["status", live.url, "http://127.0.0.1:9/metrics", "--interval", "1.5", "--json"])
    code = args.func(args)
    report = json.loads(capsys.readouterr().out)
    (ctr,) = report["pipelines"]
    assert ctr["pipeline"] == "ctr" and ctr["workers_up"] == 1
    assert ctr["verdict"] == "OK", ctr
    assert ctr["slo_ms"] == 100.0 and ctr["assigned"] == 2 and ctr["lag"] == 0
    assert list(report["down"]) == ["http://127.0.0.1:9/metrics"]
    assert code == 1  # a worker URL that does not answer makes the whole answer non-zero

    args = parser.parse_args(["status", live.url, "--interval", "0.5"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:2] == ["PIPELINE", "WORKERS"]
    assert re.search(r"^ctr\s+1 \(1 ready\)\s.*\bOK$", out, re.M), out


# ----------------------------------------------------------------------------- metrics.auth
OPS_PASSWORD = "XopsPassword81"
OPS_TOKEN = "XopsToken82"


def _get(url: str, authorization: str | None = None) -> tuple[int, Message, str]:
    """(status, headers, body) with an optional Authorization header."""
    req = urllib.request.Request(url, headers={"Authorization": authorization} if authorization else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.headers, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read().decode()


def test_auth_guards_the_dashboard_and_api_stats_not_the_probes_or_metrics(
    broker, topic_factory, unique_group_id, tmp_path, monkeypatch, caplog
):
    """Bound to every interface with basic auth and a bearer token (from ${ENV} and
    @file:): 401 with both challenges without credentials, 200 with either; probes and
    /metrics open; no credential in anything served or logged."""
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("TIDEBATCH_TEST_OPS_PW", OPS_PASSWORD)
    token_file = tmp_path / "ops-token"
    token_file.write_text(OPS_TOKEN + "\n")
    auth = {"username": "ops", "password": "${TIDEBATCH_TEST_OPS_PW}", "bearer_token": f"@file:{token_file}"}
    cfg = worker_config(broker, make_topics(topic_factory, 1), unique_group_id,
                        metrics={"host": "0.0.0.0", "port": 0, "auth": auth})
    basic = "Basic " + base64.b64encode(f"ops:{OPS_PASSWORD}".encode()).decode()
    served: list[str] = []
    with live_worker(cfg, start=False) as live:
        base = f"http://127.0.0.1:{live.server.port}"
        for path in ("/", "/api/stats", "/static/dashboard.js", "/nope"):
            code, headers, _ = _get(base + path)
            assert code == 401, path
            assert headers.get_all("WWW-Authenticate") == ['Basic realm="tidebatch", charset="UTF-8"',
                                                           'Bearer realm="tidebatch"'], path
            assert _get(base + path, "Bearer wrong")[0] == 401, path
            assert _get(base + path, "Basic " + base64.b64encode(b"ops:wrong").decode())[0] == 401, path
        for credentials in (basic, f"Bearer {OPS_TOKEN}"):
            for path in ("/", "/api/stats", "/static/dashboard.js"):
                code, _, body = _get(base + path, credentials)
                assert code == 200, (path, credentials[:6])
                served.append(body)
            assert _get(base + "/nope", credentials)[0] == 404
        assert json.loads(served[1])["worker"]["pipeline"] == "ctr"
        for path in ("/metrics", "/healthz", "/readyz"):  # readyz: 503 (not started), not 401
            code, _, body = _get(base + path)
            assert code in (200, 503), path
            served.append(body)
    printed = caplog.text
    assert "basic or bearer auth needed on all but /healthz /readyz /metrics" in printed
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "without credentials" in r.getMessage()]
    for text in (*served, printed):
        assert OPS_PASSWORD not in text and OPS_TOKEN not in text and basic.split()[1] not in text


def test_bound_beyond_loopback_without_auth_warns_once_and_stays_open(
    broker, topic_factory, unique_group_id, caplog
):
    cfg = worker_config(broker, make_topics(topic_factory, 1), unique_group_id, metrics={"host": "0.0.0.0", "port": 0})
    with live_worker(cfg, start=False) as live:
        base = f"http://127.0.0.1:{live.server.port}"
        assert _get(base + "/api/stats")[0] == 200 and _get(base + "/")[0] == 200
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "without credentials" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "0.0.0.0" in warnings[0] and "metrics.auth" in warnings[0]
