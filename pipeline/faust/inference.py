"""Run a tidebatch pipeline's ONNX model over the batches of ``adaptive_batches`` inside
a Faust agent, with the worker's runtime (InferenceSession + the pipeline's codec
decode/collate/split), and publish one result per event to a Faust topic.

    scorer = BatchScorer("ctr")

    @app.agent(requests)
    async def score(stream):
        async for batch in adaptive_batches(stream, prepare=scorer.decode,
                                            cost_model=scorer.cost_model(), ...):
            await scorer.score_and_send(batch, results, dlq_topic=dlq)

Results are the worker's result documents (docs/ARCHITECTURE.md "Result document"):
the codec's fields plus key, model, batch_rows, queue_wait_ms, inference_ms,
kafka_ts_ms, scored_at_ms, late, source -- so downstream consumers read both paths
alike. Invalid input (the codec's DecodeError) and requests the model refuses go to the
dead-letter topic with the worker's headers; nothing is dropped silently.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from consumers.dead_letter import (
    Origin,
    class_path,
    dead_letter_copy,
    late_copy,
    member_id,
    record_bytes,
)
from consumers.records import SourceRecord, headers_to_dict
from pipeline.batching.cost import AffineCost, CostModel
from pipeline.clock import wall_ms
from pipeline.codecs.base import Decoded
from pipeline.faust.batch import FaustBatch
from pipeline.observe.tracing import TRACE_HEADERS
from pipeline.registry.pipelines import get_pipeline
from pipeline.runtime.session import InferenceSession
from pipeline.scoring import BatchTiming, ScoringStep, result_document

log = logging.getLogger(__name__)
# Records this path writes must fit aiokafka's max_request_size (1 MiB) and Apache
# Kafka's default max.message.bytes (~1 MB): a dead-letter copy is cut to fit
# (consumers/dead_letter.py), a larger result is its request's dead letter.
FAUST_MAX_RECORD_BYTES = 1_000_000
DEAD_LETTER_PREFIX_BYTES = 65536


def source_record(event: Any) -> SourceRecord:
    """A Faust event as the client-neutral record the dead-letter helpers take."""
    m = event.message
    headers = m.headers
    if isinstance(headers, dict):
        headers = list(headers.items())
    ts = m.timestamp
    return SourceRecord(
        topic=m.topic,
        partition=m.partition,
        offset=m.offset,
        key=m.key,
        value=m.value,
        headers=headers_to_dict(headers),
        timestamp_ms=int(round(ts * 1000.0)) if ts else None,
        # log_append_time stays False: Faust's Message.timestamp_type is aiokafka's over
        # Kafka, but its in-memory channel sets 1 for any timestamp a sender gave, so
        # 1 does not reliably mean the broker's append; nothing on this path splits
        # the produce leg off anyway (pipeline/worker/publisher.py does, for the worker).
    )


class BatchScorer:
    """One pipeline's model and codec, shared by the batches of one Faust worker.

    ONNX Runtime runs on one dedicated thread (``in_thread=True``): it releases the
    GIL, so the event loop keeps taking events -- and the batch that forms meanwhile
    is what the adaptive policy dispatches next -- instead of freezing for the run.
    """

    def __init__(
        self,
        pipeline: str = "ctr",
        *,
        providers: str = "auto",
        intra_op_threads: int = 1,
        warmup: bool = True,
        in_thread: bool = True,
        codec_options: dict[str, Any] | None = None,
        gil_switch_interval_ms: float | None = None,
        group_id: str = "",
        carry_headers: Sequence[str] = TRACE_HEADERS,
    ) -> None:
        """group_id: the Faust app id (its consumer group), named by dead letters as
        Kafka Connect's connector.name (consumers/dead_letter.py). carry_headers: the
        request headers each result carries, as the worker's `result_headers`."""
        self.carry_headers = frozenset(carry_headers)
        from pipeline.config import load_config

        overrides: dict[str, Any] = {"pipeline": pipeline}
        if codec_options:
            overrides["codec"] = dict(codec_options)
        # The codec factories take a WorkerConfig; build the default one, never from
        # the environment (TIDEBATCH_* belongs to `tidebatch run`).
        cfg = load_config(overrides=overrides, environ={})
        self.pipeline = get_pipeline(pipeline)
        self.model = self.pipeline.load_model()
        self.codec = self.pipeline.make_codec(cfg)
        self.session = InferenceSession(self.model.onnx_path, providers, intra_op_threads)
        self.provider = self.session.provider
        self.step = ScoringStep(self.model, self.codec, self.session)
        self.origin = Origin(group_id, member_id(None), class_path(self.codec))
        self.cost_prior: AffineCost | None = self.step.warm_up(self.pipeline) if warmup else None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="tidebatch-ort") if in_thread else None
        if gil_switch_interval_ms is not None:
            # Process-wide (sys.setswitchinterval), like `tidebatch run`'s
            # runtime.gil_switch_interval_ms. Not the default here: measured on the
            # Faust example (4 drains of 3000 CTR requests), 0.5 ms drained 678-685
            # req/s against 816-907 with Python's 5 ms, and p50/p99 at 300 req/s did
            # not differ beyond the noise. The event loop does more Python work
            # between GIL hand-overs than the worker's source thread.
            sys.setswitchinterval(gil_switch_interval_ms / 1000.0)

    # ------------------------------------------------------------------ set-up
    def cost_model(self) -> CostModel:
        """A fresh cost model seeded with the warm-up profile (one per batcher)."""
        return CostModel(prior=self.cost_prior) if self.cost_prior is not None else CostModel()

    def decode(self, event: Any) -> Decoded:
        """``prepare=`` for adaptive_batches: the codec's decode of the event (raises
        DecodeError for invalid input, which then reaches the body as rejected)."""
        headers = getattr(event.message, "headers", None)
        if isinstance(headers, dict):
            headers = list(headers.items())
        return self.codec.decode(event.value, headers_to_dict(headers))

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False)

    # ------------------------------------------------------------------ inference
    def infer(self, decoded: Sequence[Decoded], pad_to_rows: int | None = None) -> tuple[list[dict], float]:
        """collate -> ONNX Runtime -> split, as the worker's executor does
        (pipeline/scoring.py); one result per request and the model's seconds (what the
        cost model learns)."""
        return self.step.infer(decoded, pad_to_rows)

    async def _infer(self, decoded: Sequence[Decoded], pad_to_rows: int | None) -> tuple[list[dict], float]:
        if self._executor is None:
            return self.infer(decoded, pad_to_rows)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.infer, decoded, pad_to_rows)

    async def score(self, batch: FaustBatch) -> tuple[list[dict | None], list[str | None], float]:
        """Results per event of the batch (None where the model refused that request,
        with the reason in the second list), and the model seconds. A batch the model
        refuses is retried request by request, so one poison request cannot sink the
        others (the worker's rule)."""
        decoded: list[Decoded] = batch.prepared
        if not decoded:
            return [], [], 0.0
        try:
            results, seconds = await self._infer(decoded, batch.pad_to_rows)
            return list(results), [None] * len(results), seconds
        except Exception as exc:
            log.warning("batch of %d requests failed (%s); retrying one by one", len(decoded), exc)
        if self._executor is None:
            singles = self.step.one_by_one(decoded)
        else:
            singles = await asyncio.get_running_loop().run_in_executor(self._executor, self.step.one_by_one, decoded)
        return [s.result for s in singles], [s.error for s in singles], sum(s.seconds for s in singles)

    # ------------------------------------------------------------------ publishing
    async def score_and_send(
        self,
        batch: FaustBatch,
        output_topic: Any,
        *,
        dlq_topic: Any = None,
        late_topic: Any = None,
        wait: bool = False,
    ) -> list[Awaitable[Any]]:
        """Score the batch and send one record per event to ``output_topic`` (a Faust
        topic; same key as the request), rejected input and refused requests to
        ``dlq_topic``, routed-late requests to ``late_topic``.

        Returns the delivery futures. Unless ``wait``, they are also handed to
        ``batch.defer_ack``: the events are acked once Kafka acknowledged every send,
        while the agent already works on the next batch. With ``wait=True`` this
        returns only after every delivery (slower: one producer linger per batch).
        """
        results, errors, seconds = await self.score(batch)
        batch.service_seconds = seconds  # the cost model learns model time, as in the worker
        done_wall = wall_ms()
        timing = BatchTiming(batch.rows, seconds, batch.formed_wall_ms, done_wall)
        futures: list[Awaitable[Any]] = []
        for i, (item, result, error) in enumerate(zip(batch.items, results, errors, strict=True)):
            rec = source_record(item.event)
            if result is None:
                batch.outcomes[i] = "dlq"
                futures.append(await self._dead_letter(dlq_topic, rec, error or "model error", "inference"))
                continue
            doc = result_document(self.model, item.prepared, rec, result, timing, item.arrival_wall_ms, item.deadline_wall_ms)
            try:
                value = orjson.dumps(doc)
            except (TypeError, orjson.JSONEncodeError) as exc:
                batch.outcomes[i] = "dlq"
                futures.append(await self._dead_letter(dlq_topic, rec, f"result cannot be serialised: {exc}", "publish"))
                continue
            carried = [(k, v) for k, v in rec.headers.items() if k in self.carry_headers] or None
            if (size := record_bytes(rec.key, value, carried)) > FAUST_MAX_RECORD_BYTES:
                # As the worker (pipeline/delivery/outcomes.py): a result Kafka would refuse is
                # this request's dead letter, never an error for the whole batch.
                batch.outcomes[i] = "dlq"
                reason = f"result is {size} bytes, over the {FAUST_MAX_RECORD_BYTES}-byte record limit"
                futures.append(await self._dead_letter(dlq_topic, rec, reason, "publish"))
                continue
            futures.append(await output_topic.send(key=rec.key, value=value, headers=carried))
        for rej in batch.rejected:
            rec = source_record(rej.event)
            log.warning("dead-letter %s[%d]@%d: %s", rec.topic, rec.partition, rec.offset, rej.error)
            # Its class only: bad input's traceback says nothing (docs/OPERATIONS.md).
            futures.append(await self._dead_letter(dlq_topic, rec, str(rej.error), "decode", class_path(rej.error)))
        for item in batch.routed_late:
            rec = source_record(item.event)
            if late_topic is None:
                raise ValueError("expiry_action='route_late' needs a late_topic")
            missed_by = max(done_wall - item.deadline_wall_ms, 0.0)
            copy = late_copy(rec, missed_by, FAUST_MAX_RECORD_BYTES, DEAD_LETTER_PREFIX_BYTES, rule=item.late_rule)
            futures.append(await late_topic.send(key=copy.key, value=copy.value, headers=copy.headers))
        if wait:
            await asyncio.gather(*futures)
        else:
            batch.defer_ack(*futures)
        return futures

    async def _dead_letter(
        self, dlq_topic: Any, rec: SourceRecord, reason: str, stage: str, error: str | None = None
    ) -> Awaitable[Any]:
        if dlq_topic is None:
            # No DLQ configured: failing loudly keeps the event unacked (replayed),
            # rather than acking input nobody will ever see again.
            raise RuntimeError(
                f"{rec.topic}[{rec.partition}]@{rec.offset} cannot be scored ({reason}) and no dlq_topic is set"
            )
        copy = dead_letter_copy(rec, reason, stage, FAUST_MAX_RECORD_BYTES, DEAD_LETTER_PREFIX_BYTES, origin=self.origin, error=error)
        return await dlq_topic.send(key=copy.key, value=copy.value, headers=copy.headers)
