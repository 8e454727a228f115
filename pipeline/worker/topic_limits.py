"""The worker's size limits (pipeline/limits.py) from its configuration, its
producer's own limit and the topics' max.message.bytes that the broker describes."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from consumers.records import Producer
from pipeline.config import WorkerConfig
from pipeline.limits import Limits, resolve_limits
from pipeline.outcomes import Topics

if TYPE_CHECKING:
    from pipeline.pipelines import PipelineSpec

log = logging.getLogger(__name__)


def worker_limits(
    cfg: WorkerConfig, pipeline: PipelineSpec, producer: Producer, topics: Topics, described: dict[str, int]
) -> Limits:
    """Limits from what the broker `described` ({} before run() asked it: the producer's own)."""
    limits, warnings = resolve_limits(
        requested_request_bytes=cfg.limits.max_request_bytes or pipeline.max_request_bytes,
        producer_bytes=producer.max_record_bytes,
        described=described,
        outgoing=topics.all(),
        dead_letter_topic=topics.dead_letter,
        prefix_bytes=cfg.limits.dead_letter_prefix_bytes,
    )
    for warning in warnings:
        log.warning("%s", warning)
    return limits


def described_limits(cfg: WorkerConfig, pipeline: PipelineSpec, producer: Producer, topics: Topics) -> Limits:
    """Ask the broker for the outgoing topics' limits; log what they come to."""
    from consumers.admin import topic_max_message_bytes

    described = topic_max_message_bytes(cfg.bootstrap_servers, topics.all(), admin_config=cfg.kafka.client("admin"))
    limits = worker_limits(cfg, pipeline, producer, topics, described)
    log.info(
        "size limits: requests up to %d bytes; records to %s",
        limits.request_bytes,
        ", ".join(f"{t} up to {limits.for_topic(t)}" for t in topics.all()),
    )
    return limits
