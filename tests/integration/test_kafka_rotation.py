"""A SCRAM password rotated on the broker under a running worker
(consumers/credential_refresh.py; docs/OPERATIONS.md, "Rotating credentials").

The secured broker has `connections.max.reauth.ms`, so every live connection must log
in again within it (KIP-368). The worker reads its password from `@file:`. Rotated with
the file rewritten first, the same process goes on and every request is scored once;
rotated on the broker alone (or with a wrong password in the file), the worker stops
with one line and a non-zero exit, having committed nothing past a request without a
result. A delivery exactly_once worker stops either way and its restart goes on.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from consumers.brokers.kafka import KafkaBroker
from tests.integration.opsutil import (
    ResultCollector,
    make_topics,
    produce_ctr,
    wait_for,
    wait_ready,
)
from tests.integration.pipeline_helpers import committed_offsets
from tests.integration.test_kafka_secured import (
    assert_one_line_exit,
    documented_worker_acls,
    new_user,
    start_secured_worker,
    wait_exit,
)

# Short, so a rotation reaches the live connections within a test; Kafka's default (0)
# never makes a connection log in again.
REAUTH_MS = 4000
pytestmark = pytest.mark.parametrize(
    "secured_kafka", [{"connections.max.reauth.ms": str(REAUTH_MS)}], indirect=True, ids=["reauth"]
)
HANDED_OVER = "now log in with the new ones"


def write_secret(path: Path, value: str) -> None:
    """As a mounted Secret changes: the new content appears whole (rename)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(value + "\n")
    tmp.replace(path)


def start_with_file(secured_kafka: KafkaBroker, topics, group: str, user, tmp_path: Path,
                    args: tuple[str, ...] = (), password: str | None = None, **env: str):
    """A worker whose password is `@file:` (holding `password`, else the user's)."""
    secret = tmp_path / "kafka-password"
    write_secret(secret, password or user.password)
    # -X wins over start_secured_worker's ${ENV} password, whose variable is set to a
    # wrong one: only the file can log the worker in.
    worker = start_secured_worker(
        secured_kafka, topics, group, user, tmp_path, password=f"wrong-{uuid.uuid4().hex}",
        args=("-X", f"sasl.password=@file:{secret}", *args), **env,
    )
    return worker, secret


def test_a_rotation_with_the_file_rewritten_goes_on_in_the_same_process(
    secured_kafka: KafkaBroker, secured_topic_factory, unique_group_id: str, tmp_path: Path
) -> None:
    topics = make_topics(secured_topic_factory, 1)
    user = new_user(secured_kafka, "worker", documented_worker_acls(topics, unique_group_id))
    worker, secret = start_with_file(secured_kafka, topics, unique_group_id, user, tmp_path)
    results = ResultCollector(secured_kafka.bootstrap_servers, topics.output)
    new_password = f"pw-{uuid.uuid4().hex}"
    try:
        wait_ready(worker.url, timeout=90)
        pid = worker.proc.pid
        ids = produce_ctr(secured_kafka.bootstrap_servers, topics.input, 200, seed=1)
        wait_for(lambda: len(results.counts) >= 200, 90, "200 results before the rotation")

        write_secret(secret, new_password)  # the Secret first, then the broker
        secured_kafka.add_scram_user(user.name, new_password)
        ids += produce_ctr(secured_kafka.bootstrap_servers, topics.input, 200, seed=2, start=200)
        wait_for(lambda: HANDED_OVER in worker.log_path.read_text(errors="replace") or worker.proc.poll() is not None,
                 60, "the worker to log in with the new password")
        assert worker.proc.poll() is None, worker.log_tail()
        ids += produce_ctr(secured_kafka.bootstrap_servers, topics.input, 200, seed=3, start=400)
        wait_for(lambda: len(results.counts) >= 600, 90, "600 results")
        assert worker.proc.poll() is None and worker.proc.pid == pid, worker.log_tail()
        wait_ready(worker.url, timeout=10)
    finally:
        code = worker.stop()
        results.close()
    printed = worker.log_path.read_text(errors="replace")
    assert code == 0, worker.log_tail()
    assert user.password not in printed and new_password not in printed, "a password was printed"
    assert not results.missing(ids) and results.duplicates() == 0
    committed = committed_offsets(secured_kafka.bootstrap_servers, unique_group_id, topics.input, 1)
    assert sum(committed.values()) == 600, committed


@pytest.mark.parametrize(
    ("file_gets", "says"),
    [
        (None, r"they have not changed here"),
        ("a wrong password", r"the new ones were refused too"),
    ],
    ids=["file-unchanged", "file-wrong"],
)
def test_a_rotation_the_file_does_not_follow_stops_the_worker_with_one_line(
    file_gets: str | None, says: str,
    secured_kafka: KafkaBroker, secured_topic_factory, unique_group_id: str, tmp_path: Path,
) -> None:
    topics = make_topics(secured_topic_factory, 1)
    user = new_user(secured_kafka, "worker", documented_worker_acls(topics, unique_group_id))
    worker, secret = start_with_file(secured_kafka, topics, unique_group_id, user, tmp_path)
    results = ResultCollector(secured_kafka.bootstrap_servers, topics.output)
    new_password, wrong = f"pw-{uuid.uuid4().hex}", f"wrong-{uuid.uuid4().hex}"
    try:
        wait_ready(worker.url, timeout=90)
        ids = produce_ctr(secured_kafka.bootstrap_servers, topics.input, 100, seed=4)
        wait_for(lambda: len(results.counts) >= 100, 90, "100 results before the rotation")
        if file_gets is not None:
            write_secret(secret, wrong)
        secured_kafka.add_scram_user(user.name, new_password)
        ids += produce_ctr(secured_kafka.bootstrap_servers, topics.input, 100, seed=5, start=100)
        code, lines = wait_exit(worker, timeout=90)
        wait_for(lambda: len(results.counts) >= 100, 10, "the results seen before")
    finally:
        worker.stop()
        results.close()
    assert_one_line_exit(
        code, lines, r"Kafka authentication failed at 127\.0\.0\.1:\d+ after the credentials changed on the broker: "
        + says + r" \(sasl\.password from @file:", new_password,
    )
    shown = "\n".join(lines)
    assert user.password not in shown and wrong not in shown, "a password was printed"
    # Nothing committed past a request without a result (one partition: offset = index).
    committed = committed_offsets(secured_kafka.bootstrap_servers, unique_group_id, topics.input, 1)[0]
    assert committed >= 0, "the results scored before the rotation were not committed"
    assert not results.missing(ids[:committed]), f"committed {committed} past a request without a result"


def test_an_exactly_once_worker_stops_and_its_restart_logs_in_with_the_new_password(
    secured_kafka: KafkaBroker, secured_topic_factory, unique_group_id: str, tmp_path: Path
) -> None:
    """delivery exactly_once does not hand the new password over (pipeline/kafka_backend.py
    credential_refresh says why): one line, exit 1, and the restarted worker reads the
    rewritten file and scores everything once."""
    topics = make_topics(secured_topic_factory, 1)
    txn_id = f"tb-{unique_group_id}"
    acls = documented_worker_acls(topics, unique_group_id, when=("always", "delivery: exactly_once"),
                                  transactional_id=txn_id)
    user = new_user(secured_kafka, "worker", acls)
    eos = (("--delivery", "exactly_once"), {"TIDEBATCH_TRANSACTIONAL_ID": txn_id})
    worker, secret = start_with_file(secured_kafka, topics, unique_group_id, user, tmp_path, eos[0], **eos[1])
    results = ResultCollector(secured_kafka.bootstrap_servers, topics.output)  # read_committed
    new_password = f"pw-{uuid.uuid4().hex}"
    again = None
    try:
        wait_ready(worker.url, timeout=90)
        ids = produce_ctr(secured_kafka.bootstrap_servers, topics.input, 200, seed=6)
        wait_for(lambda: len(results.counts) >= 200, 90, "200 results before the rotation")
        write_secret(secret, new_password)
        secured_kafka.add_scram_user(user.name, new_password)
        ids += produce_ctr(secured_kafka.bootstrap_servers, topics.input, 200, seed=7, start=200)
        code, lines = wait_exit(worker, timeout=90)
        assert_one_line_exit(
            code, lines, r"after the credentials changed on the broker: the new ones are there \(sasl\.password "
            r"from @file:.*\), but a delivery exactly_once worker does not change them while running", new_password,
        )
        again, _ = start_with_file(secured_kafka, topics, unique_group_id, user, tmp_path, eos[0],
                                   password=new_password, **eos[1])
        wait_ready(again.url, timeout=90)
        wait_for(lambda: len(results.counts) >= 400, 90, "400 results after the restart")
    finally:
        worker.stop()
        code = again.stop() if again is not None else None
        results.close()
    assert again is not None and code == 0, again.log_tail() if again else "no restart"
    assert not results.missing(ids) and results.duplicates() == 0
    assert sum(committed_offsets(secured_kafka.bootstrap_servers, unique_group_id, topics.input, 1).values()) == 400
