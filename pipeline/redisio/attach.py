"""Build the Redis hooks and sink of a worker from its `redis` config section
(used by the composition root, pipeline/app/compose.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from pipeline.redisio.config import RedisConfig
from pipeline.redisio.metrics import RedisMetrics, register_redis_metrics

log = logging.getLogger(__name__)


@dataclass
class RedisParts:
    """What a worker gets: its hooks (features first, dedup last) and sinks, and the
    link they share, which the owner closes after the worker has stopped."""

    link: Any  # RedisLink
    metrics: RedisMetrics
    hooks: list[Any] = field(default_factory=list)
    sinks: list[Any] = field(default_factory=list)

    def close(self) -> None:
        self.link.close()


def build_redis(rc: RedisConfig, registry: CollectorRegistry, *, exactly_once: bool = False) -> RedisParts | None:
    """None when no Redis feature is enabled (then nothing connects). exactly_once: the
    worker's delivery mode, which changes what a redelivery means to dedup (dedup.py)."""
    if not rc.used:
        return None
    from pipeline.redisio.dedup import DedupHook
    from pipeline.redisio.features import FeatureLookupHook
    from pipeline.redisio.link import RedisLink
    from pipeline.redisio.scores import ScoreStoreSink

    metrics = register_redis_metrics(registry)
    link = RedisLink(rc, metrics).start()
    parts = RedisParts(link, metrics)
    if rc.features.enabled:
        parts.hooks.append(FeatureLookupHook(link, metrics, rc.key_prefix, rc.features.lookup))
    if rc.dedup.enabled:
        parts.hooks.append(
            DedupHook(link, metrics, key_prefix=rc.key_prefix, ttl_s=rc.dedup.ttl_s, action=rc.dedup.action,
                      exactly_once=exactly_once)
        )
    if rc.store.enabled:
        parts.sinks.append(
            ScoreStoreSink(
                link, metrics, key_prefix=rc.key_prefix, ttl_s=rc.ttl_s,
                buffer_max=rc.store.buffer_max, flush_timeout_s=rc.store.flush_timeout_s,
            )
        )
    log.info(
        "redis at %s: features %s, score store %s, dedup %s",
        link.url, _on(rc.features.enabled), _on(rc.store.enabled),
        f"on ({rc.dedup.action})" if rc.dedup.enabled else "off",
    )
    return parts


def accept_id_requests(codec: Any, pipeline: str) -> Any:
    """The codec a worker with feature lookup decodes with: CtrIdCodec for the CTR
    codec (inline requests decode identically; id-only requests decode too), the
    codec unchanged elsewhere (with a warning: feature lookup is CTR only). Chosen by
    pipeline/app/compose.py before the warm-up profile runs the codec."""
    from pipeline.codecs.ctr import CtrCodec
    from pipeline.redisio.codec import CtrIdCodec

    if isinstance(codec, CtrIdCodec):
        return codec
    if type(codec) is CtrCodec:
        return CtrIdCodec(max_items=codec.max_items)
    log.warning("redis.features.enabled has no effect on pipeline %r (CTR only)", pipeline)
    return codec


def _on(flag: bool) -> str:
    return "on" if flag else "off"
