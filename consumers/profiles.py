"""Broker profiles: every broker-specific client setting, in one place.

The worker code builds its Kafka clients only through these functions, so it runs
unchanged on Apache Kafka (profile "kafka") and on the embedded Tansu broker (profile
"embedded"). The "embedded" settings work around Tansu's measured defects; each one
cites the defect in docs/BROKERS.md ("The embedded broker"). Rules that are not
settings but matter as much:

- never flush the producer per message: Tansu's fetch scans every stored batch of a
  partition, so many tiny batches make consumers slow and finally starve them;
- create topics explicitly with their final partition count (consumers/admin.py): a
  producer auto-creates a missing topic with 4 partitions on Tansu;
- compute lag from the fetch high watermark (`get_watermark_offsets(cached=True)`), not
  ListOffsets "latest", which is wrong on Tansu;
- use a unique group.id per test, and stop group members one at a time (a Tansu group
  can get stuck when two members leave together and a new one joins).

confluent-kafka dicts use librdkafka property names; the kafka_python_* functions return
keyword arguments for kafka-python's KafkaConsumer / KafkaProducer. Every confluent
dict built here logs librdkafka's lines through Python logging, rate-limited
(consumers/client_logs.py), so no client of the project prints librdkafka's raw
`%3|...|FAIL|` lines.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from consumers.client_logs import FailureCallback, wired
from pipeline.errors import UserError

KAFKA = "kafka"
EMBEDDED = "embedded"
# The broker profiles, the one list of them: every --broker-profile's choices and help
# (pipeline/commands/kafka_flags.py), the config check of `broker_profile` and
# check_profile read it; each settings table below has exactly these keys
# (tests/unit/test_profiles.py). Name -> the broker it is for.
PROFILES: dict[str, str] = {KAFKA: "Apache Kafka", EMBEDDED: "the embedded Tansu broker"}

# ----------------------------------------------------------------------------- confluent
# Settings for every broker.
_CONSUMER_COMMON: dict[str, Any] = {
    # At-least-once: the worker stores and commits an offset only once every message up
    # to it has its result acked and its ETL rows durable (docs/ARCHITECTURE.md,
    # "Delivery semantics").
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    # A new group starts from the beginning. Also a Tansu defect: ListOffsets "latest"
    # returns the wrong end, so "latest" replays old data there.
    "auto.offset.reset": "earliest",
    # Never create topics from a subscription: Tansu would create them with 4 partitions.
    "allow.auto.create.topics": False,
    # Only partitions that actually move are revoked on a rebalance, so in-flight
    # batches on the others keep going. Measured on Tansu (6 partitions, 2→3→2
    # members): eager stops every member for ~3 s per rebalance; cooperative never
    # stops the unmoved partitions, though a join settles later (two rounds, ~7 s vs
    # ~4 s). Callbacks get only the moved partitions (incremental). Every member of a
    # group must use the same strategy: kafka-python gets the same one below.
    "partition.assignment.strategy": "cooperative-sticky",
    # The prefetch queue is what holds records back while backpressure holds intake
    # (pipeline/batching/backpressure.py), so it is part of the worker's memory:
    # 16 MiB instead of librdkafka's 64 MiB. Still ~100 ms of a saturated CTR worker's
    # input (bench/pipeline_capacity.py), far more than one fetch round trip.
    "queued.max.messages.kbytes": 16384,
}

_CONSUMER_PROFILE: dict[str, dict[str, Any]] = {
    KAFKA: {},
    EMBEDDED: {
        # Tansu holds a fetch that is not full for the whole fetch.wait.max.ms (500 ms
        # default → ~250 ms median latency); 5 ms gives 4-5 ms producer→consumer latency.
        "fetch.wait.max.ms": 5,
        # librdkafka backs off 1 s when its fetch queue is over threshold; with the short
        # fetch waits above that shows up as 1 s stalls.
        "fetch.queue.backoff.ms": 10,
        # Every group join costs session.timeout.ms / 2 on Tansu (librdkafka's 45 s
        # default → 23 s per join); 6 s → 3 s. Heartbeats must stay well below it.
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 1000,
    },
}

_PRODUCER_COMMON: dict[str, Any] = {
    # A result is acked only when durable on all in-sync replicas; idempotence keeps
    # librdkafka's retries from writing duplicates or reordering a partition.
    "acks": "all",
    "enable.idempotence": True,
    # Cheap on CPU, good ratio on the JSON-ish result payloads.
    "compression.type": "lz4",
    # Small batches cost on every broker, and a lot on Tansu (see "embedded").
    "linger.ms": 5,
}

_PRODUCER_PROFILE: dict[str, dict[str, Any]] = {
    KAFKA: {},
    EMBEDDED: {
        # Tansu's fetch scans every stored batch of the partition (5k small batches →
        # 665 msg/s; 20k → a consumer at the log end starves): make batches big.
        "linger.ms": 5,
        "batch.size": 1048576,
    },
}

# ----------------------------------------------------------------------------- kafka-python
_KP_CONSUMER_COMMON: dict[str, Any] = {
    "enable_auto_commit": False,  # see enable.auto.commit above
    "auto_offset_reset": "earliest",  # see auto.offset.reset above
    "allow_auto_create_topics": False,  # kafka-python defaults to True; Tansu → 4 partitions
    # The same protocol as the confluent consumers, so both backends can share a group.
    # A string here; kafka_python_consumer_config turns it into the assignor class.
    "partition_assignment_strategy": "cooperative-sticky",
}

_KP_CONSUMER_PROFILE: dict[str, dict[str, Any]] = {
    KAFKA: {},
    EMBEDDED: {
        "fetch_max_wait_ms": 5,  # Tansu holds short fetches for the full wait
        "session_timeout_ms": 6000,  # Tansu: each join costs session timeout / 2
        "heartbeat_interval_ms": 1000,
    },
}

_KP_PRODUCER_COMMON: dict[str, Any] = {
    "acks": "all",
    "enable_idempotence": True,
    # kafka-python defaults to linger 0 and 16 KB batches: one batch per send() under
    # light load, which is exactly what Tansu's fetch cannot cope with.
    "linger_ms": 5,
}

_KP_PRODUCER_PROFILE: dict[str, dict[str, Any]] = {
    KAFKA: {},
    EMBEDDED: {"batch_size": 1048576},  # big batches: Tansu fetch scans every batch
}


# ----------------------------------------------------------------------------- faust
# faust-streaming App settings (its aiokafka transport). Faust reads the offsets it
# commits from the events the agents ack, so at-least-once needs nothing here.
_FAUST_COMMON: dict[str, Any] = {
    # A new group starts from the beginning (and Tansu's "latest" is wrong anyway).
    "consumer_auto_offset_reset": "earliest",
    # Nothing in these apps runs on_leader: no leader-election topic to create.
    "topic_disable_leader": True,
    # On rebalance and shutdown Faust waits (without limit) for every event a stream
    # took to be acked. Events of a batch whose body raised are never acked -- that
    # is the point, they must be replayed -- so waiting would hang the worker. Their
    # offsets stay uncommitted either way.
    "stream_wait_empty": False,
    # As the confluent producer. aiokafka needs cramjam for lz4 (`aiokafka[lz4]`), also
    # to read the lz4 batches every tidebatch producer writes.
    "producer_compression_type": "lz4",
    # As the confluent producer: small batches cost on every broker (aiokafka: 0).
    "producer_linger": 0.005,
}

_FAUST_PROFILE: dict[str, dict[str, Any]] = {
    KAFKA: {},
    EMBEDDED: {
        # Each group join costs session timeout / 2 on Tansu (Faust's 60 s -> 30 s).
        "broker_session_timeout": 6.0,
        "broker_heartbeat_interval": 1.0,
        # Big producer batches: Tansu's fetch scans every stored batch of a partition
        # (aiokafka's 16 KB default makes one small batch every few results).
        "producer_max_batch_size": 1048576,
    },
}

# Faust hard-codes aiokafka's fetch_max_wait_ms=1500, and Tansu holds a fetch that is
# not full for all of it (measured: 0.3-0.7 s from produce to agent). The embedded
# profile installs a transport that sets this instead (pipeline/faust/app.py).
FAUST_FETCH_MAX_WAIT_MS: dict[str, int | None] = {KAFKA: None, EMBEDDED: 5}


def faust_app_settings(profile: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Keyword settings for ``faust.App``; ``overrides`` win over the profile."""
    check_profile(profile)
    return _merge(_FAUST_COMMON, _FAUST_PROFILE[profile], overrides)


@dataclass(frozen=True)
class LargeMessageOverrides:
    """Client settings for values up to `max_bytes`; pass each part as `overrides=`.
    On Apache Kafka the topic needs `max.message.bytes` too (brokers default to ~1 MB):
    `ensure_topics(..., topic_config=overrides.topic)`. Tansu has no such limit."""

    max_bytes: int
    consumer: dict[str, Any] = field(default_factory=dict)
    producer: dict[str, Any] = field(default_factory=dict)
    kafka_python_consumer: dict[str, Any] = field(default_factory=dict)
    kafka_python_producer: dict[str, Any] = field(default_factory=dict)
    topic: dict[str, str] = field(default_factory=dict)


# librdkafka: receive.message.max.bytes must exceed fetch.max.bytes by at least 512
# (response framing); a little more for headers and batch overhead.
_FRAMING_BYTES = 64 * 1024
# librdkafka's hard cap on message.max.bytes and receive.message.max.bytes.
_LIBRDKAFKA_MAX = 1_000_000_000


def large_message_overrides(max_bytes: int) -> LargeMessageOverrides:
    """Settings that let clients produce and fetch single values of up to max_bytes."""
    if not 0 < max_bytes <= _LIBRDKAFKA_MAX - 2 * _FRAMING_BYTES:
        raise UserError(f"max message size must be 1..{_LIBRDKAFKA_MAX - 2 * _FRAMING_BYTES} bytes, got {max_bytes}")
    record = max_bytes + _FRAMING_BYTES  # one record batch holding one such value
    fetch = max(record, 52_428_800)  # never below librdkafka's 50 MB default
    return LargeMessageOverrides(
        max_bytes=max_bytes,
        consumer={
            # Per-partition fetch size; librdkafka grows it for a single oversized
            # message anyway, but one round trip instead of a retry at each size.
            "max.partition.fetch.bytes": record,
            "fetch.max.bytes": fetch,
            "receive.message.max.bytes": fetch + _FRAMING_BYTES,
        },
        producer={
            # The producer refuses (MSG_SIZE_TOO_LARGE) any request above this.
            "message.max.bytes": record,
        },
        kafka_python_consumer={
            "max_partition_fetch_bytes": record,
            "fetch_max_bytes": fetch,
            "receive_message_max_bytes": fetch + _FRAMING_BYTES,
        },
        kafka_python_producer={
            "max_request_size": record,
            "receive_message_max_bytes": record + _FRAMING_BYTES,
        },
        topic={"max.message.bytes": str(record)},
    )


# ----------------------------------------------------------------------------- builders
def check_profile(profile: str) -> str:
    """Return the profile name, or raise UserError naming the valid ones."""
    if profile not in PROFILES:
        raise UserError(f"unknown broker profile {profile!r}: use one of {', '.join(PROFILES)}")
    return profile


def _merge(*parts: Mapping[str, Any] | None) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for part in parts:
        merged.update(part or {})
    return merged


# With group.protocol=consumer (KIP-848) the broker assigns partitions and owns the
# session and heartbeat timing (group.consumer.*): librdkafka refuses to start when
# these are set, so the profile drops its own and an explicit override is an error.
_CLASSIC_ONLY: tuple[str, ...] = ("partition.assignment.strategy", "session.timeout.ms", "heartbeat.interval.ms")


def consumer_config(
    profile: str,
    bootstrap_servers: str,
    group_id: str,
    overrides: Mapping[str, Any] | None = None,
    on_failure: FailureCallback | None = None,
) -> dict[str, Any]:
    """confluent_kafka.Consumer config; `overrides` win over the profile. With
    `group.protocol: consumer` in the overrides, the classic-only settings go.
    `on_failure` hears the failures its logs and error events report (consumers/kafka_failures.py)."""
    check_profile(profile)
    base = _merge(_CONSUMER_COMMON, _CONSUMER_PROFILE[profile])
    if (overrides or {}).get("group.protocol", "classic") == "consumer":
        if profile == EMBEDDED:
            raise UserError("group.protocol=consumer (KIP-848) is not supported by the embedded broker (Tansu); use classic")
        for key in _CLASSIC_ONLY:
            if key in (overrides or {}):
                raise UserError(f"{key} cannot be set with group.protocol=consumer: the broker owns it (group.consumer.*)")
            base.pop(key, None)
    elif "group.remote.assignor" in (overrides or {}):
        raise UserError("group.remote.assignor only applies with group.protocol=consumer")
    return wired(_merge({"bootstrap.servers": bootstrap_servers, "group.id": group_id}, base, overrides), on_failure)


def producer_config(
    profile: str,
    bootstrap_servers: str,
    overrides: Mapping[str, Any] | None = None,
    on_failure: FailureCallback | None = None,
) -> dict[str, Any]:
    """confluent_kafka.Producer config; `overrides` win over the profile; `on_failure`
    as for consumer_config."""
    check_profile(profile)
    return wired(
        _merge(
            {"bootstrap.servers": bootstrap_servers},
            _PRODUCER_COMMON,
            _PRODUCER_PROFILE[profile],
            overrides,
        ),
        on_failure,
    )


def admin_config(
    bootstrap_servers: str,
    overrides: Mapping[str, Any] | None = None,
    on_failure: FailureCallback | None = None,
) -> dict[str, Any]:
    """confluent_kafka.admin.AdminClient config (no broker-specific settings);
    `on_failure` hears the failures its error events report (consumers/kafka_failures.py)."""
    return wired(_merge({"bootstrap.servers": bootstrap_servers}, overrides), on_failure)


def kafka_python_consumer_config(
    profile: str,
    bootstrap_servers: str,
    group_id: str,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Keyword arguments for kafka.KafkaConsumer; `overrides` win over the profile."""
    check_profile(profile)
    for key in ("group_protocol", "group_remote_assignor"):
        if key in (overrides or {}):
            # kafka-python speaks only the classic JoinGroup/SyncGroup protocol.
            raise UserError(f"kafka-python does not support {key} (KIP-848 consumer protocol); use the confluent client")
    config = _merge(
        {"bootstrap_servers": bootstrap_servers, "group_id": group_id},
        _KP_CONSUMER_COMMON,
        _KP_CONSUMER_PROFILE[profile],
        overrides,
    )
    strategy = config.get("partition_assignment_strategy")
    if isinstance(strategy, str):
        config["partition_assignment_strategy"] = _kafka_python_assignors(strategy)
    return config


def kafka_python_producer_config(
    profile: str,
    bootstrap_servers: str,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Keyword arguments for kafka.KafkaProducer; `overrides` win over the profile."""
    check_profile(profile)
    return _merge(
        {"bootstrap_servers": bootstrap_servers},
        _KP_PRODUCER_COMMON,
        {"compression_type": _kafka_python_compression()},
        _KP_PRODUCER_PROFILE[profile],
        overrides,
    )


def _kafka_python_assignors(names: str) -> tuple[type, ...]:
    """librdkafka-style "a,b" strategy names → kafka-python assignor classes (lazy import:
    the confluent path never loads kafka-python)."""
    from kafka.coordinator.assignors.cooperative_sticky import (
        CooperativeStickyAssignor,
    )
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    known: dict[str, type] = {
        "cooperative-sticky": CooperativeStickyAssignor,
        "range": RangePartitionAssignor,
        "roundrobin": RoundRobinPartitionAssignor,
    }
    assignors = []
    for name in (part.strip() for part in names.split(",")):
        if name not in known:
            raise UserError(f"unknown partition assignment strategy {name!r}: use {', '.join(known)}")
        assignors.append(known[name])
    return tuple(assignors)


def _kafka_python_compression() -> str | None:
    """lz4 like the confluent producer when the `lz4` package is installed; otherwise no
    compression (kafka-python raises at construction for a codec it cannot load, and gzip
    in pure Python costs more CPU than loopback bandwidth saves)."""
    from kafka.codec import has_lz4

    return "lz4" if has_lz4() else None
