"""The records a `generate` worker writes to its output topic, keyed by request: token
chunks while a request runs, then one final record. Pure: JSON bytes from what the
loop (pipeline/generation/service.py) hands over.

At-least-once for partial streams (docs/GENERATION.md, "Delivery"): a request whose
final record was not yet durable when its worker died is generated again by the next
worker, under a new `attempt`. A reader keeps, per request_id, the chunks of one
attempt: a chunk of another attempt means the stream started over (drop what was
shown, or skip chunks whose `offset` it already has: greedy and seeded sampling give
the same text each attempt). `seq` numbers an attempt's chunks 0, 1, ... and `offset`
is the chunk's byte offset in the final text, so a gap or a repeat is visible. The
final record is the truth: its `text` is the whole answer.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from consumers.records import SourceRecord
from pipeline.generation.stream import Chunk, Generation

FINISH_DEADLINE = "deadline"  # waited past its deadline: never admitted


@dataclass(frozen=True, slots=True)
class Timing:
    """Of one request, in ms on the worker's clock; ttft from the record's timestamp."""

    ttft_ms: float | None
    latency_ms: float
    decode_s: float  # first token -> last token
    to_worker_ms: float = 0.0  # the record's timestamp -> the worker polled it (the Kafka hop, or a backlog)


def chunk_value(gen: Generation, attempt: str, chunk: Chunk) -> bytes:
    return orjson.dumps({
        "request_id": gen.request_id, "attempt": attempt, "seq": chunk.seq, "offset": chunk.offset,
        "text": chunk.text, "tokens": chunk.tokens, "final": False,
    })


def final_value(gen: Generation, attempt: str, reason: str, timing: Timing, rec: SourceRecord,
                model: str) -> bytes:
    """The one final record: the whole text, why it ended and its timings. tokens_per_s
    is the decoding rate after the first token (what a reader sees streaming); null
    with fewer than two tokens."""
    generated = len(gen.tokens)
    rate = (generated - 1) / timing.decode_s if generated > 1 and timing.decode_s > 0 else None
    return orjson.dumps({
        "request_id": gen.request_id, "attempt": attempt, "final": True, "text": gen.text,
        "finish_reason": reason, "prompt_tokens": len(gen.prompt), "generated_tokens": generated,
        "chunks": gen.chunks_sent,
        "ttft_ms": None if timing.ttft_ms is None else round(timing.ttft_ms, 3),
        "latency_ms": round(timing.latency_ms, 3), "to_worker_ms": round(timing.to_worker_ms, 3),
        "tokens_per_s": None if rate is None else round(rate, 2),
        "model": model, "source": {"topic": rec.topic, "partition": rec.partition, "offset": rec.offset},
    })
