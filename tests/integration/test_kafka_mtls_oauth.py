"""tidebatch on a secured Apache Kafka without passwords: client certificates (the MTLS
listener: SSL, `ssl.client.auth=required`, principal `User:CN=<subject's CN>`) and
OAUTHBEARER (the OAUTH listener: Kafka's unsecured-JWS validator, librdkafka's own
unsecured tokens, principal `User:<sub>`). Both are listeners of the one `secured_kafka`
broker (conftest.py; consumers/brokers/kafka_security.py), with StandardAuthorizer ACLs.

For each: the worker scores requests end to end with exactly the ACLs
docs/OPERATIONS.md documents (secured_helpers.py parses the table), and dead-letters
malformed ones; `produce`, `etl --topic`, `dlq inspect` and `dlq replay` go through
the same listener, each as a principal of its own with only what it needs; a
`--client kafka-python` worker scores with a client certificate too. Refused at
the door (a certificate from another CA, no certificate, a token without the
required scope): one line, a non-zero exit, no raw librdkafka line.

OIDC (`sasl.oauthbearer.method=oidc`) is not tested: its token fetch needs a token
endpoint, and none can be had here (docs/OPERATIONS.md says so).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer

from consumers.brokers.kafka import KafkaBroker
from consumers.brokers.kafka_security import (
    MTLS_LISTENER,
    OAUTH_LISTENER,
    Acl,
    mtls_client_settings,
    oauthbearer_client_settings,
)
from consumers.profiles import producer_config
from pipeline.dlq.replay import ledger_topic
from tests.integration.certs import CertFiles, make_ca, make_cert
from tests.integration.opsutil import (
    ResultCollector,
    Topics,
    make_topics,
    produce_ctr,
    start_worker_process,
    wait_for,
    wait_ready,
)
from tests.integration.pipeline_helpers import committed_offsets
from tests.integration.secured_helpers import (
    MAPPED_SUBJECT_PREFIX,
    assert_one_line_exit,
    cli,
    documented_worker_acls,
    end_offset,
    wait_exit,
)

pytestmark = pytest.mark.timeout(300)

REQUESTS = 300
MALFORMED = 3


# ------------------------------------------------------------------ identities
@dataclass(frozen=True)
class Identity:
    """One client's way in: the principal its ACLs name, the listener, its -X flags,
    and what must never be printed (the private key's body; "" when it has none)."""

    principal: str
    bootstrap: str
    settings: dict[str, str]
    secret: str = ""

    @property
    def flags(self) -> list[str]:
        return [arg for key, value in self.settings.items() for arg in ("-X", f"{key}={value}")]


def key_body(pem: str) -> str:
    """The base64 lines of a PEM key: what a leak would show."""
    return "".join(line for line in pem.splitlines() if not line.startswith("-----"))[:64]


def certificate_identity(kafka: KafkaBroker, ca: CertFiles, folder: Path, role: str, *, key_file: bool = False,
                         mapped: bool = False) -> Identity:
    """A client certificate of `ca` with CN <role>-<random>; the key inline (ssl.key.pem)
    unless `key_file`. `mapped`: a subject the listener's principal mapping rule
    shortens to the CN (secured_helpers.PRINCIPAL_MAPPING_RULES)."""
    assert kafka.security is not None
    name = f"{role}-{uuid.uuid4().hex[:8]}"
    cert = make_cert(ca, folder, name, subject_prefix=MAPPED_SUBJECT_PREFIX if mapped else "")
    pem = cert.key.read_text()
    key = {"key_location": cert.key} if key_file else {"key_pem": pem}
    settings = mtls_client_settings(cert.cert, kafka.security.ca, **key)
    principal = f"User:{name}" if mapped else f"User:CN={name}"
    return Identity(principal, kafka.listener_bootstrap(MTLS_LISTENER), settings, key_body(pem))


def token_identity(kafka: KafkaBroker, role: str, *, scope: str | None = None) -> Identity:
    """An unsecured OAUTHBEARER token (made by librdkafka) whose sub is <role>-<random>."""
    assert kafka.security is not None
    name = f"{role}-{uuid.uuid4().hex[:8]}"
    extra = {} if scope is None else {"scope": scope}
    settings = oauthbearer_client_settings(name, kafka.security.ca, **extra)
    return Identity(f"User:{name}", kafka.listener_bootstrap(OAUTH_LISTENER), settings)


def start_worker(kafka: KafkaBroker, topics: Topics, group: str, who: Identity, tmp_path: Path,
                 args: tuple[str, ...] = ()):
    return start_worker_process(
        kafka, topics, group, tmp_path, f"worker-{uuid.uuid4().hex[:6]}",
        args=("--bootstrap-servers", who.bootstrap, *who.flags, "--kafka-connect-timeout", "20", *args),
    )


def produce_malformed(kafka: KafkaBroker, topic: str, count: int) -> None:
    """Requests the worker cannot decode, through the PLAINTEXT listener (the harness)."""
    producer = Producer(producer_config("kafka", kafka.bootstrap_servers))
    for i in range(count):
        producer.produce(topic, key=f"bad-{i}".encode(), value=b"{not json")
    assert producer.flush(30) == 0


# ------------------------------------------------------------------ end to end
Maker = Callable[[str], Identity]


@pytest.fixture(params=["mtls", "oauthbearer"])
def identities(request: pytest.FixtureRequest, secured_kafka: KafkaBroker, kafka_pki: CertFiles, tmp_path: Path) -> Maker:
    """`make(role)`: a new principal of the listener under test. Every key is inline
    (ssl.key.pem), the worker's too: its start-up line lists its client settings, and
    the test checks that no key shows (consumers/secret_values.py)."""
    if request.param == "mtls":
        return lambda role: certificate_identity(secured_kafka, kafka_pki, tmp_path / "pki", role)
    return lambda role: token_identity(secured_kafka, role)


def test_worker_produce_etl_and_dlq_work_with_the_documented_acls(
    identities: Maker, secured_kafka: KafkaBroker, secured_topic_factory, unique_group_id: str, tmp_path: Path
) -> None:
    topics = make_topics(secured_topic_factory, 1)
    ledger = secured_topic_factory(ledger_topic(topics.dlq), exact=True)  # deleted at teardown
    target = secured_topic_factory("replayed-to", 1)
    worker, producer, etl, dlq = (identities(role) for role in ("worker", "producer", "etl", "dlq"))
    secured_kafka.allow(worker.principal, documented_worker_acls(topics, unique_group_id))
    secured_kafka.allow(producer.principal, [Acl("TOPIC", topics.input, "WRITE")])
    secured_kafka.allow(etl.principal, [Acl("TOPIC", topics.input, "READ")])
    secured_kafka.allow(dlq.principal, [
        Acl("TOPIC", topics.dlq, "READ"), Acl("TOPIC", ledger, "READ"), Acl("TOPIC", ledger, "WRITE"),
        Acl("TOPIC", target, "WRITE"),
    ])

    process = start_worker(secured_kafka, topics, unique_group_id, worker, tmp_path)
    results = ResultCollector(secured_kafka.bootstrap_servers, topics.output)
    try:
        wait_ready(process.url, timeout=90)
        produced = cli(
            "produce", "ctr", "--bootstrap-servers", producer.bootstrap, "--topic", topics.input,
            "--partitions", "1", "--count", str(REQUESTS), "--rate", "2000", *producer.flags,
        )
        assert produced.returncode == 0, produced.stdout
        produce_malformed(secured_kafka, topics.input, MALFORMED)
        wait_for(lambda: len(results.counts) >= REQUESTS, 90, f"{REQUESTS} results")
        wait_for(lambda: end_offset(secured_kafka, topics.dlq) >= MALFORMED, 60, f"{MALFORMED} dead letters")
    finally:
        code = process.stop()
        results.close()
    assert code == 0, process.log_tail()
    assert results.duplicates() == 0
    committed = committed_offsets(secured_kafka.bootstrap_servers, unique_group_id, topics.input, 1)
    assert sum(committed.values()) == REQUESTS + MALFORMED, committed

    out = tmp_path / "etl"
    extracted = cli("etl", "--topic", topics.input, "--bootstrap-servers", etl.bootstrap, "-o", str(out),
                    "--no-progress", *etl.flags)
    assert extracted.returncode == 0, extracted.stdout
    request_ids = {r for p in out.rglob("*.parquet") for r in pq.read_table(p, columns=["request_id"])["request_id"].to_pylist()}
    assert len(request_ids) == REQUESTS, extracted.stdout

    on_dlq = ("--topic", topics.dlq, "--bootstrap-servers", dlq.bootstrap, *dlq.flags)
    inspected = cli("dlq", "inspect", *on_dlq, "--json")
    assert inspected.returncode == 0, inspected.stdout
    assert json.loads(inspected.stdout)["total"] == MALFORMED, inspected.stdout
    replayed = cli("dlq", "replay", *on_dlq, "--to", target, "--rate", "1000")
    assert replayed.returncode == 0, replayed.stdout
    assert replayed.stdout.startswith(f"replayed {MALFORMED} of {MALFORMED} selected dead letters to {target}"), replayed.stdout
    assert end_offset(secured_kafka, target) == MALFORMED

    printed = process.log_path.read_text(errors="replace") + "".join(
        p.stdout for p in (produced, extracted, inspected, replayed))
    for who in (worker, producer, etl, dlq):
        assert not who.secret or who.secret not in printed, f"{who.principal}'s private key was printed"


def test_the_kafka_python_worker_scores_with_a_client_certificate(
    secured_kafka: KafkaBroker, kafka_pki: CertFiles, secured_topic_factory, unique_group_id: str, tmp_path: Path
) -> None:
    # kafka-python takes the certificate and key files (ssl_certfile, ssl_keyfile:
    # consumers/kafka_python_settings.py); it cannot do OAUTHBEARER from settings
    # (tests/unit/test_kafka_security.py).
    topics = make_topics(secured_topic_factory, 1)
    worker = certificate_identity(secured_kafka, kafka_pki, tmp_path / "pki", "worker", key_file=True)
    secured_kafka.allow(worker.principal, documented_worker_acls(topics, unique_group_id))
    process = start_worker(secured_kafka, topics, unique_group_id, worker, tmp_path, args=("--client", "kafka-python"))
    results = ResultCollector(secured_kafka.bootstrap_servers, topics.output)
    try:
        wait_ready(process.url, timeout=90)
        ids = produce_ctr(secured_kafka.bootstrap_servers, topics.input, 100)
        wait_for(lambda: not results.missing(ids), 90, "100 results")
    finally:
        code = process.stop()
        results.close()
    assert code == 0, process.log_tail()
    committed = committed_offsets(secured_kafka.bootstrap_servers, unique_group_id, topics.input, 1)
    assert sum(committed.values()) == 100, committed


def test_a_principal_mapping_rule_makes_the_acl_name_the_short_one(
    secured_kafka: KafkaBroker, kafka_pki: CertFiles, secured_topic_factory, tmp_path: Path
) -> None:
    topic = secured_topic_factory("mapped", 1)
    mapped = certificate_identity(secured_kafka, kafka_pki, tmp_path / "pki", "producer", mapped=True)
    assert mapped.principal.startswith("User:producer-")  # not User:CN=producer-...,OU=mapped,O=...
    secured_kafka.allow(mapped.principal, [Acl("TOPIC", topic, "WRITE")])
    produced = cli("produce", "ctr", "--bootstrap-servers", mapped.bootstrap, "--topic", topic,
                   "--partitions", "1", "--count", "20", *mapped.flags)
    assert produced.returncode == 0, produced.stdout
    assert end_offset(secured_kafka, topic) == 20
    assert mapped.secret not in produced.stdout


# ------------------------------------------------------------------ refused at the door
def assert_certificate_refused(code: int, lines: list[str], secret: str) -> None:
    """Exit 2 with the one line that says the broker refused the client certificate,
    and no second diagnosis (librdkafka reports the broker's TLS alert as a transport
    error, which once read as "broker unreachable")."""
    assert_one_line_exit(code, lines, r"TLS handshake with Kafka at 127\.0\.0\.1:\d+ failed: .*"
                         r"the broker refused the client certificate", secret)
    assert code == 2
    assert not [line for line in lines if "unreachable" in line], "\n".join(lines)


def test_a_client_certificate_from_another_ca_is_one_line_and_a_non_zero_exit(
    secured_kafka: KafkaBroker, secured_topic_factory, unique_group_id: str, tmp_path: Path
) -> None:
    topics = make_topics(secured_topic_factory, 1)
    stranger = make_ca(tmp_path / "other-pki", "another-ca")
    who = certificate_identity(secured_kafka, stranger, tmp_path / "other-pki", "worker", key_file=True)
    secured_kafka.allow(who.principal, documented_worker_acls(topics, unique_group_id))  # the name alone is not enough
    code, lines = wait_exit(start_worker(secured_kafka, topics, unique_group_id, who, tmp_path))
    assert_certificate_refused(code, lines, who.secret)


def test_no_client_certificate_is_one_line_and_a_non_zero_exit(
    secured_kafka: KafkaBroker, kafka_pki: CertFiles, secured_topic_factory, unique_group_id: str, tmp_path: Path
) -> None:
    topics = make_topics(secured_topic_factory, 1)
    full = certificate_identity(secured_kafka, kafka_pki, tmp_path / "pki", "worker", key_file=True)
    secured_kafka.allow(full.principal, documented_worker_acls(topics, unique_group_id))
    bare = Identity(full.principal, full.bootstrap, {
        k: v for k, v in full.settings.items() if k not in ("ssl.certificate.location", "ssl.key.location")})
    code, lines = wait_exit(start_worker(secured_kafka, topics, unique_group_id, bare, tmp_path))
    assert_certificate_refused(code, lines, full.secret)


def test_a_token_without_the_required_scope_is_one_line_and_exit_2(
    secured_kafka: KafkaBroker, secured_topic_factory, unique_group_id: str, tmp_path: Path
) -> None:
    topics = make_topics(secured_topic_factory, 1)
    who = token_identity(secured_kafka, "worker", scope="not-kafka")
    secured_kafka.allow(who.principal, documented_worker_acls(topics, unique_group_id))
    code, lines = wait_exit(start_worker(secured_kafka, topics, unique_group_id, who, tmp_path))
    assert_one_line_exit(code, lines, r"Kafka authentication failed at 127\.0\.0\.1:\d+: .*insufficient_scope")
    assert code == 2
