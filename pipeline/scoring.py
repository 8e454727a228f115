"""One scoring step, shared by the worker's executors (pipeline/worker/) and the Faust
path (pipeline/faust/inference.py): the warm-up profile, collate -> model -> split,
a refused batch re-run request by request, and the result document.

    step = ScoringStep(model, codec, session, hooks)
    step.warm_up(pipeline)                     # -> AffineCost seeding the cost model
    results, seconds = step.infer(decoded)     # raises when the model refuses the batch
    singles = step.one_by_one(decoded)         # after a refusal: one Single per request
    run = score_batch(step, decoded)           # infer, or after a refusal one_by_one
    doc = result_document(model, decoded, rec, result, batch_timing, consumed_wall, deadline_wall)

Nothing here knows Kafka clients or threads: callers own both.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from consumers.records import SourceRecord
from pipeline.clock import wall_ms
from pipeline.codecs.base import Codec, Decoded

if TYPE_CHECKING:
    from models.registry import ModelSpec
    from pipeline.batching.cost import AffineCost
    from pipeline.hooks import WorkerHook
    from pipeline.registry.pipelines import PipelineSpec
    from pipeline.runtime.model_process import ProcessSession
    from pipeline.runtime.session import InferenceSession

log = logging.getLogger(__name__)
WARMUP_SEED = 12345


@dataclass(slots=True)
class Single:
    """One request re-run alone after its batch was refused: its result, or why the
    model refused it too (a one-line reason for its dead letter)."""

    result: dict | None
    error: str | None
    seconds: float
    started_wall: int


@dataclass(slots=True)
class BatchRun:
    """A batch through the model: its results, or (the model refused it) one Single per
    request, each re-run alone."""

    results: list[dict] | None  # one per request; None: the model refused the batch
    seconds: float  # the model's own time for the batch (0.0 when refused)
    singles: list[Single] | None = None  # the re-run, when the model refused the batch


@dataclass(slots=True)
class BatchTiming:
    """When a batch ran, for its requests' result documents (wall ms but seconds)."""

    batch_rows: int
    seconds: float  # the model's own time for the batch
    started_wall: int  # the batch started
    done_wall: int  # its results were ready


class ScoringStep:
    """A pipeline's codec and model session, with the hooks that see each batch."""

    def __init__(
        self,
        model: ModelSpec,
        codec: Codec,
        session: InferenceSession | ProcessSession,
        hooks: Sequence[WorkerHook] = (),
    ) -> None:
        self.model = model
        self.codec = codec
        self.session = session
        self.hooks = list(hooks)

    def warm_up(self, pipeline: PipelineSpec) -> AffineCost:
        """Profile the model on the pipeline's sample requests (one bucket, so they can
        share a batch) and return t(n) per row: the cost model's prior, so the first
        batching decisions are not guesses."""
        sizes = pipeline.warmup_sizes
        decoded = sample_requests(pipeline, self.codec, max(sizes) * 4)
        sizes = tuple(n for n in sizes if n <= len(decoded)) or (1,)
        cost = self.session.profile(lambda n: self.codec.collate([d.payload for d in decoded[:n]]), sizes)
        # profile() fits against request counts; convert to rows with their mean size.
        cost.b /= sum(d.rows for d in decoded[: max(sizes)]) / max(sizes)
        log.info(
            "warm-up profile of %s on %s: t(n) = %.3f ms + %.4f ms/row",
            self.model.name, self.session.provider, cost.a * 1e3, cost.b * 1e3,
        )
        return cost

    def infer(self, decoded: Sequence[Decoded], pad_to_rows: int | None = None) -> tuple[list[dict], float]:
        """Hooks, collate, the model, split: one result per request, and the model's own
        seconds (with a model process, not the wait behind another batch), which is
        what the cost model learns. Raises whatever the model or codec raised."""
        for hook in self.hooks:
            hook.before_inference(decoded)
        feeds = self.codec.collate([d.payload for d in decoded], pad_to_rows)
        outputs, seconds = self.session.run_timed(feeds)
        return self.codec.split(outputs, decoded), seconds

    def one_by_one(self, decoded: Sequence[Decoded]) -> list[Single]:
        """After the model refused a batch: each request alone, so that one poison
        request is dead-lettered and its batch-mates are still scored."""
        out: list[Single] = []
        for d in decoded:
            started = wall_ms()
            try:
                (result,), seconds = self.infer([d])
            except Exception as exc:
                reason = f"model rejected the request: {type(exc).__name__}: {exc}"
                out.append(Single(None, reason.splitlines()[0], 0.0, started))
                continue
            out.append(Single(result, None, seconds, started))
        return out


def score_batch(
    step: ScoringStep,
    decoded: Sequence[Decoded],
    pad_to_rows: int | None = None,
    refused: Callable[[], None] | None = None,
) -> BatchRun:
    """The batch through the model, or, when the model refuses it, each request alone
    (ScoringStep.one_by_one): the one rule of the worker's executors (pipeline/worker/
    executors.py) and the Faust path (pipeline/faust/inference.py) for a refused batch.
    `refused`: called before the re-run, so the worker's batcher learns the batch is
    over while its requests run alone."""
    try:
        results, seconds = step.infer(decoded, pad_to_rows)
    except Exception as exc:
        if refused is not None:
            refused()
        log.warning("batch of %d requests failed (%s); retrying one by one", len(decoded), exc)
        return BatchRun(None, 0.0, step.one_by_one(decoded))
    return BatchRun(results, seconds)


def sample_requests(pipeline: PipelineSpec, codec: Codec, count: int, seed: int = WARMUP_SEED) -> list[Decoded]:
    """The pipeline's first `count` sample requests, decoded by its codec, and of those
    the largest group of one bucket (requests of one bucket can share a batch): the
    real requests the warm-up profile and `tidebatch profile` (pipeline/profiling/)
    collate into batches."""
    samples = pipeline.make_samples(seed)
    reader = getattr(codec, "inner", codec)  # a schema-registry codec's samples are its document codec's (base.py)
    by_bucket: dict[object, list[Decoded]] = {}
    for i in range(count):
        _key, value, headers = samples(i)
        d = reader.decode(value, dict(headers))
        by_bucket.setdefault(d.bucket, []).append(d)
    return max(by_bucket.values(), key=len)


def result_document(
    model: ModelSpec,
    decoded: Decoded,
    rec: SourceRecord,
    result: dict[str, Any],
    timing: BatchTiming,
    consumed_wall: int,
    deadline_wall: float,
) -> dict[str, Any]:
    """The result record's document (docs/ARCHITECTURE.md "Result document"), the same
    from the worker and from Faust, so downstream consumers read both alike.
    `consumed_wall`: when the request was taken from Kafka; `deadline_wall`: its deadline."""
    doc = {
        # Every result carries its request id (replays are deduplicated by it), also
        # from codecs whose own fields do not include it (camera: camera_id/frame_id).
        "request_id": decoded.request_id,
        **result,
        "key": rec.key.decode("utf-8", "replace") if rec.key is not None else None,
        "model": model.name,
        "model_version": model.version,
        "batch_rows": timing.batch_rows,
        "queue_wait_ms": max(timing.started_wall - consumed_wall, 0),
        "inference_ms": round(timing.seconds * 1000.0, 3),
        "kafka_ts_ms": rec.timestamp_ms,
        "scored_at_ms": timing.done_wall,
        "priority": decoded.priority,
        "late": timing.done_wall > deadline_wall,
        "source": {"topic": rec.topic, "partition": rec.partition, "offset": rec.offset},
    }
    if decoded.tenant is not None:
        doc["tenant"] = decoded.tenant
    return doc
