"""The pipeline registry: which codec, which model, which default topics, and how to
make sample requests (for the warm-up profile and the load generator). The shipped
pipelines are PIPELINES; a config's `pipelines:` entries (a user's own ONNX model,
pipeline/user_pipelines.py) become the same PipelineSpec through get_pipeline."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from models.registry import ModelSpec, load_spec
from pipeline.codecs.base import Codec
from pipeline.errors import UserError

Sample = tuple[bytes | None, bytes, list[tuple[str, bytes]]]  # key, value, headers


@dataclass(frozen=True)
class PipelineSpec:
    name: str
    input_topic: str
    output_topic: str
    make_codec: Callable[[Any], Codec]  # (WorkerConfig) -> Codec
    load_model: Callable[[], ModelSpec]  # models/registry.py: one spec format for every model
    make_samples: Callable[[int], Callable[[int], Sample]]  # seed -> (i -> valid request)
    # Requests per warm-up profile call: a camera frame costs ~60 ms, a CTR request ~0.3.
    warmup_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 24)
    # Largest value the Kafka clients must carry. Above the codec's own limit, so that
    # an oversized value is still consumed and dead-lettered rather than stuck.
    max_message_bytes: int | None = None
    # Largest request record (key + value + headers) the worker decodes; a larger one
    # is dead-lettered before decoding (pipeline/limits.py). Config:
    # limits.max_request_bytes. 512 KiB holds a CTR request of max_items (1000) items
    # (a 20-item JSON request is ~5.7 KB) and a text of max_chars CJK characters
    # (100,000 x 3 bytes), well below librdkafka's 1 MB record limit.
    max_request_bytes: int = 512 * 1024
    # Default batch cap (rows) when the config sets none. Convolutional and transformer
    # models gain little or nothing from batching on CPU (docs/MODELS.md), and their warm-up
    # fits come from a few small batches: a cap near the measured sizes keeps a noisy
    # fit from forming 100-frame batches that run slower per frame than single ones.
    max_batch_rows: int = 512


def _with_codec_options(cls: type, cfg: Any) -> Codec:
    """cls(**cfg.codec): the config's `codec` options, each checked against the codec's
    own keyword arguments, so a typo fails at start with the key named."""
    import inspect

    options = dict(getattr(cfg, "codec", None) or {})
    known = [n for n in inspect.signature(cls).parameters if n != "self"]
    for name in options:
        if name not in known:
            raise UserError(f"config key 'codec.{name}' is not an option of {cls.__name__}: use {', '.join(known)}")
    try:
        return cls(**options)
    except (TypeError, ValueError) as exc:
        raise UserError(f"config key 'codec': {exc}") from None


# ----------------------------------------------------------------------------- CTR
def _ctr_codec(cfg: Any) -> Codec:
    from pipeline.codecs.ctr import CtrCodec

    return CtrCodec(max_items=cfg.max_items)


def _ctr_model() -> ModelSpec:
    return load_spec("ctr")


def _ctr_samples(seed: int) -> Callable[[int], Sample]:
    from pipeline.loadgen.ctr import CtrRequestFactory

    factory = CtrRequestFactory(seed=seed)

    def make(i: int) -> Sample:
        key, value = factory.make(i)
        return key, value, []

    return make


# ----------------------------------------------------------------------------- camera
def _camera_codec(cfg: Any) -> Codec:
    from pipeline.codecs.camera import CameraCodec

    return _with_codec_options(CameraCodec, cfg)


def _camera_model() -> ModelSpec:
    return load_spec("camera")


def _camera_samples(seed: int) -> Callable[[int], Sample]:
    from pipeline.loadgen.camera import CameraFrameFactory

    cameras = 4
    factory = CameraFrameFactory(seed=seed, cameras=cameras)

    def make(i: int) -> Sample:
        key, value, headers = factory.make(i % cameras, i // cameras, float(i) * 0.1)
        return key, value, list(headers)

    return make


# ----------------------------------------------------------------------------- text
def _text_codec(cfg: Any) -> Codec:
    from pipeline.codecs.text import TextCodec

    return _with_codec_options(TextCodec, cfg)


def _text_model() -> ModelSpec:
    return load_spec("text")  # built from its weights package on first use ("ensure")


def _text_samples(seed: int) -> Callable[[int], Sample]:
    from pipeline.loadgen.text import TextRequestFactory

    factory = TextRequestFactory(seed=seed)

    def make(i: int) -> Sample:
        key, value = factory.make(i)
        return key, value, []

    return make


PIPELINES: dict[str, PipelineSpec] = {
    "ctr": PipelineSpec("ctr", "ctr.requests", "ctr.scores", _ctr_codec, _ctr_model, _ctr_samples),
    "camera": PipelineSpec(
        "camera", "camera.frames", "camera.detections", _camera_codec, _camera_model, _camera_samples,
        warmup_sizes=(1, 2),
        max_message_bytes=16 * 1024 * 1024,
        # The codec's own 8 MiB frame limit plus room for headers: a frame between the
        # two gets the codec's reason, a larger one is refused unread.
        max_request_bytes=8 * 1024 * 1024 + 64 * 1024,
        max_batch_rows=8,
    ),
    "text": PipelineSpec(
        "text", "text.requests", "text.embeddings", _text_codec, _text_model, _text_samples,
        warmup_sizes=(1, 2, 4, 8),
        max_batch_rows=32,
    ),
}


def get_pipeline(name: str, defined: Sequence[Mapping[str, Any]] = ()) -> PipelineSpec:
    """A shipped pipeline, or one of `defined`: the config's `pipelines` entries
    (pipeline/user_pipelines.py), already checked by the config's validation."""
    spec = PIPELINES.get(name)
    if spec is not None:
        return spec
    for entry in defined:
        if entry.get("name") == name:
            return _user_pipeline(entry)
    raise UserError(f"unknown pipeline {name!r}; shipped pipelines: {', '.join(sorted(PIPELINES))}")


def pipeline_for(cfg: Any) -> PipelineSpec:
    """The pipeline a worker config selects (`pipeline`, maybe defined under `pipelines`)."""
    return get_pipeline(cfg.pipeline, cfg.pipelines)


def _user_pipeline(entry: Mapping[str, Any]) -> PipelineSpec:
    from pipeline.user_pipelines import UserPipeline

    user = UserPipeline(entry)
    options = {k: int(entry[k]) for k in ("max_batch_rows", "max_request_bytes") if k in entry}
    if "max_request_bytes" in entry:  # as for camera frames: room for headers above the limit
        options["max_message_bytes"] = options["max_request_bytes"] + 64 * 1024
    return PipelineSpec(
        user.name, user.input_topic, user.output_topic, user.make_codec, user.load_model, user.make_samples,
        **options,
    )
