"""Integration fixtures: a real broker started once per session, fresh topics per
test, unique consumer groups.

`broker` is Apache Kafka (consumers/brokers/kafka.py, one node, profile "kafka") unless
TIDEBATCH_TEST_BROKER=embedded picks the embedded Tansu broker (profile "embedded")
for the whole run. A test module that must hold on both (the CTR end-to-end and the
bad-input tests, so the embedded default stays honest) says
`pytestmark = pytest.mark.parametrize("broker", BOTH_BROKERS, indirect=True)`.
`kafka_cluster` (three nodes, RF 3) is started only when a test asks for it, with
`cluster_topic_factory`. Every broker has `.profile`, and the helpers in
pipeline_helpers.py and opsutil.py give the worker under test that profile.

Why fresh topics and groups (docs/BROKERS.md): Tansu never frees a topic's data until
the topic is deleted, its fetch slows with every batch stored in a partition, and a
group can get stuck for good after members leave together; on Apache Kafka, fresh
names keep tests independent. So every test gets new uniquely named topics (deleted at
teardown) and its own group id.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from consumers.brokers.embedded import EmbeddedBroker, LocalBroker
from consumers.brokers.kafka import KafkaBroker
from tests.integration.certs import CertFiles
from tests.integration.pipeline_helpers import register_broker
from tests.integration.schema_registry import SchemaRegistry

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test under tests/integration as `integration` (select with -m)."""
    for item in items:
        if _HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.integration)


BROKER_ENV = "TIDEBATCH_TEST_BROKER"
_ENGINES = {"kafka": "kafka_broker", "embedded": "embedded_broker"}
BOTH_BROKERS = list(_ENGINES)


@pytest.fixture(scope="session")
def broker(request: pytest.FixtureRequest) -> LocalBroker:
    """The broker of this test: Apache Kafka by default, Tansu with
    TIDEBATCH_TEST_BROKER=embedded, or the one a module parametrizes."""
    engine = getattr(request, "param", None) or os.environ.get(BROKER_ENV, "kafka")
    if engine not in _ENGINES:
        raise pytest.UsageError(f"{BROKER_ENV}={engine!r}: use one of {', '.join(_ENGINES)}")
    return request.getfixturevalue(_ENGINES[engine])


@pytest.fixture(scope="session")
def embedded_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """One embedded broker for the whole session; its log is in pytest's temp dir."""
    log_path = tmp_path_factory.mktemp("broker") / "tansu.log"
    with EmbeddedBroker(log_path=log_path) as running:
        register_broker(running)
        yield running


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """One single-node Apache Kafka for the session, started on first use (~4 s warm);
    its node logs are in pytest's temp dir."""
    with KafkaBroker(workdir=tmp_path_factory.mktemp("kafka")) as running:
        register_broker(running)
        yield running


class BrokerSlot:
    """A broker started by the first test that asks for it and kept running for the tests
    right after it that ask for it too; stopped before the first one that does not
    (pytest_runtest_teardown below), so it never idles under the rest of the session."""

    def __init__(self, make: Callable[[], KafkaBroker]) -> None:
        self._make = make
        self._running: KafkaBroker | None = None

    def get(self) -> KafkaBroker:
        if self._running is None:
            self._running = self._make().start()
            register_broker(self._running)
        return self._running

    def stop(self) -> None:
        if self._running is not None:
            running, self._running = self._running, None
            running.stop()


@pytest.fixture(scope="session")
def _cluster_slot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerSlot]:
    slot = BrokerSlot(lambda: KafkaBroker(nodes=3, workdir=tmp_path_factory.mktemp("kafka-cluster")))
    yield slot
    slot.stop()


@pytest.fixture
def kafka_cluster(_cluster_slot: BrokerSlot) -> KafkaBroker:
    """A three-node Apache Kafka (RF 3, min.insync.replicas 2), started on first use.
    Shared by consecutive tests that use it, across modules (a test that kills a node
    restarts it before it ends; tests/conftest.py runs them all on one xdist worker),
    stopped before the first test that does not: three idle JVMs left running for the
    rest of the session starved the single-node broker's heartbeats on 2 cores."""
    return _cluster_slot.get()


@pytest.hookimpl(trylast=True)  # after the test's own fixtures are torn down
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    slot = getattr(item, "funcargs", {}).get("_cluster_slot")
    if slot is not None and (nextitem is None or "kafka_cluster" not in getattr(nextitem, "fixturenames", ())):
        slot.stop()


@pytest.fixture(scope="module")
def kafka_pki(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    """The CA of `secured_kafka` (tests/integration/certs.py CertFiles): it signed the
    broker's certificate, and its MTLS listener trusts the client certificates it signs
    (`make_cert(kafka_pki, folder, "worker")` is principal User:CN=worker; with
    subject_prefix=secured_helpers.MAPPED_SUBJECT_PREFIX, User:worker)."""
    from tests.integration.certs import make_ca

    return make_ca(tmp_path_factory.mktemp("kafka-pki"))


@pytest.fixture(scope="module")
def secured_kafka(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                  kafka_pki: CertFiles) -> Iterator[KafkaBroker]:
    """A single-node Apache Kafka with a SASL_SSL listener (SCRAM-SHA-512, a certificate
    from `kafka_pki`, StandardAuthorizer ACLs; consumers/brokers/kafka_security.py),
    an MTLS listener (client certificates of `kafka_pki` required) and an OAUTH one
    (OAUTHBEARER, unsecured tokens): one JVM for every way in, since each listener
    costs a port, not a broker. `.security.ca` is the CA its clients trust. Stopped after its
    module, like kafka_cluster: one more idle JVM would slow the rest of the session.
    A module may parametrize it (indirect) with more server.properties, e.g.
    connections.max.reauth.ms."""
    from consumers.brokers.kafka_security import KafkaSecurity
    from tests.integration.certs import make_cert
    from tests.integration.secured_helpers import PRINCIPAL_MAPPING_RULES

    pki = kafka_pki.cert.parent
    leaf = make_cert(kafka_pki, pki, "broker", ["127.0.0.1", "localhost"])
    keystore = pki / "broker-keystore.pem"  # Kafka's PEM keystore: key, then the chain
    keystore.write_text(leaf.key.read_text() + leaf.cert.read_text())
    security = KafkaSecurity(keystore=keystore, ca=leaf.ca, client_ca=kafka_pki.cert, oauthbearer=True,
                             principal_mapping_rules=PRINCIPAL_MAPPING_RULES)
    settings = getattr(request, "param", None)
    with KafkaBroker(workdir=tmp_path_factory.mktemp("kafka-secured"), security=security, settings=settings) as running:
        register_broker(running)
        yield running


TopicFactory = Callable[..., str]


@pytest.fixture
def topic_factory(broker: LocalBroker) -> Iterator[TopicFactory]:
    """`factory(prefix, partitions=1) -> name`: a new topic, unique per call, created with
    its final partition count; all of them are deleted when the test ends.
    `exact=True` uses `prefix` as the whole name: for topics derived from a unique one,
    e.g. `factory(f"{inp}.dlq", exact=True)`. `config` is the topic's configuration,
    e.g. {"max.message.bytes": ...} (Apache Kafka refuses records over ~1 MB)."""
    yield from _topics_on(broker)


@pytest.fixture
def kafka_topic_factory(kafka_broker: KafkaBroker) -> Iterator[TopicFactory]:
    """As topic_factory, on the single-node Apache Kafka."""
    yield from _topics_on(kafka_broker)


@pytest.fixture
def cluster_topic_factory(kafka_cluster: KafkaBroker) -> Iterator[TopicFactory]:
    """As topic_factory, on the three-node Apache Kafka: replication factor 3."""
    yield from _topics_on(kafka_cluster)


@pytest.fixture
def secured_topic_factory(secured_kafka: KafkaBroker) -> Iterator[TopicFactory]:
    """As topic_factory, on the secured Apache Kafka (made through its PLAINTEXT
    listener, whose principal is a super user)."""
    yield from _topics_on(secured_kafka)


def _topics_on(broker: LocalBroker) -> Iterator[TopicFactory]:
    created: list[str] = []

    def factory(
        prefix: str = "test", partitions: int = 1, *, exact: bool = False, config: dict[str, str] | None = None
    ) -> str:
        name = prefix if exact else f"{_clean(prefix)}-{uuid.uuid4().hex[:12]}"
        broker.create_topics({name: partitions}, topic_config=config)
        created.append(name)
        return name

    yield factory
    if created and broker.running:
        broker.delete_topics(created)


@pytest.fixture
def unique_group_id(request: pytest.FixtureRequest) -> str:
    """A consumer group id no other test (or earlier run) uses; names the test for logs."""
    return f"{_clean(request.node.name)[:60]}-{uuid.uuid4().hex[:12]}"


def _clean(text: str) -> str:
    """Keep only characters legal in topic names and group ids."""
    return re.sub(r"[^a-zA-Z0-9._-]+", "-", text).strip("-") or "x"


# ---------------------------------------------------------------------------- Redis
# A private redis-server per test (tests/integration/redis_server.py): exact command
# statistics and kill/restart without disturbing the shared 127.0.0.1:6379.
@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[object]:
    """A started RedisServer (url, kill(), start(), client()); stopped at teardown."""
    import shutil

    from tests.integration.redis_server import redis_server

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not on PATH (scripts/ensure_redis.sh installs it)")
    with redis_server(tmp_path / "redis") as server:
        yield server


# ---------------------------------------------------------------- schema registry
# Apicurio Registry through its Confluent-compatible API (tests/integration/schema_registry.py,
# fetched by scripts/ensure_registry.sh; docs/SCHEMA_REGISTRY.md).
@pytest.fixture(scope="session")
def schema_registry_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SchemaRegistry]:
    """One registry for the session, started on first use (~3 s warm): a SchemaRegistry
    (url, stop(), start(), kill(), log_path). H2 file storage, so a test may stop and
    start it (a registry outage) and find every schema and id again; such a test starts
    it again before it ends. Tests name their subjects uniquely (the registry is shared)."""
    workdir = tmp_path_factory.mktemp("schema-registry")
    with SchemaRegistry(workdir, data_dir=workdir / "data") as running:
        yield running


@pytest.fixture(scope="session")
def schema_registry(schema_registry_server: SchemaRegistry) -> str:
    """The session registry's Confluent-compatible base URL, for SchemaRegistryClient."""
    return schema_registry_server.url
