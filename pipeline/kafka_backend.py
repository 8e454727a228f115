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
from consumers.records import TopicPartition
from pipeline.config import WorkerConfig
from pipeline.errors import UserError
from pipeline.pipelines import get_pipeline


def _large(cfg: WorkerConfig) -> Any:
    limit = get_pipeline(cfg.pipeline).max_message_bytes
    return large_message_overrides(limit) if limit else None


def make_source(
    cfg: WorkerConfig,
    group_id: str,
    topics: list[str],
    on_assign: Callable[[list[TopicPartition]], None],
    on_revoke: Callable[[list[TopicPartition]], None],
) -> Any:
    if cfg.client == "confluent":
        from consumers.confluent_backend import ConfluentSource

        large = _large(cfg)
        overrides = {**(large.consumer if large else {}), **cfg.kafka.consumer}
        conf = consumer_config(cfg.broker_profile, cfg.bootstrap_servers, group_id, overrides)
        return ConfluentSource(conf, topics, on_assign, on_revoke)
    if cfg.client == "kafka-python":
        from consumers.kafka_python_backend import KafkaPythonSource

        large = _large(cfg)
        overrides = {**(large.kafka_python_consumer if large else {}), **cfg.kafka.consumer}
        conf = kafka_python_consumer_config(cfg.broker_profile, cfg.bootstrap_servers, group_id, overrides)
        return KafkaPythonSource(conf, topics, on_assign, on_revoke)
    raise UserError(f"unknown Kafka client {cfg.client!r}; use confluent or kafka-python")


def make_producer(cfg: WorkerConfig) -> Any:
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
