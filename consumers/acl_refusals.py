"""The one line for a request the broker refused because the principal lacks an ACL,
naming the ACL to grant, for the commands that read or create topics themselves
(`etl --topic`, `dlq`: pipeline/etl/topic.py; topic creation: consumers/admin.py).

Pure: no client. The worker's own consumer and producer report refusals through
consumers/kafka_failures.py; these lines say more because the caller knows what it
asked for (READ to fetch, DESCRIBE to see, CREATE to create). They never name the
principal: its user name may be a secret (consumers/client_settings.py).
"""

from __future__ import annotations

from confluent_kafka import KafkaError

ACL_DOC = "docs/OPERATIONS.md lists the ACLs each command needs"

TOPIC_REFUSED = KafkaError.TOPIC_AUTHORIZATION_FAILED


def read_refused(code: int, topic: str) -> str | None:
    """The line for a fetch of `topic` refused with `code`; None when `code` is no
    topic authorization failure, which the caller handles as before. A group refusal
    is not one here: these readers assign partitions and never need their group, yet
    librdkafka still looks up its coordinator and reports GROUP_AUTHORIZATION_FAILED
    to a principal without an ACL on it (measured against StandardAuthorizer)."""
    if code == TOPIC_REFUSED:
        return f"the principal lacks READ on topic {topic!r} (TOPIC_AUTHORIZATION_FAILED; {ACL_DOC})"
    return None


def not_visible(topic: str, where: str) -> str:
    """A topic a full metadata listing leaves out: absent, or hidden from a principal
    without DESCRIBE on it (Kafka lists only the topics one may describe)."""
    return f"topic {topic!r} not found on {where} (or the principal lacks DESCRIBE on it; {ACL_DOC})"


def describe_refused(topic: str) -> str:
    """A topic the broker will not describe: it may exist, so creating it is not the fix."""
    return (
        f"the principal lacks DESCRIBE/WRITE on topic {topic!r} "
        f"(TOPIC_AUTHORIZATION_FAILED; it may already exist; {ACL_DOC})"
    )


def create_refused(topic: str) -> str:
    """A topic the broker says does not exist, and will not let the principal create."""
    return (
        f"cannot create topic {topic!r}: the principal lacks CREATE on the cluster "
        f"(the topic does not exist; create it beforehand or grant CREATE; {ACL_DOC})"
    )
