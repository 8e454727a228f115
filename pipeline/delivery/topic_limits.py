"""The worker's size limits (pipeline/delivery/limits.py) from its configuration, its
producer's own limit and the topics' max.message.bytes that the broker describes."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from consumers.records import Producer
from pipeline.config import WorkerConfig
from pipeline.delivery.limits import Limits, resolve_limits
from pipeline.delivery.outcomes import Topics

if TYPE_CHECKING:
    from pipeline.registry.pipelines import PipelineSpec

log = logging.getLogger(__name__)


def worker_limits(
    cfg: WorkerConfig, pipeline: PipelineSpec, producer: Producer, topics: Topics, described: dict[str, int]
) -> Limits:
    """Limits from what the broker `described` ({} before run() asked it: the producer's own)."""
    requested = cfg.limits.max_request_bytes or pipeline.max_request_bytes
    return resolved_limits(requested, cfg.limits.dead_letter_prefix_bytes, producer, topics, described)


def resolved_limits(
    requested_request_bytes: int, prefix_bytes: int, producer: Producer, topics: Topics, described: dict[str, int]
) -> Limits:
    """The limits, with a warning logged for each requested value lowered to fit."""
    limits, warnings = resolve_limits(
        requested_request_bytes=requested_request_bytes,
        producer_bytes=producer.max_record_bytes,
        described=described,
        outgoing=topics.all(),
        dead_letter_topic=topics.dead_letter,
        prefix_bytes=prefix_bytes,
    )
    for warning in warnings:
        log.warning("%s", warning)
    return limits


def described_limits(cfg: WorkerConfig, pipeline: PipelineSpec, producer: Producer, topics: Topics) -> Limits:
    """Ask the broker for the outgoing topics' limits; log what they come to."""
    requested = cfg.limits.max_request_bytes or pipeline.max_request_bytes
    return broker_limits(cfg.bootstrap_servers, cfg.kafka.client("admin"), requested,
                         cfg.limits.dead_letter_prefix_bytes, producer, topics)


def broker_limits(
    bootstrap_servers: str, admin_config: Mapping[str, Any], requested_request_bytes: int, prefix_bytes: int,
    producer: Producer, topics: Topics,
) -> Limits:
    """described_limits() for a worker without a WorkerConfig (the generate worker,
    pipeline/app/generation.py)."""
    from consumers.admin import topic_max_message_bytes

    described = topic_max_message_bytes(bootstrap_servers, topics.all(), admin_config=admin_config)
    limits = resolved_limits(requested_request_bytes, prefix_bytes, producer, topics, described)
    log.info(
        "size limits: requests up to %d bytes; records to %s",
        limits.request_bytes,
        ", ".join(f"{t} up to {limits.for_topic(t)}" for t in topics.all()),
    )
    return limits
