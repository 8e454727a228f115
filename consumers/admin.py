"""Topic administration that works against any Kafka-protocol broker (Apache Kafka or
the embedded Tansu broker).

Why explicit creation matters: on Tansu a producer's metadata request auto-creates a
missing topic with 4 partitions, and `AdminClient.list_topics(topic=X)` auto-creates X
(docs/BROKERS.md). So topics are created here, with their final partition count,
before any client touches them, and metadata is only ever read with the no-argument
`list_topics()`, which creates nothing.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient, NewTopic

from consumers.acl_refusals import create_refused, describe_refused
from consumers.profiles import admin_config
from pipeline.errors import UserError

# Kafka's own rule for topic names (kafka.common.internals.Topic).
_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
# Poll interval while waiting for metadata to settle; short because the embedded
# broker answers in well under a millisecond, and bounded by a deadline anyway.
_POLL_S = 0.05

TopicSpecs = str | Mapping[str, int] | Iterable[str | tuple[str, int]]


class AdminError(UserError):
    """A topic cannot be created, verified or deleted as asked."""


def parse_topic_spec(spec: str, default_partitions: int = 1) -> tuple[str, int]:
    """Parse `NAME` or `NAME:PARTITIONS` (a ':' can never be part of a Kafka topic name)."""
    name, sep, count = spec.partition(":")
    partitions = default_partitions
    if sep:
        try:
            partitions = int(count)
        except ValueError:
            raise AdminError(
                f"bad topic spec {spec!r}: expected NAME or NAME:PARTITIONS (e.g. requests:6)"
            ) from None
    validate_topic(name, partitions)
    return name, partitions


def validate_topic(name: str, partitions: int) -> None:
    if not _TOPIC_NAME.match(name) or name in (".", ".."):
        raise AdminError(
            f"bad topic name {name!r}: use 1-249 characters from a-z A-Z 0-9 . _ -"
        )
    if partitions < 1:
        raise AdminError(f"topic {name!r}: partitions must be >= 1, got {partitions}")


def normalize_topics(specs: TopicSpecs, partitions: int = 1) -> dict[str, int]:
    """Turn a name, `NAME:N` string, (name, n) pair, list of those, or {name: n} into {name: n}."""
    if isinstance(specs, str):
        specs = [specs]
    items: Iterable[Any] = specs.items() if isinstance(specs, Mapping) else specs
    wanted: dict[str, int] = {}
    for item in items:
        if isinstance(item, str):
            name, count = parse_topic_spec(item, partitions)
        else:
            name, count = item
            validate_topic(name, int(count))
        if wanted.get(name, count) != count:
            raise AdminError(f"topic {name!r} requested with {wanted[name]} and {count} partitions")
        wanted[name] = int(count)
    return wanted


def _admin(bootstrap_servers: str, config: Mapping[str, Any] | None) -> AdminClient:
    return AdminClient(admin_config(bootstrap_servers, config))


def _partition_counts(admin: AdminClient, timeout: float) -> dict[str, int]:
    """{topic: partition count} for topics whose metadata is complete (every partition led).
    Never passes a topic to list_topics: that auto-creates it on Tansu."""
    try:
        metadata = admin.list_topics(timeout=max(timeout, 0.1))
    except KafkaException as exc:
        raise AdminError(f"cannot read Kafka metadata: {exc.args[0]}") from None
    counts: dict[str, int] = {}
    for name, topic in metadata.topics.items():
        if topic.error is not None:
            continue
        if all(p.error is None and p.leader >= 0 for p in topic.partitions.values()):
            counts[name] = len(topic.partitions)
    return counts


def _check_counts(wanted: Mapping[str, int], counts: Mapping[str, int], where: str) -> None:
    for name, partitions in wanted.items():
        have = counts.get(name)
        if have is not None and have != partitions:
            raise AdminError(
                f"topic {name!r} already exists on {where} with {have} partitions, "
                f"not {partitions}: ask for {have} (partitions cannot be changed in place)"
            )


def ensure_topics(
    bootstrap_servers: str,
    topics: TopicSpecs,
    timeout: float = 30.0,
    *,
    replication_factor: int = -1,
    topic_config: Mapping[str, str] | None = None,
    admin_config: Mapping[str, Any] | None = None,
) -> dict[str, int]:
    """Make sure each topic exists with exactly the given partition count.

    Creates missing topics, accepts existing ones with the right count, and raises
    AdminError (one line) when an existing topic has a different count. Returns once
    metadata shows every topic with all partitions led, or raises after `timeout`.
    `replication_factor=-1` lets the broker choose (KIP-464: Apache Kafka's
    default.replication.factor; 1 on the single-node embedded broker).
    `topic_config` is applied to topics created here (e.g. max.message.bytes on
    Apache Kafka for multi-MB values); existing topics are not altered.
    """
    wanted = normalize_topics(topics)
    if not wanted:
        return {}
    deadline = time.monotonic() + timeout
    admin = _admin(bootstrap_servers, admin_config)
    counts = _partition_counts(admin, timeout)
    _check_counts(wanted, counts, bootstrap_servers)
    missing = _absent(admin, [name for name in wanted if name not in counts], deadline)
    if missing:
        _create(admin, missing, wanted, replication_factor, topic_config, deadline)
    return _wait_for_counts(admin, wanted, deadline, bootstrap_servers)


# Errors of the moment, not of the request: librdkafka (2.10+) drops the handle of a
# broker missing from a metadata answer, failing what was in flight on it with
# _DESTROY_BROKER ("Broker handle destroyed without termination"); seen when creating
# the first topics on a 3-node Apache Kafka whose nodes were still registering, and it
# can happen to a worker creating its topics while a broker restarts.
_RETRY_CREATE = frozenset({KafkaError._DESTROY_BROKER, KafkaError._TRANSPORT, KafkaError.NOT_CONTROLLER})
_RETRY_WAIT_S = 0.2
_REFUSED = frozenset({KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED})


def _create(
    admin: AdminClient,
    names: list[str],
    wanted: Mapping[str, int],
    replication_factor: int,
    topic_config: Mapping[str, str] | None,
    deadline: float,
) -> None:
    pending = list(names)
    while pending:
        new = [
            NewTopic(
                name,
                num_partitions=wanted[name],
                replication_factor=replication_factor,
                config=dict(topic_config or {}),
            )
            for name in pending
        ]
        timeout = max(deadline - time.monotonic(), 0.1)
        futures = admin.create_topics(new, operation_timeout=timeout, request_timeout=timeout)
        again = []
        for name, future in futures.items():
            try:
                future.result(timeout=max(deadline - time.monotonic(), 0.1))
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                # Someone else created it first (another worker starting at the same
                # time, or our own earlier attempt): fine, the count is verified below
                # like any existing topic.
                if error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    continue
                if error.code() in _RETRY_CREATE and time.monotonic() + _RETRY_WAIT_S < deadline:
                    again.append(name)
                    continue
                if error.code() in _REFUSED:  # _absent: the broker said it does not exist
                    raise AdminError(create_refused(name)) from None
                raise AdminError(f"cannot create topic {name!r}: {error.str()}") from None
            except TimeoutError:
                raise AdminError(f"creating topic {name!r} timed out") from None
        if again:
            time.sleep(_RETRY_WAIT_S)
        pending = again


def _absent(admin: AdminClient, names: list[str], deadline: float) -> list[str]:
    """Of the topics the full listing left out, those the broker says do not exist,
    asked by name before anything is created. Kafka lists only the topics a principal
    may DESCRIBE and refuses a create without CREATE whether the topic exists or not,
    so the listing and the create alone sent operators to fix the wrong ACL (issue 44:
    "cannot create topic" for a topic that existed). A topic this principal may not
    describe raises the missing ACL's line: it may exist, and creating is not the fix.
    DescribeTopics asks without auto-creation, which Tansu honours too (measured: an
    unknown name stays unlisted), unlike list_topics(topic=X) (module doc)."""
    if not names:
        return []
    timeout = max(deadline - time.monotonic(), 1.0)
    futures = admin.describe_topics(TopicCollection(names), request_timeout=timeout)
    absent = []
    for name, future in futures.items():
        try:
            future.result(timeout=timeout)
        except KafkaException as exc:
            code = exc.args[0].code()
            if code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                raise AdminError(describe_refused(name)) from None
            # Unknown, or no answer (librdkafka's own codes are negative: _TIMED_OUT,
            # _TRANSPORT): the create says what is wrong, as before. Any other broker
            # error: the topic exists (e.g. no leader yet), and the wait decides.
            if code == KafkaError.UNKNOWN_TOPIC_OR_PART or code < 0:
                absent.append(name)
        except TimeoutError:
            absent.append(name)
    return absent


def _wait_for_counts(
    admin: AdminClient, wanted: Mapping[str, int], deadline: float, where: str
) -> dict[str, int]:
    while True:
        counts = _partition_counts(admin, deadline - time.monotonic())
        _check_counts(wanted, counts, where)
        if all(name in counts for name in wanted):
            return {name: counts[name] for name in wanted}
        if time.monotonic() >= deadline:
            absent = sorted(name for name in wanted if name not in counts)
            raise AdminError(f"topics {absent} not visible in metadata on {where} in time")
        time.sleep(_POLL_S)


def delete_topics(
    bootstrap_servers: str,
    names: Iterable[str],
    timeout: float = 30.0,
    *,
    admin_config: Mapping[str, Any] | None = None,
) -> None:
    """Delete topics (absent ones are ignored) and wait until metadata no longer lists them,
    so a topic of the same name can be created right after. On the embedded broker this is
    also the only way to free a topic's memory (no retention, docs/BROKERS.md)."""
    names = sorted(set(names))
    if not names:
        return
    deadline = time.monotonic() + timeout
    admin = _admin(bootstrap_servers, admin_config)
    listed = _topic_names(admin, timeout)
    present = [name for name in names if name in listed]
    if present:
        futures = admin.delete_topics(present, operation_timeout=timeout, request_timeout=timeout)
        for name, future in futures.items():
            try:
                future.result(timeout=max(deadline - time.monotonic(), 0.1))
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise AdminError(f"cannot delete topic {name!r}: {error.str()}") from None
            except TimeoutError:
                raise AdminError(f"deleting topic {name!r} timed out") from None
    while True:
        listed = _topic_names(admin, deadline - time.monotonic())
        left = [name for name in names if name in listed]
        if not left:
            return
        if time.monotonic() >= deadline:
            raise AdminError(f"topics {left} still listed on {bootstrap_servers} after delete")
        time.sleep(_POLL_S)


def existing_topics(
    bootstrap_servers: str,
    timeout: float = 10.0,
    *,
    admin_config: Mapping[str, Any] | None = None,
) -> dict[str, int]:
    """{topic: partition count} for every topic the broker lists (internal ones included).
    Reads metadata without naming topics, so it never auto-creates one."""
    try:
        metadata = _admin(bootstrap_servers, admin_config).list_topics(timeout=max(timeout, 0.1))
    except KafkaException as exc:
        raise AdminError(f"cannot read Kafka metadata from {bootstrap_servers}: {exc.args[0]}") from None
    return {name: len(topic.partitions) for name, topic in metadata.topics.items()}


def _topic_names(admin: AdminClient, timeout: float) -> set[str]:
    """Names of all topics metadata lists, complete or not."""
    try:
        return set(admin.list_topics(timeout=max(timeout, 0.1)).topics)
    except KafkaException as exc:
        raise AdminError(f"cannot read Kafka metadata: {exc.args[0]}") from None


def topic_max_message_bytes(
    bootstrap_servers: str,
    topics: Iterable[str],
    timeout: float = 5.0,
    *,
    admin_config: Mapping[str, Any] | None = None,
) -> dict[str, int]:
    """{topic: max.message.bytes} for the topics whose configuration the broker
    describes. A broker that does not (Tansu answers with no entries, and has no such
    limit), a topic that does not exist yet, or a failed request leaves the topic out:
    the caller then knows only its producer's own limit."""
    from confluent_kafka.admin import ConfigResource

    resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in dict.fromkeys(topics)]
    if not resources:
        return {}
    try:
        futures = _admin(bootstrap_servers, admin_config).describe_configs(resources, request_timeout=timeout)
    except KafkaException:
        return {}
    limits: dict[str, int] = {}
    for resource, future in futures.items():
        try:
            entry = future.result(timeout=timeout).get("max.message.bytes")
        except Exception:  # noqa: BLE001 - unknown topic, no permission: not known, not fatal
            continue
        if entry is not None and entry.value and str(entry.value).isdigit():
            limits[resource.name] = int(entry.value)
    return limits
