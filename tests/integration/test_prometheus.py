"""A real Prometheus (Debian's package) scrapes a live worker under load: a rate and a
histogram quantile come back through its HTTP API, the alert rules load and evaluate,
every Grafana panel query is valid PromQL over the real metrics, and
`tidebatch status --prometheus` reads it."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shutil
import subprocess
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from consumers.brokers.embedded import free_port
from pipeline.app.produce import produce
from pipeline.commands import status
from tests.integration.opsutil import (
    get_json,
    http_get,
    live_worker,
    make_topics,
    wait_for,
    wait_ready,
    worker_config,
)

REPO = Path(__file__).resolve().parents[2]
JOB = "kubernetes-pods"

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="prometheus missing: run scripts/ensure_prometheus.sh"
)


@contextlib.contextmanager
def prometheus(target: str, tmp: Path) -> Iterator[str]:
    """Prometheus on a free loopback port scraping `target` every second, with the
    project's alert rules; yields its base URL. The job is named as a cluster's
    annotation scrape config names it, not tidebatch-worker: neither the alerts nor
    the dashboard may depend on the job's name."""
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(REPO / "ops" / "prometheus" / "alerts.yml")],
        "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": [target]}]}],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = open(tmp / "prometheus.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(url + "/-/ready") or proc.poll() is not None, 60, "Prometheus to start")
        assert proc.poll() is None, (tmp / "prometheus.log").read_text()
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _answers(url: str) -> bool:
    try:
        return http_get(url, timeout=2)[0] == 200
    except OSError:
        return False


def query(base: str, promql: str) -> list[dict]:
    code, doc = get_json(base + "/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    assert code == 200 and doc["status"] == "success", f"{promql}: {doc}"
    return doc["data"]["result"]


def scalar(base: str, promql: str) -> float | None:
    result = query(base, promql)
    if not result:
        return None
    value = float(result[0]["value"][1])
    return None if math.isnan(value) else value


def grafana_queries() -> list[tuple[str, str]]:
    dash = json.loads((REPO / "ops" / "grafana" / "dashboards" / "tidebatch.json").read_text())
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]


def test_prometheus_scrapes_a_live_worker(broker, topic_factory, unique_group_id, tmp_path, capsys):
    topics = make_topics(topic_factory, 2)
    # A generous SLO: on two shared cores p99 is no test subject; the verdict logic is.
    cfg = worker_config(broker, topics, unique_group_id, batching={"slo_ms": 10000})
    stop = threading.Event()
    with live_worker(cfg) as live:
        wait_ready(live.url)
        load = threading.Thread(
            target=produce, args=(broker.bootstrap_servers, "ctr", 80.0, 100_000),
            kwargs={"topic": topics.input, "profile": broker.profile, "should_stop": stop.is_set}, daemon=True,
        )
        load.start()
        try:
            with prometheus(live.url.removeprefix("http://"), tmp_path) as prom:
                wait_for(lambda: scalar(prom, f'up{{job="{JOB}"}}') == 1, 30, "the worker target to be up")
                rate = wait_for(
                    lambda: scalar(prom, f'sum(rate(tidebatch_records_total{{job="{JOB}"}}[10s]))'),
                    60, "a non-zero record rate",
                )
                assert rate > 0
                p99 = wait_for(
                    lambda: scalar(prom, "histogram_quantile(0.99, sum by (le) "
                                         "(rate(tidebatch_end_to_end_latency_seconds_bucket[10s])))"),
                    60, "a p99 from the latency histogram",
                )
                assert 0 < p99 <= 30.0  # within the histogram's finite buckets

                _check_rules_evaluate(prom)
                _check_grafana_queries(prom)
                _check_status_command(prom, capsys)
        finally:
            stop.set()
            load.join(timeout=30)


def _check_rules_evaluate(prom: str) -> None:
    def evaluated() -> list[dict] | None:
        _, doc = get_json(prom + "/api/v1/rules")
        rules = [r for g in doc["data"]["groups"] for r in g["rules"]]
        return rules if rules and all(r.get("health") == "ok" for r in rules) else None

    rules = wait_for(evaluated, 30, "every alert rule to evaluate with health ok")
    assert {r["name"] for r in rules} == {
        "TidebatchWorkerDown", "TidebatchNoWorkers", "TidebatchLagGrowing",
        "TidebatchP99OverSLO", "TidebatchDLQRate", "TidebatchNoCommit",
        "TidebatchDeliveryErrors", "TidebatchRedisDown", "TidebatchModelProcessRestarting",
        "TidebatchModelVersionRefused", "TidebatchTenantP99OverSLA",
    }
    # Nothing is wrong: no alert may even be pending.
    _, doc = get_json(prom + "/api/v1/alerts")
    assert doc["data"]["alerts"] == []


def _check_grafana_queries(prom: str) -> None:
    must_have_data = {"Throughput", "Workers up", "Workers ready", "End-to-end latency p50 / p99 vs SLO",
                      "Mean batch size", "Queue depth", "Consumer lag", "Partitions per worker", "Where the time goes: p99 by stage"}
    with_data: set[str] = set()
    for title, expr in grafana_queries():
        promql = expr.replace("$__rate_interval", "10s")
        for var in ("job", "namespace", "pipeline"):  # each at its "All" value
            promql = promql.replace(f'"${var}"', '".*"')
        assert "$" not in promql, f"{title}: a variable the test does not know: {promql}"
        if query(prom, promql):  # query() asserts that Prometheus accepts it
            with_data.add(title)
    # A panel needs data from one of its queries (the DLQ line has none: no bad input).
    assert must_have_data <= with_data, f"panels without data: {must_have_data - with_data}"


def _check_status_command(prom: str, capsys: pytest.CaptureFixture) -> None:
    parser = argparse.ArgumentParser()
    status.add_parser(parser.add_subparsers())
    args = parser.parse_args(["status", "--prometheus", prom, "--job", JOB, "--window", "10s", "--json"])
    args.func(args)
    report = json.loads(capsys.readouterr().out)
    (ctr,) = report["pipelines"]
    assert ctr["pipeline"] == "ctr" and ctr["workers_up"] == 1
    assert ctr["verdict"] != "DOWN", ctr
    assert ctr["slo_ms"] == 10000.0 and ctr["assigned"] == 2 and ctr["ready"] == 1
    assert ctr["throughput_rps"] > 0 and ctr["batch_rows"] > 0 and ctr["p99_ms"] > 0
    assert report["down"] == {}
