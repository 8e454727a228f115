"""Broker profiles: the embedded workarounds are there, overrides win, and the configs
are valid for the client libraries. No network I/O."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import Consumer, Producer

from consumers.profiles import (
    EMBEDDED,
    KAFKA,
    PROFILES,
    consumer_config,
    kafka_python_consumer_config,
    kafka_python_producer_config,
    large_message_overrides,
    producer_config,
)
from pipeline.errors import UserError

# kafka-python 3.0 loads its protocol schemas with importlib.resources' legacy API.
pytestmark = pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning")

BOOTSTRAP = "broker.example:9092"

# librdkafka starts connecting to bootstrap.servers as soon as a client is constructed
# (checked: a Consumer or Producer on 127.0.0.1:1 logs "Connection refused" at once).
# An empty list keeps construction I/O-free while still validating every property.
NO_BROKERS = ""


def quiet_logger() -> logging.Logger:
    """librdkafka warns that no bootstrap.servers are set; keep that out of test output."""
    logger = logging.getLogger("tests.rdkafka")
    logger.addHandler(logging.NullHandler())
    logger.propagate = False
    return logger


def test_embedded_consumer_has_the_tansu_workarounds() -> None:
    config = consumer_config(EMBEDDED, BOOTSTRAP, "g")
    assert config["fetch.wait.max.ms"] == 5
    assert config["fetch.queue.backoff.ms"] == 10
    assert config["session.timeout.ms"] == 6000
    assert config["heartbeat.interval.ms"] == 1000


def test_embedded_producer_batches_big() -> None:
    config = producer_config(EMBEDDED, BOOTSTRAP)
    assert config["linger.ms"] == 5
    assert config["batch.size"] == 1048576


def test_kafka_profile_keeps_apache_kafka_defaults() -> None:
    config = consumer_config(KAFKA, BOOTSTRAP, "g")
    for key in ("fetch.wait.max.ms", "fetch.queue.backoff.ms", "session.timeout.ms"):
        assert key not in config


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_is_at_least_once(profile: str) -> None:
    consumer = consumer_config(profile, BOOTSTRAP, "group-1")
    assert consumer["bootstrap.servers"] == BOOTSTRAP
    assert consumer["group.id"] == "group-1"
    assert consumer["enable.auto.commit"] is False
    assert consumer["enable.auto.offset.store"] is False
    assert consumer["auto.offset.reset"] == "earliest"
    assert consumer["allow.auto.create.topics"] is False

    producer = producer_config(profile, BOOTSTRAP)
    assert producer["acks"] == "all"
    assert producer["enable.idempotence"] is True
    assert producer["compression.type"] == "lz4"
    assert producer["linger.ms"] == 5


def test_overrides_win_and_results_are_fresh_copies() -> None:
    config = consumer_config(EMBEDDED, BOOTSTRAP, "g", {"fetch.wait.max.ms": 100, "client.id": "w1"})
    assert config["fetch.wait.max.ms"] == 100
    assert config["client.id"] == "w1"
    config["session.timeout.ms"] = 1
    assert consumer_config(EMBEDDED, BOOTSTRAP, "g")["session.timeout.ms"] == 6000

    assert producer_config(KAFKA, BOOTSTRAP, {"acks": 1})["acks"] == 1
    assert kafka_python_consumer_config(EMBEDDED, BOOTSTRAP, "g", {"fetch_max_wait_ms": 50})[
        "fetch_max_wait_ms"
    ] == 50
    assert kafka_python_producer_config(EMBEDDED, BOOTSTRAP, {"linger_ms": 20})["linger_ms"] == 20


@pytest.mark.parametrize(
    "build",
    [
        lambda p: consumer_config(p, BOOTSTRAP, "g"),
        lambda p: producer_config(p, BOOTSTRAP),
        lambda p: kafka_python_consumer_config(p, BOOTSTRAP, "g"),
        lambda p: kafka_python_producer_config(p, BOOTSTRAP),
    ],
)
def test_unknown_profile_names_the_valid_ones(build) -> None:
    with pytest.raises(UserError, match=r"unknown broker profile 'tansu': use one of kafka, embedded"):
        build("tansu")


@pytest.mark.parametrize("profile", PROFILES)
def test_confluent_kafka_accepts_the_configs(profile: str) -> None:
    big = large_message_overrides(20 * 1024 * 1024)
    for overrides in ({}, big.consumer):
        config = consumer_config(profile, NO_BROKERS, "g", overrides)
        consumer = Consumer(config, logger=quiet_logger())  # raises on any unknown property
        consumer.close()
    for overrides in ({}, big.producer):
        producer = Producer(producer_config(profile, NO_BROKERS, overrides), logger=quiet_logger())
        producer.close()


def test_confluent_kafka_rejects_unknown_properties() -> None:
    """The check above means something: librdkafka refuses what it does not know."""
    from confluent_kafka import KafkaException

    with pytest.raises(KafkaException, match="No such configuration property"):
        Consumer(consumer_config(EMBEDDED, NO_BROKERS, "g", {"fetch.max.wait.ms": 5}))


@pytest.mark.parametrize("profile", PROFILES)
def test_kafka_python_configs_use_known_keys(profile: str) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor

    big = large_message_overrides(20 * 1024 * 1024)
    consumer = kafka_python_consumer_config(profile, BOOTSTRAP, "g", big.kafka_python_consumer)
    producer = kafka_python_producer_config(profile, BOOTSTRAP, big.kafka_python_producer)
    # Constructing kafka-python clients connects at once, so check the keys instead.
    assert set(consumer) <= set(KafkaConsumer.DEFAULT_CONFIG)
    assert set(producer) <= set(KafkaProducer.DEFAULT_CONFIG)
    assert consumer["enable_auto_commit"] is False
    assert consumer["allow_auto_create_topics"] is False
    # Same group protocol as the confluent consumers, so both backends can share a group.
    assert consumer["partition_assignment_strategy"] == (CooperativeStickyAssignor,)
    assert producer["acks"] == "all"
    assert producer["enable_idempotence"] is True


def test_kafka_python_embedded_has_the_tansu_workarounds() -> None:
    consumer = kafka_python_consumer_config(EMBEDDED, BOOTSTRAP, "g")
    assert consumer["fetch_max_wait_ms"] == 5
    assert consumer["session_timeout_ms"] == 6000
    assert consumer["heartbeat_interval_ms"] == 1000
    producer = kafka_python_producer_config(EMBEDDED, BOOTSTRAP)
    assert producer["linger_ms"] == 5
    assert producer["batch_size"] == 1048576


def test_large_message_overrides_are_consistent() -> None:
    size = 20 * 1024 * 1024
    big = large_message_overrides(size)
    assert big.producer["message.max.bytes"] > size
    assert big.consumer["max.partition.fetch.bytes"] > size
    assert big.consumer["fetch.max.bytes"] >= big.consumer["max.partition.fetch.bytes"]
    # librdkafka: receive.message.max.bytes must exceed fetch.max.bytes by >= 512.
    assert big.consumer["receive.message.max.bytes"] >= big.consumer["fetch.max.bytes"] + 512
    assert big.kafka_python_producer["max_request_size"] > size
    assert big.kafka_python_consumer["max_partition_fetch_bytes"] > size
    assert int(big.topic["max.message.bytes"]) > size


@pytest.mark.parametrize("size", [0, -1, 2_000_000_000])
def test_large_message_overrides_rejects_impossible_sizes(size: int) -> None:
    with pytest.raises(UserError, match="max message size"):
        large_message_overrides(size)


# ----------------------------------------------------------------------------- rebalancing
CLASSIC_ONLY = ("partition.assignment.strategy", "session.timeout.ms", "heartbeat.interval.ms")


def test_classic_is_cooperative_sticky_by_default() -> None:
    config = consumer_config(KAFKA, BOOTSTRAP, "g")
    assert config["partition.assignment.strategy"] == "cooperative-sticky"
    assert "group.protocol" not in config  # librdkafka's default: classic


def test_consumer_protocol_drops_the_classic_only_settings() -> None:
    """librdkafka refuses to start with any of them under group.protocol=consumer."""
    config = consumer_config(KAFKA, NO_BROKERS, "g", {"group.protocol": "consumer", "group.remote.assignor": "uniform"})
    assert not set(CLASSIC_ONLY) & set(config)
    assert config["group.remote.assignor"] == "uniform"
    Consumer(config, logger=quiet_logger()).close()  # accepted as a whole


@pytest.mark.parametrize("key", CLASSIC_ONLY)
def test_consumer_protocol_refuses_a_classic_only_override(key: str) -> None:
    with pytest.raises(UserError) as caught:
        consumer_config(KAFKA, BOOTSTRAP, "g", {"group.protocol": "consumer", key: "1000"})
    assert key in str(caught.value) and "\n" not in str(caught.value)


def test_embedded_broker_refuses_the_consumer_protocol() -> None:
    with pytest.raises(UserError, match=r"^group.protocol=consumer \(KIP-848\) is not supported by the embedded"):
        consumer_config(EMBEDDED, BOOTSTRAP, "g", {"group.protocol": "consumer"})


def test_remote_assignor_needs_the_consumer_protocol() -> None:
    with pytest.raises(UserError, match="group.remote.assignor only applies with group.protocol=consumer"):
        consumer_config(KAFKA, BOOTSTRAP, "g", {"group.remote.assignor": "range"})


def test_static_membership_is_accepted_by_both_clients() -> None:
    from kafka import KafkaConsumer

    config = consumer_config(KAFKA, NO_BROKERS, "g", {"group.instance.id": "worker-0"})
    Consumer(config, logger=quiet_logger()).close()
    kp = kafka_python_consumer_config(KAFKA, BOOTSTRAP, "g", {"group_instance_id": "worker-0"})
    assert kp["group_instance_id"] == "worker-0"
    assert set(kp) <= set(KafkaConsumer.DEFAULT_CONFIG)


@pytest.mark.parametrize("key", ["group_protocol", "group_remote_assignor"])
def test_kafka_python_refuses_what_it_cannot_speak(key: str) -> None:
    with pytest.raises(UserError) as caught:
        kafka_python_consumer_config(KAFKA, BOOTSTRAP, "g", {key: "consumer"})
    assert str(caught.value).startswith(f"kafka-python does not support {key}")
    assert "\n" not in str(caught.value)
