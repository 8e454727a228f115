"""tidebatch on a secured Apache Kafka: a SASL_SSL listener with SCRAM-SHA-512 users, a
broker certificate from a CA made for the test, and StandardAuthorizer ACLs
(consumers/brokers/kafka_security.py; the `secured_kafka` fixture in conftest.py).

The worker gets exactly the ACLs docs/OPERATIONS.md lists ("The ACLs a worker needs":
this module parses that table) and scores requests end to end; `produce` and
`etl --topic` go through the same listener as users of their own. Each negative test
takes one thing away (the password, the trusted CA, one ACL) and expects one line that
says what is wrong, a non-zero exit, and nothing half done: no result published and
no offset committed past a record whose result was not written.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, TopicPartition

from consumers.brokers.kafka import KafkaBroker
from consumers.brokers.kafka_security import Acl
from consumers.profiles import consumer_config
from tests.integration.certs import make_ca
from tests.integration.opsutil import (
    REPO,
    ResultCollector,
    Topics,
    make_topics,
    produce_ctr,
    start_worker_process,
    wait_for,
    wait_ready,
)
from tests.integration.pipeline_helpers import committed_offsets

OPERATIONS = REPO / "docs" / "OPERATIONS.md"
PASSWORD_ENV = "TB_TEST_KAFKA_PASSWORD"
EXIT_S = 60.0


# ------------------------------------------------------------------ the documented ACLs
def documented_worker_acls(topics: Topics, group: str, *, when: tuple[str, ...] = ("always",),
                           transactional_id: str = "") -> list[Acl]:
    """The rows of docs/OPERATIONS.md's ACL table whose "when" begins with one of `when`
    (every worker needs the "always" rows), placeholders filled in."""
    section = OPERATIONS.read_text().split("### The ACLs a worker needs", 1)[1]
    table = section.split("| resource | name | operation | when |", 1)[1].split("\n\n", 1)[0]
    names = {"<input>": topics.input, "<output>": topics.output, "<dlq>": topics.dlq,
             "<late>": topics.late, "<group>": group, "<transactional.id>": transactional_id,
             "kafka-cluster": "kafka-cluster"}
    acls = []
    for line in table.strip().splitlines()[1:]:  # below the |---| line
        resource, name, operation, condition = (c.strip().strip("`") for c in line.strip().strip("|").split("|"))
        if condition.startswith(when):
            acls.append(Acl(resource, names[name], operation))
    assert len(acls) >= 5, f"no ACL table found in {OPERATIONS}"
    return acls


def test_the_documented_acl_table_names_every_topic_and_the_group() -> None:
    topics = Topics("in", "out", "in.dlq", "in.late")
    acls = documented_worker_acls(topics, "g")
    granted = {(a.resource_type, a.name, a.operation) for a in acls}
    assert {("TOPIC", "in", "READ"), ("GROUP", "g", "READ"), ("TOPIC", "out", "WRITE"),
            ("TOPIC", "in.dlq", "WRITE"), ("TOPIC", "in.late", "WRITE")} <= granted
    assert not [a for a in acls if a.resource_type in ("CLUSTER", "TRANSACTIONAL_ID")]
    eos = documented_worker_acls(topics, "g", when=("always", "delivery: exactly_once"), transactional_id="t")
    assert {(a.resource_type, a.name, a.operation) for a in eos} - granted == {
        ("TRANSACTIONAL_ID", "t", "WRITE"), ("TRANSACTIONAL_ID", "t", "DESCRIBE")}


# ------------------------------------------------------------------ users and commands
@dataclass
class User:
    name: str
    password: str

    @property
    def principal(self) -> str:
        return f"User:{self.name}"


def new_user(kafka: KafkaBroker, role: str, acls: list[Acl]) -> User:
    user = User(f"{role}-{uuid.uuid4().hex[:8]}", f"pw-{uuid.uuid4().hex}")
    kafka.add_scram_user(user.name, user.password)
    kafka.allow(user.principal, acls)
    return user


def x_flags(kafka: KafkaBroker, user: User, *, ca: Path | None = None) -> list[str]:
    """-X settings for the SASL_SSL listener; the password through ${ENV}, as documented."""
    assert kafka.security is not None
    return [
        "-X", "security.protocol=SASL_SSL", "-X", "sasl.mechanism=SCRAM-SHA-512",
        "-X", f"sasl.username={user.name}", "-X", f"sasl.password=${{{PASSWORD_ENV}}}",
        "-X", f"ssl.ca.location={ca or kafka.security.ca}",
    ]


def cli(*args: str, password: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, PASSWORD_ENV: password}
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args], cwd=REPO, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
    )


def start_secured_worker(kafka: KafkaBroker, topics: Topics, group: str, user: User, tmp_path: Path,
                         *, ca: Path | None = None, password: str | None = None, args: tuple[str, ...] = (),
                         **env: str):
    return start_worker_process(
        kafka, topics, group, tmp_path, f"worker-{user.name}",
        args=("--bootstrap-servers", kafka.secure_bootstrap_servers, *x_flags(kafka, user, ca=ca),
              "--kafka-connect-timeout", "20", *args),
        **{PASSWORD_ENV: password if password is not None else user.password, **env},
    )


def wait_exit(worker, timeout: float = EXIT_S) -> tuple[int, list[str]]:
    try:
        code = worker.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        worker.stop()
        raise AssertionError(f"the worker did not exit within {timeout:g} s:\n{worker.log_tail()}") from None
    return code, worker.log_path.read_text(errors="replace").splitlines()


def assert_one_line_exit(code: int, lines: list[str], pattern: str, secret: str) -> None:
    shown = "\n".join(lines)
    assert code != 0, shown
    assert re.search(pattern, lines[-1]), shown
    assert not [line for line in lines if line.startswith("%")], shown  # no raw librdkafka line
    assert secret not in shown, "the password was printed"


def end_offset(kafka: KafkaBroker, topic: str) -> int:
    """How many records `topic` (one partition) holds, asked through the PLAINTEXT listener."""
    consumer = Consumer(consumer_config("kafka", kafka.bootstrap_servers, f"probe-{uuid.uuid4().hex[:8]}"))
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    finally:
        consumer.close()


# ------------------------------------------------------------------ end to end
def test_worker_produce_and_etl_work_through_sasl_ssl_with_the_documented_acls(
    secured_kafka: KafkaBroker, secured_topic_factory, unique_group_id: str, tmp_path: Path
) -> None:
    topics = make_topics(secured_topic_factory, 2)
    worker_user = new_user(secured_kafka, "worker", documented_worker_acls(topics, unique_group_id))
    producer_user = new_user(secured_kafka, "producer", [Acl("TOPIC", topics.input, "WRITE")])
    etl_user = new_user(secured_kafka, "etl", [Acl("TOPIC", topics.input, "READ")])

    worker = start_secured_worker(secured_kafka, topics, unique_group_id, worker_user, tmp_path)
    results = ResultCollector(secured_kafka.bootstrap_servers, topics.output)
    try:
        wait_ready(worker.url, timeout=90)
        produced = cli(
            "produce", "ctr", "--bootstrap-servers", secured_kafka.secure_bootstrap_servers,
            "--topic", topics.input, "--partitions", "2", "--count", "1200", "--rate", "4000",
            *x_flags(secured_kafka, producer_user), password=producer_user.password,
        )
        assert produced.returncode == 0, produced.stdout
        assert "\r" not in produced.stdout  # progress is for terminals, not `docker logs`
        wait_for(lambda: len(results.counts) >= 1200, 90, "1200 results")
    finally:
        code = worker.stop()
        results.close()
    printed = worker.log_path.read_text(errors="replace")
    assert code == 0, worker.log_tail()
    assert worker_user.password not in printed and producer_user.password not in produced.stdout
    assert results.duplicates() == 0
    committed = committed_offsets(secured_kafka.bootstrap_servers, unique_group_id, topics.input, 2)
    assert sum(committed.values()) == 1200, committed

    out = tmp_path / "etl"
    etl = cli(
        "etl", "--topic", topics.input, "--bootstrap-servers", secured_kafka.secure_bootstrap_servers,
        "-o", str(out), "--no-progress", *x_flags(secured_kafka, etl_user), password=etl_user.password,
    )
    assert etl.returncode == 0, etl.stdout
    assert "1,200 records read, 0 rejected" in etl.stdout, etl.stdout
    request_ids = {r for p in out.rglob("*.parquet") for r in pq.read_table(p, columns=["request_id"])["request_id"].to_pylist()}
    assert len(request_ids) == 1200, etl.stdout


def test_exactly_once_and_topic_creation_need_only_their_documented_acls(
    secured_kafka: KafkaBroker, unique_group_id: str, tmp_path: Path
) -> None:
    base = f"sec-eos-{uuid.uuid4().hex[:10]}"
    topics = Topics(base, f"{base}-res", f"{base}.dlq", f"{base}.late")  # none exists yet
    txn_id = f"tb-{base}"
    acls = documented_worker_acls(
        topics, unique_group_id, transactional_id=txn_id,
        when=("always", "delivery: exactly_once", "create_topics: true"),
    )
    user = new_user(secured_kafka, "worker", acls)
    worker = start_secured_worker(
        secured_kafka, topics, unique_group_id, user, tmp_path, args=("--delivery", "exactly_once"),
        TIDEBATCH_CREATE_TOPICS="true", TIDEBATCH_TRANSACTIONAL_ID=txn_id, TIDEBATCH_PARTITIONS="1",
    )
    results = ResultCollector(secured_kafka.bootstrap_servers, topics.output)  # read_committed
    try:
        wait_ready(worker.url, timeout=90)
        ids = produce_ctr(secured_kafka.bootstrap_servers, topics.input, 100)
        wait_for(lambda: len(results.counts) >= 100, 90, "100 committed results")
    finally:
        code = worker.stop()
        results.close()
        secured_kafka.delete_topics([topics.input, topics.output, topics.dlq, topics.late])
    assert code == 0, worker.log_tail()
    assert not results.missing(ids) and results.duplicates() == 0


# ------------------------------------------------------------------ refused at the door
def test_a_wrong_password_is_one_line_and_exit_2(
    secured_kafka: KafkaBroker, secured_topic_factory, unique_group_id: str, tmp_path: Path
) -> None:
    topics = make_topics(secured_topic_factory, 1)
    user = new_user(secured_kafka, "worker", documented_worker_acls(topics, unique_group_id))
    wrong = f"wrong-{uuid.uuid4().hex}"
    worker = start_secured_worker(secured_kafka, topics, unique_group_id, user, tmp_path, password=wrong)
    code, lines = wait_exit(worker)
    assert_one_line_exit(code, lines, r"Kafka authentication failed at 127\.0\.0\.1:\d+", wrong)
    assert code == 2
    assert not [line for line in lines if "unreachable" in line], "\n".join(lines)  # not a second diagnosis


def test_a_wrong_password_with_kafka_python_is_the_same_line_at_once(
    secured_kafka: KafkaBroker, secured_topic_factory, unique_group_id: str, tmp_path: Path
) -> None:
    # Before: after 10.9 s, "cannot read Kafka metadata ... Broker transport failure",
    # no word of authentication (kafka-python only logs the refused login and retries).
    topics = make_topics(secured_topic_factory, 1)
    user = new_user(secured_kafka, "worker", documented_worker_acls(topics, unique_group_id))
    wrong = f"wrong-{uuid.uuid4().hex}"
    worker = start_secured_worker(secured_kafka, topics, unique_group_id, user, tmp_path, password=wrong,
                                  args=("--client", "kafka-python"))
    code, lines = wait_exit(worker)
    assert_one_line_exit(code, lines, r"Kafka authentication failed at 127\.0\.0\.1:\d+", wrong)
    assert code == 2
    assert not [line for line in lines if "Kafka authentication failed" in line][:-1], "\n".join(lines)  # once


def test_an_untrusted_broker_certificate_is_one_line_and_exit_2(
    secured_kafka: KafkaBroker, secured_topic_factory, unique_group_id: str, tmp_path: Path
) -> None:
    topics = make_topics(secured_topic_factory, 1)
    user = new_user(secured_kafka, "worker", documented_worker_acls(topics, unique_group_id))
    other_ca = make_ca(tmp_path / "other-pki", "another-ca")
    worker = start_secured_worker(secured_kafka, topics, unique_group_id, user, tmp_path, ca=other_ca.cert)
    code, lines = wait_exit(worker)
    assert_one_line_exit(code, lines, r"TLS handshake with Kafka at 127\.0\.0\.1:\d+ failed", user.password)
    assert code == 2
    assert not [line for line in lines if "unreachable" in line], "\n".join(lines)


# ------------------------------------------------------------------ one ACL missing
@pytest.mark.parametrize(
    ("missing", "says"),
    [
        (("TOPIC", "<input>", "READ"), r"Kafka topic authorization failed"),
        (("GROUP", "<group>", "READ"), r"Kafka group authorization failed"),
        (("TOPIC", "<output>", "WRITE"), r"Kafka topic authorization failed"),
    ],
    ids=["no-read-on-input", "no-group-acl", "no-write-on-output"],
)
def test_a_missing_acl_stops_the_worker_with_one_line_and_commits_nothing(
    missing: tuple[str, str, str], says: str,
    secured_kafka: KafkaBroker, secured_topic_factory, unique_group_id: str, tmp_path: Path,
) -> None:
    topics = make_topics(secured_topic_factory, 1)
    names = {"<input>": topics.input, "<output>": topics.output, "<group>": unique_group_id}
    taken = Acl(missing[0], names[missing[1]], missing[2])
    acls = [a for a in documented_worker_acls(topics, unique_group_id) if a != taken]
    assert len(acls) == len(documented_worker_acls(topics, unique_group_id)) - 1
    user = new_user(secured_kafka, "worker", acls)
    produce_ctr(secured_kafka.bootstrap_servers, topics.input, 50)  # requests waiting

    worker = start_secured_worker(secured_kafka, topics, unique_group_id, user, tmp_path)
    code, lines = wait_exit(worker)
    assert_one_line_exit(code, lines, says, user.password)
    assert code == 1
    assert end_offset(secured_kafka, topics.output) == 0, "results were published"
    committed = committed_offsets(secured_kafka.bootstrap_servers, unique_group_id, topics.input, 1)
    assert all(offset < 0 for offset in committed.values()), f"offsets committed: {committed}"
