"""consumers/acl_refusals.py and its callers' pure parts (issue 44): a refusal names
the ACL to grant; `produce` uses an existing topic as it is."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from consumers.acl_refusals import create_refused, describe_refused, not_visible, read_refused
from pipeline.app.produce import DEFAULT_PARTITIONS, topic_partitions
from pipeline.errors import UserError


def test_a_refused_fetch_names_read_on_the_topic() -> None:
    line = read_refused(KafkaError.TOPIC_AUTHORIZATION_FAILED, "ctr.requests.dlq")
    assert line is not None and line.startswith("the principal lacks READ on topic 'ctr.requests.dlq'")
    assert "TOPIC_AUTHORIZATION_FAILED" in line and "docs/OPERATIONS.md" in line


@pytest.mark.parametrize(
    "code",
    # The group: an assign-only reader never needs it, though librdkafka reports it.
    [KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError._PARTITION_EOF, KafkaError._TRANSPORT, KafkaError.NO_ERROR],
)
def test_anything_else_is_left_to_the_caller(code: int) -> None:
    assert read_refused(code, "t") is None


def test_the_topic_lines_name_the_acl_and_no_wrong_fix() -> None:
    hidden = describe_refused("ctr.scores")
    assert "lacks DESCRIBE/WRITE on topic 'ctr.scores'" in hidden and "it may already exist" in hidden
    assert "create" not in hidden.lower()
    assert create_refused("ctr.scores").startswith("cannot create topic 'ctr.scores': the principal lacks CREATE")
    assert "lacks DESCRIBE" in not_visible("t", "h:1")


def test_produce_creates_a_missing_topic_with_the_asked_or_default_count() -> None:
    assert topic_partitions("t", None, None, "h:1") == (DEFAULT_PARTITIONS, None)
    assert topic_partitions("t", None, 6, "h:1") == (6, None)


def test_produce_uses_an_existing_topic_as_it_is_and_says_so_when_it_is_not_the_default() -> None:
    assert topic_partitions("t", 3, None, "h:1") == (None, "topic 't' exists with 3 partitions: sending to it as it is")
    assert topic_partitions("t", DEFAULT_PARTITIONS, None, "h:1") == (None, None)
    assert topic_partitions("t", 3, 3, "h:1") == (None, None)


def test_only_an_explicit_disagreeing_count_is_an_error_and_it_advises_no_delete() -> None:
    with pytest.raises(UserError) as refused:
        topic_partitions("t", 3, 2, "h:1")
    assert str(refused.value).startswith("topic 't' already exists on h:1 with 3 partitions, not 2 (--partitions)")
    assert "delete" not in str(refused.value)
