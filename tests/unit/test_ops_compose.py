"""docker-compose.yml parses and agrees with the code: KRaft Apache Kafka, the topics
one-shot, scalable workers with a valid config, healthchecks, mounts that exist."""

from __future__ import annotations

import json
import re

import pytest

from pipeline.config import load_config
from tests.unit.ops_files import REPO, load_compose


@pytest.fixture(scope="module")
def compose() -> dict:
    return load_compose()


def test_compose_has_the_whole_stack(compose):
    assert {"kafka", "redis", "topics", "worker", "prometheus", "grafana"} <= set(compose["services"])
    assert "zookeeper" not in json.dumps(compose).lower()


def test_compose_kafka_is_apache_kafka_in_kraft_mode(compose):
    kafka = compose["services"]["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    env = kafka["environment"]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{env['KAFKA_NODE_ID']}@kafka:9093"
    assert "CONTROLLER" in env["KAFKA_CONTROLLER_LISTENER_NAMES"]
    assert "PLAINTEXT://kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", str(env["CLUSTER_ID"])), "CLUSTER_ID must be a base64 UUID"
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"  # the topics service creates them


def test_compose_worker_scales(compose):
    worker = compose["services"]["worker"]
    assert "build" in worker
    assert "container_name" not in worker, "a fixed name breaks --scale"
    assert "ports" not in worker, "a fixed host port breaks --scale; use expose"
    assert "9400" in [str(p) for p in worker["expose"]]
    assert worker["depends_on"]["topics"]["condition"] == "service_completed_successfully"
    assert worker.get("stop_grace_period"), "SIGTERM needs time to finish batches and commit"


def test_compose_worker_environment_is_a_valid_config(compose):
    env = {k: str(v) for k, v in compose["services"]["worker"]["environment"].items()}
    cfg = load_config(environ=env)  # raises on an unknown key or a bad value
    assert cfg.bootstrap_servers == "kafka:9092"
    assert cfg.metrics.host == "0.0.0.0" and cfg.metrics.port == 9400
    assert cfg.create_topics is False


def test_compose_topics_is_a_one_shot_after_kafka(compose):
    topics = compose["services"]["topics"]
    assert topics["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert topics["restart"] == "no"
    script = "\n".join(topics["command"])
    for topic in ("ctr.requests", "ctr.scores", "ctr.requests.dlq", "ctr.requests.late"):
        assert re.search(rf"create {re.escape(topic)} \d+", script), topic


@pytest.mark.parametrize("service", ["kafka", "redis", "worker", "prometheus", "grafana"])
def test_compose_healthchecks(compose, service):
    check = compose["services"][service]["healthcheck"]
    assert check["test"] and check["interval"]
    if service == "worker":
        assert "/healthz" in " ".join(check["test"])  # liveness, not readiness: see the comment there


def test_compose_mounts_exist(compose):
    for name in ("prometheus", "grafana"):
        for volume in compose["services"][name]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (REPO / source).exists(), volume
