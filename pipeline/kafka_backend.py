"""The one place that picks the Kafka client backend (config key `client`):
confluent-kafka (librdkafka, the default) or kafka-python (pure Python)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from consumers.profiles import (
    consumer_config,
    kafka_python_consumer_config,
    kafka_python_producer_config,
    large_message_overrides,
    producer_config,
)
from consumers.records import Producer, Source, TopicPartition
from pipeline.config import WorkerConfig
from pipeline.errors import UserError
from pipeline.pipelines import get_pipeline


def _large(cfg: WorkerConfig) -> Any:
    limit = get_pipeline(cfg.pipeline).max_message_bytes
    return large_message_overrides(limit) if limit else None


# The rebalancing settings by client: librdkafka's names and kafka-python's keywords
# (kafka-python has no group_protocol or group_remote_assignor: its profile refuses
# them, naming the key).
_GROUP_KEYS: dict[str, tuple[str, str, str, str, str]] = {
    "confluent": ("group.protocol", "group.remote.assignor", "group.instance.id",
                  "session.timeout.ms", "heartbeat.interval.ms"),
    "kafka-python": ("group_protocol", "group_remote_assignor", "group_instance_id",
                     "session_timeout_ms", "heartbeat_interval_ms"),
}


def group_overrides(cfg: WorkerConfig, client: str) -> dict[str, Any]:
    """The rebalancing keys of `cfg` as client settings; only those that are set, so
    the profile's defaults stay otherwise."""
    protocol, assignor, instance, session, heartbeat = _GROUP_KEYS[client]
    wanted: dict[str, Any] = {
        protocol: cfg.group_protocol if cfg.group_protocol != "classic" else None,
        assignor: cfg.group_remote_assignor,
        instance: cfg.instance_id(),
        session: cfg.session_timeout_ms,
        # The clients' 3 s heartbeat would not fit in a short session timeout.
        heartbeat: max(cfg.session_timeout_ms // 6, 100) if cfg.session_timeout_ms else None,
    }
    return {k: v for k, v in wanted.items() if v is not None}


def make_source(
    cfg: WorkerConfig,
    group_id: str,
    topics: list[str],
    on_assign: Callable[[list[TopicPartition]], None],
    on_revoke: Callable[[list[TopicPartition]], None],
) -> Source:
    if cfg.client == "confluent":
        from consumers.confluent_backend import ConfluentSource

        large = _large(cfg)
        overrides = {**(large.consumer if large else {}), **group_overrides(cfg, "confluent"), **cfg.kafka.consumer}
        conf = consumer_config(cfg.broker_profile, cfg.bootstrap_servers, group_id, overrides)
        return ConfluentSource(conf, topics, on_assign, on_revoke)
    if cfg.client == "kafka-python":
        from consumers.kafka_python_backend import KafkaPythonSource

        large = _large(cfg)
        overrides = {
            **(large.kafka_python_consumer if large else {}), **group_overrides(cfg, "kafka-python"), **cfg.kafka.consumer
        }
        conf = kafka_python_consumer_config(cfg.broker_profile, cfg.bootstrap_servers, group_id, overrides)
        return KafkaPythonSource(conf, topics, on_assign, on_revoke)
    raise UserError(f"unknown Kafka client {cfg.client!r}; use confluent or kafka-python")


def make_producer(cfg: WorkerConfig) -> Producer:
    if cfg.client == "confluent":
        from consumers.confluent_backend import ConfluentProducer

        large = _large(cfg)
        overrides = {**(large.producer if large else {}), **cfg.kafka.producer}
        return ConfluentProducer(producer_config(cfg.broker_profile, cfg.bootstrap_servers, overrides))
    if cfg.client == "kafka-python":
        from consumers.kafka_python_backend import KafkaPythonProducer

        large = _large(cfg)
        overrides = {**(large.kafka_python_producer if large else {}), **cfg.kafka.producer}
        return KafkaPythonProducer(kafka_python_producer_config(cfg.broker_profile, cfg.bootstrap_servers, overrides))
    raise UserError(f"unknown Kafka client {cfg.client!r}; use confluent or kafka-python")
