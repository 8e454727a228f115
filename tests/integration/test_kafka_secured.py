"""tidebatch on a secured Apache Kafka: a SASL_SSL listener with SCRAM-SHA-512 users, a
broker certificate from a CA made for the test, and StandardAuthorizer ACLs
(consumers/brokers/kafka_security.py; the `secured_kafka` fixture in conftest.py).

The worker gets exactly the ACLs docs/OPERATIONS.md lists ("The ACLs a worker needs":
secured_helpers.py parses that table) and scores requests end to end; `produce` and
`etl --topic` go through the same listener as users of their own. Each negative test
takes one thing away (the password, the trusted CA, one ACL) and expects one line that
says what is wrong, a non-zero exit, and nothing half done: no result published and
no offset committed past a record whose result was not written.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from consumers.brokers.kafka import KafkaBroker
from consumers.brokers.kafka_security import Acl
from tests.integration.certs import make_ca
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
    OPERATIONS,
    PASSWORD_ENV,
    assert_one_line_exit,
    cli,
    documented_worker_acls,
    end_offset,
    wait_exit,
)


# ------------------------------------------------------------------ the documented ACLs
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


def kafka_acls_commands() -> list[list[str]]:
    """The `kafka-acls.sh` commands of docs/OPERATIONS.md's ACL section, each as its
    arguments (shell line continuations joined)."""
    section = OPERATIONS.read_text().split("### The ACLs a worker needs", 1)[1].split("\n### ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    commands = [line.split() for line in block.splitlines() if line.startswith("kafka-acls.sh")]
    assert commands, f"no kafka-acls.sh example in {OPERATIONS}'s ACL section"
    return commands


# kafka-acls.sh's convenience options, as the ACLs it adds (its --help): --consumer is
# READ and DESCRIBE on each --topic and READ on each --group.
_CONVENIENCE = {"--consumer": {"TOPIC": ("READ", "DESCRIBE"), "GROUP": ("READ",)}}


def granted_by(command: list[str]) -> set[tuple[str, str, str]]:
    """(resource, name, operation) that one kafka-acls.sh --add command grants."""
    names: dict[str, list[str]] = {"TOPIC": [], "GROUP": []}
    operations: list[str] = []
    convenience: dict[str, tuple[str, ...]] = {}
    for flag, value in zip(command, [*command[1:], ""], strict=True):
        if flag in ("--topic", "--group"):
            names[flag[2:].upper()].append(value)
        elif flag == "--operation":  # Write, DescribeConfigs -> WRITE, DESCRIBE_CONFIGS
            operations.append(re.sub(r"(?<!^)(?=[A-Z])", "_", value).upper())
        elif flag in _CONVENIENCE:
            convenience = _CONVENIENCE[flag]
    out = set()
    for resource, resource_names in names.items():
        for name in resource_names:
            for op in (*convenience.get(resource, ()), *(operations if resource == "TOPIC" else ())):
                out.add((resource, name, op))
    return out


def test_the_kafka_acls_example_grants_what_the_table_says_for_the_ctr_defaults() -> None:
    # Issue 44: the example granted WRITE on ctr.results; the ctr worker writes ctr.scores.
    from pipeline.config import load_config
    from pipeline.registry.pipelines import pipeline_for

    cfg = load_config(None, {"pipeline": "ctr"}, environ={})
    spec = pipeline_for(cfg)
    topics = Topics(spec.input_topic, spec.output_topic, f"{spec.input_topic}.dlq", f"{spec.input_topic}.late")
    group = f"tidebatch-{cfg.pipeline}"  # the worker's default group (pipeline/app/compose.py)
    table = {(a.resource_type, a.name, a.operation) for a in documented_worker_acls(topics, group)}
    example = set().union(*(granted_by(c) for c in kafka_acls_commands()))
    assert table - example == set(), "rows of the table the kafka-acls.sh example does not grant"
    # More than the table only where the table says READ/WRITE imply it: DESCRIBE.
    extra = {(r, n, op) for r, n, op in example - table if op != "DESCRIBE"}
    assert extra == set(), "the kafka-acls.sh example grants what the table does not"
    assert {n for _, n, _ in example} <= {n for _, n, _ in table}, "the example names a topic or group the worker does not use"


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


def start_secured_worker(kafka: KafkaBroker, topics: Topics, group: str, user: User, tmp_path: Path,
                         *, ca: Path | None = None, password: str | None = None, args: tuple[str, ...] = (),
                         **env: str):
    return start_worker_process(
        kafka, topics, group, tmp_path, f"worker-{user.name}",
        args=("--bootstrap-servers", kafka.secure_bootstrap_servers, *x_flags(kafka, user, ca=ca),
              "--kafka-connect-timeout", "20", *args),
        **{PASSWORD_ENV: password if password is not None else user.password, **env},
    )


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


# ------------------------------------------------------------------ issue 44: which ACL is missing
# Each of these once said something else: a fetch timeout after 30 s for a missing READ,
# "cannot create topic" for a topic that exists, a refusal of an admin's topic for its
# partition count. Each must name the ACL (or the fix) in one line, exit 2.
def test_etl_and_dlq_inspect_without_read_name_the_missing_acl(
    secured_kafka: KafkaBroker, secured_topic_factory, tmp_path: Path
) -> None:
    topic = secured_topic_factory("sec-noread")
    produce_ctr(secured_kafka.bootstrap_servers, topic, 20)
    # WRITE implies DESCRIBE: the topic is listed, its fetches are refused (a worker's
    # principal inspecting the dead-letter topic it writes).
    writer = new_user(secured_kafka, "writer", [Acl("TOPIC", topic, "WRITE")])
    refused = rf"the principal lacks READ on topic '{re.escape(topic)}' \(TOPIC_AUTHORIZATION_FAILED"
    secure = secured_kafka.secure_bootstrap_servers
    for args in (
        ("etl", "--topic", topic, "--bootstrap-servers", secure, "-o", str(tmp_path / "etl"), "--no-progress"),
        ("dlq", "inspect", "--topic", topic, "--bootstrap-servers", secure),
    ):
        done = cli(*args, *x_flags(secured_kafka, writer), password=writer.password)
        lines = done.stdout.splitlines()
        assert_one_line_exit(done.returncode, lines, refused, writer.password)
        assert done.returncode == 2, done.stdout
        assert "did not answer" not in done.stdout, done.stdout

    # No ACL on it at all: Kafka leaves the topic out of the listing, so absent and
    # hidden look alike; the line says both.
    stranger = new_user(secured_kafka, "stranger", [Acl("TOPIC", f"{topic}-other", "READ")])
    done = cli("dlq", "inspect", "--topic", topic, "--bootstrap-servers", secure,
               *x_flags(secured_kafka, stranger), password=stranger.password)
    assert_one_line_exit(done.returncode, done.stdout.splitlines(),
                         rf"topic '{re.escape(topic)}' not found .* lacks DESCRIBE on it", stranger.password)
    assert done.returncode == 2, done.stdout


@pytest.mark.parametrize("with_create", [True, False], ids=["cluster-create", "no-create"])
def test_create_topics_blames_the_missing_write_not_creation_for_an_existing_topic(
    with_create: bool, secured_kafka: KafkaBroker, secured_topic_factory, unique_group_id: str, tmp_path: Path,
) -> None:
    topics = make_topics(secured_topic_factory, 1)  # all four exist, made by an admin
    when = ("always", "create_topics: true") if with_create else ("always",)
    taken = Acl("TOPIC", topics.output, "WRITE")
    acls = [a for a in documented_worker_acls(topics, unique_group_id, when=when) if a != taken]
    user = new_user(secured_kafka, "worker", acls)
    worker = start_secured_worker(secured_kafka, topics, unique_group_id, user, tmp_path, TIDEBATCH_CREATE_TOPICS="true")
    code, lines = wait_exit(worker)
    assert_one_line_exit(
        code, lines, rf"the principal lacks DESCRIBE/WRITE on topic '{re.escape(topics.output)}' .*it may already exist",
        user.password,
    )
    assert code == 2
    assert not [line for line in lines if "cannot create" in line], "\n".join(lines)


def test_create_topics_blames_creation_only_for_a_topic_that_does_not_exist(
    secured_kafka: KafkaBroker, secured_topic_factory, unique_group_id: str, tmp_path: Path,
) -> None:
    made = make_topics(secured_topic_factory, 1)
    topics = Topics(made.input, f"{made.output}-absent", made.dlq, made.late)
    user = new_user(secured_kafka, "worker", documented_worker_acls(topics, unique_group_id))  # no CREATE
    worker = start_secured_worker(secured_kafka, topics, unique_group_id, user, tmp_path, TIDEBATCH_CREATE_TOPICS="true")
    code, lines = wait_exit(worker)
    assert_one_line_exit(
        code, lines, rf"cannot create topic '{re.escape(topics.output)}': the principal lacks CREATE on the cluster",
        user.password,
    )
    assert code == 2


def test_produce_uses_an_existing_topic_as_it_is(secured_kafka: KafkaBroker, secured_topic_factory) -> None:
    topic = secured_topic_factory("sec-admins", 3)  # made by an admin, not with produce's default 4
    producer = new_user(secured_kafka, "producer", [Acl("TOPIC", topic, "WRITE")])
    common = ("produce", "ctr", "--bootstrap-servers", secured_kafka.secure_bootstrap_servers,
              "--topic", topic, "--count", "30", "--rate", "1000", *x_flags(secured_kafka, producer))
    done = cli(*common, password=producer.password)
    assert done.returncode == 0, done.stdout
    assert f"topic '{topic}' exists with 3 partitions" in done.stdout, done.stdout
    assert sum(end_offset(secured_kafka, topic, p) for p in range(3)) == 30

    said = cli(*common, "--partitions", "3", password=producer.password)  # agreeing: no line
    assert said.returncode == 0 and "exists with" not in said.stdout, said.stdout

    wrong = cli(*common, "--partitions", "2", password=producer.password)
    lines = wrong.stdout.splitlines()
    assert_one_line_exit(wrong.returncode, lines, rf"'{re.escape(topic)}' already exists .* with 3 partitions, not 2 "
                         r"\(--partitions\): leave --partitions out", producer.password)
    assert wrong.returncode == 2 and "delete" not in wrong.stdout, wrong.stdout

