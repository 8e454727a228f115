"""Apache Kafka's local brokers without starting a JVM: the broker settings
(consumers/brokers/kafka_settings.py) agree with docker-compose.yml (issue 16 part 6),
the generated server.properties, the pin and the jars (consumers/brokers/kafka_fetch.py),
the cluster id (consumers/brokers/kafka_node.py), and the one-line errors."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from consumers.brokers import kafka_fetch, kafka_node
from consumers.brokers.kafka import KafkaBroker
from consumers.brokers.kafka_fetch import (
    KAFKA_VERSION,
    KafkaBrokerError,
    ensure_jars,
    maven_error_line,
)
from consumers.brokers.kafka_node import failure_line
from consumers.brokers.kafka_settings import (
    CLUSTER_SETTINGS,
    LOCAL_SETTINGS,
    NODE_SPECIFIC,
    SHARED_SETTINGS,
    server_properties,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def _compose_kafka_settings(compose: dict) -> dict[str, str]:
    """The kafka service's KAFKA_* variables as property names (the apache/kafka image's
    rule: strip KAFKA_, lower-case, '_' → '.')."""
    env = compose["services"]["kafka"]["environment"]
    return {
        name.removeprefix("KAFKA_").lower().replace("_", "."): str(value)
        for name, value in env.items()
        if name.startswith("KAFKA_")
    }


def test_every_shared_setting_has_the_same_value_in_docker_compose(compose: dict) -> None:
    settings = _compose_kafka_settings(compose)
    differ = {k: (v, settings.get(k)) for k, v in SHARED_SETTINGS.items() if settings.get(k) != v}
    assert not differ, f"kafka_settings.SHARED_SETTINGS vs docker-compose.yml (ours, compose's): {differ}"


def test_docker_compose_sets_nothing_the_shared_table_does_not_know(compose: dict) -> None:
    """A setting added only to compose would silently differ from the tests' broker:
    each one is shared, or explicitly per node (addresses, ids, folders)."""
    unknown = set(_compose_kafka_settings(compose)) - set(SHARED_SETTINGS) - set(NODE_SPECIFIC)
    assert not unknown, f"add these to SHARED_SETTINGS or NODE_SPECIFIC: {sorted(unknown)}"


def test_docker_compose_runs_the_pinned_kafka_version(compose: dict) -> None:
    images = {
        name: service["image"]
        for name, service in compose["services"].items()
        if str(service.get("image", "")).startswith("apache/kafka:")
    }
    assert images, "no apache/kafka service in docker-compose.yml"
    assert set(images.values()) == {f"apache/kafka:{KAFKA_VERSION}"}, images


def test_the_pom_default_is_the_pin() -> None:
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    root = ET.parse(kafka_fetch.POM).getroot()
    assert root.findtext("m:properties/m:kafka.version", namespaces=ns) == KAFKA_VERSION


def test_local_and_cluster_tables_do_not_override_shared_or_node_settings() -> None:
    assert not set(LOCAL_SETTINGS) & (set(SHARED_SETTINGS) | set(NODE_SPECIFIC))
    assert not set(CLUSTER_SETTINGS) & set(NODE_SPECIFIC)


def test_single_node_properties() -> None:
    props = server_properties(1, 9092, 9093, {1: 9093}, Path("/d"))
    for key, value in SHARED_SETTINGS.items():
        assert props[key] == value
    assert set(NODE_SPECIFIC) <= set(props)
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert "min.insync.replicas" not in props


def test_three_node_properties_are_durable_by_default() -> None:
    props = server_properties(2, 9192, 9193, {1: 9093, 2: 9193, 3: 9293}, Path("/d"))
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9093,2@127.0.0.1:9193,3@127.0.0.1:9293"
    assert props["node.id"] == "2"
    assert props["default.replication.factor"] == "3"
    assert props["min.insync.replicas"] == "2"
    assert props["offsets.topic.replication.factor"] == "3"


def test_maven_error_line_skips_mavens_boilerplate() -> None:
    output = (
        "[ERROR] Failed to execute goal on project kafka-dist: Could not resolve dependencies: "
        "Could not transfer artifact org.apache.kafka:kafka_2.13:pom:4.0.0 from/to central: "
        "repo.maven.apache.org: Temporary failure in name resolution\n"
        "[ERROR] \n"
        "[ERROR] To see the full stack trace of the errors, re-run Maven with the -e switch.\n"
        "[ERROR] Re-run Maven using the -X switch to enable full debug logging.\n"
        "[ERROR] For more information about the errors and possible solutions, please read:\n"
        "[ERROR] [Help 1] http://cwiki.apache.org/confluence/display/MAVEN/DependencyResolutionException\n"
    )
    line = maven_error_line(output)
    assert line.startswith("Failed to execute goal") and "name resolution" in line
    assert maven_error_line("") == "(no output)"


def test_failure_line_is_the_cause_after_the_last_error(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(
        "2026-01-01T00:00:00.000 [main] WARN kafka.Foo - noise\n"
        "2026-01-01T00:00:01.000 [main] ERROR kafka.Kafka$ - Exiting Kafka due to fatal exception during startup.\n"
        "org.apache.kafka.common.KafkaException: Socket server failed to bind to 127.0.0.1:9092: Address already in use.\n"
        "\tat kafka.network.Acceptor.openServerSocket(SocketServer.scala:734)\n"
    )
    assert failure_line(log).endswith("Address already in use.")
    log.write_text("just a line\n")
    assert failure_line(log) == "just a line"
    assert failure_line(tmp_path / "absent.log") == "(no log)"


def test_no_java_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(KafkaBrokerError, match="java not found") as info:
        kafka_fetch.require_java()
    assert "\n" not in str(info.value)


def test_complete_jar_folder_is_used_without_maven(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "libs").mkdir()
    (tmp_path / ".complete").write_text("kafka x\n")
    monkeypatch.setenv("PATH", "/nonexistent")  # mvn would not even be found
    assert ensure_jars(home=tmp_path) == tmp_path / "libs"


def test_kafka_home_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kafka_fetch.HOME_ENV, str(tmp_path))
    assert kafka_fetch.kafka_home() == tmp_path
    monkeypatch.delenv(kafka_fetch.HOME_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert kafka_fetch.kafka_home("9.9.9") == tmp_path / "cache" / "tidebatch" / "kafka-9.9.9"


def test_bad_node_counts_and_ports_are_refused_before_anything_starts() -> None:
    with pytest.raises(KafkaBrokerError, match="nodes must be 1 or 3"):
        KafkaBroker(nodes=2)
    with pytest.raises(KafkaBrokerError, match="port must be"):
        KafkaBroker(port=70000)


def test_cli_refuses_nodes_without_the_kafka_engine(capsys: pytest.CaptureFixture[str]) -> None:
    from pipeline.cli import main

    assert main(["broker", "--nodes", "3"]) == 2
    assert "--nodes needs --engine kafka" in capsys.readouterr().err


def test_cluster_ids_never_start_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    """A leading '-' made StorageTool read the id as an option (1 in 64 starts failed)."""
    import uuid

    dashed = uuid.UUID(bytes=b"\xf8" + bytes(15))  # base64 "-A..."
    plain = uuid.UUID(bytes=bytes(16))
    ids = iter([dashed, plain])
    monkeypatch.setattr(kafka_node.uuid, "uuid4", lambda: next(ids))
    assert kafka_node.new_cluster_id() == "AAAAAAAAAAAAAAAAAAAAAA"
