"""pipeline/kafka_backend.py is the one place in pipeline/ that builds Kafka clients.

Each command's client gets the librdkafka settings it got when the command built it
itself: every test below writes out the config as the command used to make it
(consumers/profiles.py's builders and the command's own additions) and compares it with
what the factory hands the client class, for each broker profile. Then the rule that
keeps it so: no other module of pipeline/ imports a client class. No network I/O: the
client classes are replaced by recorders."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

import consumers.admin
import consumers.confluent_backend as confluent_backend
from consumers.profiles import PROFILES, consumer_config, large_message_overrides, producer_config
from pipeline import kafka_backend
from pipeline.errors import UserError

REPO = Path(__file__).resolve().parents[2]
B = "broker.example:9092"
SETTINGS = {"client.id": "tb-test", "socket.timeout.ms": 7000}
# Made anew by consumers/client_logs.py `wired` for each config: compared by kind.
CALLBACKS = ("logger", "error_cb")


class _Client:
    """Every client method the commands call on the way in and out, doing nothing."""

    def __init__(self, conf: Mapping[str, Any], *_args: object) -> None:
        self.conf = dict(conf)

    def list_topics(self, **_kw: object) -> Any:
        return type("Meta", (), {"topics": {}})()

    def subscribe(self, *_a: object) -> None: ...
    def assign(self, *_a: object) -> None: ...
    def poll(self, *_a: object) -> int:
        return 0

    def flush(self, *_a: object) -> int:
        return 0

    def close(self) -> None: ...


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The configs of the clients made, in order."""
    made: list[dict[str, Any]] = []

    def recorder(conf: Mapping[str, Any], *args: object) -> _Client:
        made.append(dict(conf))
        return _Client(conf, *args)

    for module, name in ((kafka_backend, "Consumer"), (kafka_backend, "ConfluentKafkaProducer"),
                         (confluent_backend, "ConfluentProducer"), (confluent_backend, "ConfluentSource"),
                         (confluent_backend, "ConfluentTransactionalProducer")):
        monkeypatch.setattr(module, name, recorder)
    return made


def same(got: Mapping[str, Any], before: Mapping[str, Any]) -> None:
    for key in CALLBACKS:
        assert type(got[key]) is type(before[key])
    assert {k: v for k, v in got.items() if k not in CALLBACKS} == {k: v for k, v in before.items() if k not in CALLBACKS}


@pytest.mark.parametrize("profile", tuple(PROFILES))
def test_produce_load(profile: str, built: list[dict[str, Any]]) -> None:
    from pipeline.app.produce import produce

    produce(B, "ctr", 100.0, 0, profile=profile, kafka=SETTINGS)
    same(built[0], producer_config(profile, B, {**SETTINGS}))
    kafka_backend.load_producer(profile, B, SETTINGS, max_message_bytes=8 << 20)  # a pipeline's large values
    same(built[1], producer_config(profile, B, {**large_message_overrides(8 << 20).producer, **SETTINGS}))


def test_the_demo(built: list[dict[str, Any]]) -> None:
    from pipeline.app.demo import ResultCollector, _send_invalid

    collector = ResultCollector(B, "out")
    collector._stop.set()
    collector._loop()
    _send_invalid(B, "in", 0)
    group = built[0]["group.id"]
    assert group.startswith("demo-reader-")
    same(built[0], consumer_config("embedded", B, group))
    same(built[1], producer_config("embedded", B))


@pytest.mark.parametrize("profile", tuple(PROFILES))
def test_etl_topic_range(profile: str, built: list[dict[str, Any]]) -> None:
    from pipeline.etl.topic import _consumer

    _consumer(B, profile, SETTINGS)
    before = consumer_config(profile, B, "tidebatch-etl", SETTINGS)
    before["enable.partition.eof"] = True
    before["auto.offset.reset"] = "error"
    same(built[0], before)


@pytest.mark.parametrize("profile", tuple(PROFILES))
def test_dlq_reads(profile: str, built: list[dict[str, Any]]) -> None:
    from pipeline.dlq.read import _partition, topic_exists
    from pipeline.etl.topic import PartitionRange

    assert not topic_exists(B, profile, "in.dlq", SETTINGS)
    assert list(_partition(B, profile, PartitionRange("in.dlq", 0, 5, 5), SETTINGS)) == []
    same(built[0], consumer_config(profile, B, "tidebatch-dlq", SETTINGS))
    before = consumer_config(profile, B, "tidebatch-dlq", SETTINGS)
    before["enable.partition.eof"] = True
    same(built[1], before)


@pytest.mark.parametrize("profile", tuple(PROFILES))
def test_dlq_replay(profile: str, built: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.dlq.letters import Selection
    from pipeline.dlq.replay import ReplayJob, _Sender

    monkeypatch.setattr(consumers.admin, "ensure_topics", lambda *_a, **_k: {})
    _Sender(ReplayJob(B, profile, "in.dlq", "in", Selection.of(), 10.0, producer_settings=SETTINGS), "in.dlq.replayed")
    same(built[0], producer_config(profile, B, SETTINGS))


@pytest.mark.parametrize("profile", tuple(PROFILES))
def test_generate(profile: str, built: list[dict[str, Any]]) -> None:
    """serve_generate's two clients, as it asks for them (pipeline/app/generation.py)."""
    kafka_backend.confluent_producer(profile, B, dict(SETTINGS))
    kafka_backend.confluent_source(profile, B, dict(SETTINGS), "tidebatch-generate", ["in"], print, print)
    same(built[0], producer_config(profile, B, SETTINGS))
    same(built[1], consumer_config(profile, B, "tidebatch-generate", SETTINGS))


def test_generate_resolves_secrets_as_the_other_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    """-X sasl.password=${VAR} reached generate's clients as the literal text before."""
    import pipeline.app.generation as generation
    from pipeline.cli import build_parser

    served = []
    monkeypatch.setattr(generation, "serve_generate", lambda svc: served.append(svc) or 0)
    monkeypatch.setenv("TB_FACTORY_TEST_PW", "tb-factory-test-pw-7f3a")
    args = build_parser().parse_args(["generate", "-X", "sasl.password=${TB_FACTORY_TEST_PW}"])
    assert args.func(args) == 0
    for role in ("consumer", "producer", "admin"):
        assert served[0].kafka.client(role)["sasl.password"] == "tb-factory-test-pw-7f3a"


@pytest.mark.parametrize("profile", tuple(PROFILES))
def test_the_worker(profile: str, built: list[dict[str, Any]]) -> None:
    from pipeline.config import load_config

    cfg = load_config(overrides={"broker_profile": profile, "kafka": {"common": SETTINGS}}, environ={})
    kafka_backend.make_producer(cfg)
    kafka_backend.make_source(cfg, "g", ["in"], print, print)
    bootstrap = cfg.bootstrap_servers
    same(built[0], producer_config(profile, bootstrap, SETTINGS))
    same(built[1], consumer_config(profile, bootstrap, "g", SETTINGS))


def test_a_client_librdkafka_refuses_is_one_line() -> None:
    with pytest.raises(UserError, match=r"^cannot create a Kafka consumer for 127\.0\.0\.1:1: .*no\.such"):
        kafka_backend.range_reader("kafka", "127.0.0.1:1", {"no.such": 1}, "g")


# ------------------------------------------------------------------ the rule
FACTORY = "pipeline/kafka_backend.py"
# The client classes, by the module that defines them: confluent-kafka's, and the
# project's wrappers around confluent-kafka and kafka-python.
CLIENT_CLASSES: dict[str, frozenset[str]] = {
    "confluent_kafka": frozenset({"Consumer", "Producer", "AdminClient", "DeserializingConsumer",
                                  "SerializingProducer"}),
    "confluent_kafka.admin": frozenset({"AdminClient"}),
    "consumers.confluent_backend": frozenset({"ConfluentSource", "ConfluentProducer",
                                              "ConfluentTransactionalProducer"}),
    "consumers.kafka_python_backend": frozenset({"KafkaPythonSource", "KafkaPythonProducer"}),
    "kafka": frozenset({"KafkaConsumer", "KafkaProducer", "KafkaAdminClient"}),
}


def client_imports(source: str) -> list[str]:
    """`from M import C` of a client class, and `M.C` where M is a client module imported whole."""
    tree = ast.parse(source)
    found: list[str] = []
    whole: dict[str, str] = {}  # local name -> client module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if alias.name in CLIENT_CLASSES.get(node.module, ()):
                    found.append(f"{node.module}.{alias.name}")
                elif f"{node.module}.{alias.name}" in CLIENT_CLASSES:
                    whole[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            whole.update({a.asname or a.name: a.name for a in node.names if a.name in CLIENT_CLASSES})
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in whole:
            module = whole[node.value.id]
            if node.attr in CLIENT_CLASSES[module]:
                found.append(f"{module}.{node.attr}")
    return found


def test_only_the_factory_imports_a_client_class() -> None:
    offenders = []
    for path in sorted((REPO / "pipeline").rglob("*.py")):
        name = path.relative_to(REPO).as_posix()
        if name != FACTORY:
            offenders += [f"{name}: {c}" for c in client_imports(path.read_text())]
    assert not offenders, f"build Kafka clients through {FACTORY}:\n" + "\n".join(offenders)


def test_the_rule_sees_every_way_in() -> None:
    assert client_imports("from confluent_kafka import Consumer, KafkaError") == ["confluent_kafka.Consumer"]
    assert client_imports("from confluent_kafka.admin import AdminClient") == ["confluent_kafka.admin.AdminClient"]
    assert client_imports("import confluent_kafka as ck\nck.Producer({})") == ["confluent_kafka.Producer"]
    assert client_imports("from consumers import confluent_backend\nconfluent_backend.ConfluentSource") == [
        "consumers.confluent_backend.ConfluentSource"]
    assert client_imports("from confluent_kafka import KafkaException, TopicPartition") == []
    assert client_imports(Path(REPO / FACTORY).read_text())  # the factory itself is seen
