"""Checks of the worker's Kafka-side config keys (pipeline/config/checks.py validate()): the
delivery mode and the rebalancing keys, each refusal naming the key and why."""

from __future__ import annotations

import typing

from pipeline.errors import UserError

if typing.TYPE_CHECKING:
    from pipeline.config.sections import WorkerConfig


DELIVERY_MODES = ("at_least_once", "exactly_once")


def validate_delivery(cfg: WorkerConfig, bad: typing.Callable[[str, str], UserError]) -> None:
    """The delivery keys (docs/DELIVERY.md), each refusal naming the key and why."""
    if cfg.delivery not in DELIVERY_MODES:
        raise bad("delivery", f"{cfg.delivery!r} is not one of {', '.join(DELIVERY_MODES)}")
    if cfg.transaction_interval_ms < 1:
        raise bad("transaction_interval_ms", "must be >= 1")
    if cfg.transaction_timeout_ms < 1000:
        raise bad("transaction_timeout_ms", "must be >= 1000")
    if cfg.transaction_timeout_ms <= 2 * cfg.transaction_interval_ms:
        raise bad("transaction_timeout_ms", "must be more than twice transaction_interval_ms")
    if cfg.transactional_id is not None and not 0 < len(cfg.transactional_id) <= 249:
        raise bad("transactional_id", "must be 1..249 characters")
    if cfg.delivery != "exactly_once":
        return
    if cfg.broker_profile == "embedded":
        raise bad(
            "delivery",
            "exactly_once needs Apache Kafka: the embedded broker (Tansu) shows aborted transactions "
            "to read_committed readers (docs/BROKERS.md); use --broker kafka",
        )
    if cfg.client != "confluent":
        raise bad("delivery", "exactly_once needs client confluent (kafka-python's transactions are not used here)")


GROUP_PROTOCOLS = ("classic", "consumer")
REMOTE_ASSIGNORS = ("uniform", "range")


def validate_group(cfg: WorkerConfig, bad: typing.Callable[[str, str], UserError]) -> None:
    """The rebalancing keys, each refusal naming the key and why (one line)."""
    if cfg.group_protocol not in GROUP_PROTOCOLS:
        raise bad("group_protocol", f"{cfg.group_protocol!r} is not one of {', '.join(GROUP_PROTOCOLS)}")
    consumer = cfg.group_protocol == "consumer"
    if consumer and cfg.broker_profile == "embedded":
        raise bad("group_protocol", "the embedded broker (Tansu) has no consumer group protocol (KIP-848); use classic")
    if consumer and cfg.client == "kafka-python":
        raise bad("group_protocol", "kafka-python has no consumer group protocol (KIP-848); use client confluent or classic")
    if cfg.group_remote_assignor is not None:
        if not consumer:
            raise bad("group_remote_assignor", "only applies with group_protocol consumer")
        if cfg.group_remote_assignor not in REMOTE_ASSIGNORS:
            raise bad("group_remote_assignor", f"{cfg.group_remote_assignor!r} is not one of {', '.join(REMOTE_ASSIGNORS)}")
    if cfg.session_timeout_ms is not None:
        if consumer:
            raise bad(
                "session_timeout_ms",
                "with group_protocol consumer the session timeout is the broker's group.consumer.session.timeout.ms",
            )
        if cfg.session_timeout_ms < 1:
            raise bad("session_timeout_ms", "must be >= 1")
    if cfg.group_instance_id is not None and not 0 < len(cfg.group_instance_id) <= 249:
        raise bad("group_instance_id", "must be 1..249 characters")
