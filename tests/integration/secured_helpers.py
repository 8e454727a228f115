"""Helpers shared by the tests on the secured Apache Kafka (the `secured_kafka` fixture:
test_kafka_secured.py for SCRAM, test_kafka_mtls_oauth.py for client certificates and
OAUTHBEARER): the ACLs docs/OPERATIONS.md documents, the CLI as a subprocess, and the
checks of a refused start."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid

from confluent_kafka import Consumer, TopicPartition

from consumers.brokers.kafka import KafkaBroker
from consumers.brokers.kafka_security import Acl
from consumers.profiles import consumer_config
from tests.integration.opsutil import REPO, Topics

OPERATIONS = REPO / "docs" / "OPERATIONS.md"
PASSWORD_ENV = "TB_TEST_KAFKA_PASSWORD"
EXIT_S = 60.0
# secured_kafka's MTLS listener maps a subject "CN=<name>,OU=mapped,O=tidebatch-test"
# to principal User:<name>; any other stays its whole subject (User:CN=<name>).
MAPPED_SUBJECT_PREFIX = "/O=tidebatch-test/OU=mapped"
PRINCIPAL_MAPPING_RULES = "RULE:^CN=([^,]+),OU=mapped,O=tidebatch-test$/$1/,DEFAULT"


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


def cli(*args: str, password: str = "", timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m pipeline.cli ARGS`, stdout and stderr together; `password` in
    $TB_TEST_KAFKA_PASSWORD (for `sasl.password=${TB_TEST_KAFKA_PASSWORD}`), `env` added."""
    full_env = {**os.environ, PASSWORD_ENV: password, **env}
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args], cwd=REPO, env=full_env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
    )


def wait_exit(worker, timeout: float = EXIT_S) -> tuple[int, list[str]]:
    """A WorkerProcess (opsutil.py) expected to stop on its own: its exit code and log."""
    try:
        code = worker.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        worker.stop()
        raise AssertionError(f"the worker did not exit within {timeout:g} s:\n{worker.log_tail()}") from None
    return code, worker.log_path.read_text(errors="replace").splitlines()


def assert_one_line_exit(code: int, lines: list[str], pattern: str, secret: str = "") -> None:
    """A non-zero exit whose last line matches `pattern`, no raw librdkafka line, and
    `secret` (a password, a key) nowhere."""
    shown = "\n".join(lines)
    assert code != 0, shown
    assert re.search(pattern, lines[-1]), shown
    assert not [line for line in lines if line.startswith("%")], shown  # no raw librdkafka line
    assert not secret or secret not in shown, "the secret was printed"


def end_offset(kafka: KafkaBroker, topic: str, partition: int = 0) -> int:
    """How many records `topic`'s `partition` holds, asked through the PLAINTEXT listener."""
    consumer = Consumer(consumer_config("kafka", kafka.bootstrap_servers, f"probe-{uuid.uuid4().hex[:8]}"))
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1]
    finally:
        consumer.close()
