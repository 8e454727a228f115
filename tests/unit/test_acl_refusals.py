"""consumers/acl_refusals.py (issue 44): a refusal names the ACL to grant."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from consumers.acl_refusals import create_refused, describe_refused, not_visible, read_refused


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
