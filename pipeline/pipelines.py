"""The pipelines tidebatch ships: which codec, which model, which default topics, and
how to make sample requests (for the warm-up profile and the load generator)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from consumers.codecs.base import Codec
from pipeline.errors import UserError


@dataclass(frozen=True)
class PipelineSpec:
    name: str
    model: str  # directory under models/
    input_topic: str
    output_topic: str
    make_codec: Callable[[Any], Codec]  # (WorkerConfig) -> Codec
    make_samples: Callable[[int], Callable[[int], tuple[bytes | None, bytes, list]]]
    # seed -> (i -> (key, value, headers)) valid requests, for warm-up and load


def _ctr_codec(cfg: Any) -> Codec:
    redis = getattr(cfg, "redis", None)
    if redis is not None and redis.features.enabled:
        # id-only requests, features from Redis (pipeline/redisio, docs/REDIS.md)
        from pipeline.redisio.codec import CtrIdCodec

        return CtrIdCodec(max_items=cfg.max_items)
    from consumers.codecs.ctr import CtrCodec

    return CtrCodec(max_items=cfg.max_items)


def _ctr_samples(seed: int) -> Callable[[int], tuple[bytes | None, bytes, list]]:
    from pipeline.loadgen.ctr import CtrRequestFactory

    factory = CtrRequestFactory(seed=seed)

    def make(i: int) -> tuple[bytes | None, bytes, list]:
        key, value = factory.make(i)
        return key, value, []

    return make


PIPELINES: dict[str, PipelineSpec] = {
    "ctr": PipelineSpec(
        name="ctr",
        model="ctr",
        input_topic="ctr.requests",
        output_topic="ctr.scores",
        make_codec=_ctr_codec,
        make_samples=_ctr_samples,
    ),
}


def get_pipeline(name: str) -> PipelineSpec:
    spec = PIPELINES.get(name)
    if spec is None:
        raise UserError(f"unknown pipeline {name!r}; shipped pipelines: {', '.join(sorted(PIPELINES))}")
    return spec
