"""What Redis gives a worker: the hooks and sinks over one shared link. Which of them a
worker gets is decided from its `redis` config section by the composition root
(pipeline/app/compose.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.redisio.metrics import RedisMetrics


@dataclass
class RedisParts:
    """A worker's hooks (features first, dedup last) and sinks, and the link they share,
    which the owner closes after the worker has stopped."""

    link: Any  # RedisLink
    metrics: RedisMetrics
    hooks: list[Any] = field(default_factory=list)
    sinks: list[Any] = field(default_factory=list)

    def close(self) -> None:
        self.link.close()
