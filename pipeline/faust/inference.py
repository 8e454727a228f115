"""Run a tidebatch pipeline's ONNX model over the batches of ``adaptive_batches`` inside
a Faust agent, with the worker's runtime (InferenceSession + the pipeline's codec
decode/collate/split), and publish one result per event to a Faust topic.

    scorer = BatchScorer("ctr")   # or BatchScorer(config=served_config("my-ranker.yaml", None))

    @app.agent(requests)
    async def score(stream):
        async for batch in adaptive_batches(stream, prepare=scorer.decode,
                                            cost_model=scorer.cost_model(), ...):
            await scorer.score_and_send(batch, results, dlq_topic=dlq)

Results are the worker's result documents (docs/ARCHITECTURE.md "Result document"):
the codec's fields plus key, model, batch_rows, queue_wait_ms, inference_ms,
kafka_ts_ms, scored_at_ms, late, source -- so downstream consumers read both paths
alike. Invalid input (the codec's DecodeError) and requests the model refuses go to the
dead-letter topic; every record is the worker's, byte for byte (pipeline/faust/outcomes.py
sends what pipeline/delivery/outcomes.py builds); nothing is dropped silently.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from consumers.dead_letter import Origin, class_path, member_id
from consumers.records import headers_to_dict
from pipeline.batching.cost import AffineCost, CostModel
from pipeline.clock import wall_ms
from pipeline.codecs.base import Decoded
from pipeline.config import WorkerConfig, load_config
from pipeline.faust.batch import FaustBatch
from pipeline.faust.outcomes import FaustOutcomes
from pipeline.observe.tracing import TRACE_HEADERS
from pipeline.registry.pipelines import named_pipeline, pipeline_for
from pipeline.runtime.session import InferenceSession
from pipeline.scoring import BatchTiming, ScoringStep, score_batch


def served_config(path: str | None, pipeline: str | None, variable: str = "TIDEBATCH_FAUST_PIPELINE") -> WorkerConfig:
    """The worker config a Faust app serves by: the file at `path` (else the defaults),
    never the environment's TIDEBATCH_* (they belong to `tidebatch run`), its
    `pipeline` replaced by `pipeline` when given, as `tidebatch run --pipeline` does. An
    unknown name is one line naming `variable`, the setting that gave it."""
    cfg = load_config(path, environ={})
    if pipeline and pipeline != cfg.pipeline:
        named_pipeline(pipeline, cfg.pipelines, given_by=variable, config_hint="TIDEBATCH_FAUST_CONFIG")
        cfg = load_config(path, overrides={"pipeline": pipeline}, environ={})
    return cfg


class BatchScorer:
    """One pipeline's model and codec, shared by the batches of one Faust worker.

    ONNX Runtime runs on one dedicated thread (``in_thread=True``): it releases the
    GIL, so the event loop keeps taking events -- and the batch that forms meanwhile
    is what the adaptive policy dispatches next -- instead of freezing for the run.
    """

    def __init__(
        self,
        pipeline: str | None = None,
        *,
        config: WorkerConfig | None = None,
        providers: str = "auto",
        intra_op_threads: int = 1,
        warmup: bool = True,
        in_thread: bool = True,
        codec_options: dict[str, Any] | None = None,
        gil_switch_interval_ms: float | None = None,
        group_id: str = "",
        carry_headers: Sequence[str] = TRACE_HEADERS,
    ) -> None:
        """pipeline: a shipped pipeline (default ctr) served with the default worker
        config. config: a loaded worker config instead (served_config): its `pipeline`,
        a shipped one or an entry of its `pipelines:`, is served with its `codec:` and
        max_items, resolved as the worker resolves it (pipeline_for), so both score with
        the same model and codec. group_id: the Faust app id (its consumer group), named
        by dead letters as Kafka Connect's connector.name (consumers/dead_letter.py).
        carry_headers: the request headers each result carries, as the worker's
        `result_headers`."""
        self.carry_headers = frozenset(carry_headers)
        if config is None:
            overrides: dict[str, Any] = {"pipeline": pipeline or "ctr"}
            if codec_options:
                overrides["codec"] = dict(codec_options)
            # The codec factories take a WorkerConfig; build the default one, never from
            # the environment (TIDEBATCH_* belongs to `tidebatch run`).
            config = load_config(overrides=overrides, environ={})
        elif pipeline not in (None, config.pipeline) or codec_options:
            raise ValueError("with config=, the config's pipeline and codec: are served (served_config picks them)")
        self.pipeline = pipeline_for(config)
        self.model = self.pipeline.load_model()
        self.codec = self.pipeline.make_codec(config)
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

    async def score(self, batch: FaustBatch) -> tuple[list[dict | None], list[str | None], float]:
        """Results per event of the batch (None where the model refused that request,
        with the reason in the second list), and the model seconds. A batch the model
        refuses is retried request by request, so one poison request cannot sink the
        others (the worker's rule: pipeline/scoring.py score_batch)."""
        decoded: list[Decoded] = batch.prepared
        if not decoded:
            return [], [], 0.0
        if self._executor is None:
            run = score_batch(self.step, decoded, batch.pad_to_rows)
        else:
            loop = asyncio.get_running_loop()
            run = await loop.run_in_executor(self._executor, score_batch, self.step, decoded, batch.pad_to_rows)
        if run.singles is None:
            assert run.results is not None
            return list(run.results), [None] * len(run.results), run.seconds
        return [s.result for s in run.singles], [s.error for s in run.singles], sum(s.seconds for s in run.singles)

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
        timing = BatchTiming(batch.rows, seconds, batch.formed_wall_ms, wall_ms())
        outcomes = FaustOutcomes(
            output_topic, dead_letter=dlq_topic, late=late_topic, origin=self.origin, carry_headers=self.carry_headers
        )
        futures = await outcomes.send_batch(batch, self.model, results, errors, timing)
        if wait:
            await asyncio.gather(*futures)
        else:
            batch.defer_ack(*futures)
        return futures
