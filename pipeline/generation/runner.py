"""Runs a GenerationScheduler Plan (pipeline/generation/scheduler.py) on the decoder's
ONNX graph (models/decoder/export.py): prefill chunks and one decoding step for every
active sequence, the KV cache of each sequence kept in its slot's row of arrays sized
by the KvBudget (pipeline/generation/budget.py).

The graph takes rows at different positions in one call (each row brings its positions
and a mask over its past and new tokens; models/decoder/export.py), so a step is one
ORT call for all decoding sequences and one for all prefill chunks. Why not one call
for both: the new-token axis is as wide as the longest row, so a decode row in a
prefill call would be padded to the prompt's length and cost as much as a prefill.

Per prefill call: the rows' caches are gathered from their slots up to the longest
one (a shorter row's missing columns are holes the mask hides), and only each row's
new columns of the graph's present_* outputs are written back to its slot. Decoding
calls run in place on the slots (pipeline/generation/slot_decoder.py) when the runner
is given an InPlaceDecoder: no gather, no copy back, each row attending to its own
length. Without one they go through the same gather as prefill.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from pipeline.generation.scheduler import Plan
from pipeline.generation.sequence import GenRequest, Sequence
from pipeline.generation.shape import DecoderShape
from pipeline.generation.stream import Generation, sample

if TYPE_CHECKING:
    from pipeline.generation.slot_decoder import InPlaceDecoder


class Session(Protocol):
    def run(self, feeds: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]: ...


@dataclass(frozen=True, slots=True)
class StepResult:
    tokens: dict[str, int]  # request id -> the token it emitted
    stopped: set[str]  # request ids that emitted EOS or completed a stop string


@dataclass(frozen=True, slots=True)
class _Row:
    seq: Sequence
    tokens: list[int]  # new tokens this call feeds
    start: int  # position of the first one == tokens already in the slot's cache
    emits: bool  # its last logits give the sequence's next token


@dataclass(frozen=True, slots=True)
class _Batch:
    """A decoding call's rows as the graph left them: their slots in order, positions,
    full attention mask and present_* outputs."""

    slots: tuple[int, ...]
    starts: np.ndarray
    mask: np.ndarray
    present: list[np.ndarray]


class DecoderRunner:
    def __init__(self, session: Session, shape: DecoderShape, max_slots: int,
                 in_place: InPlaceDecoder | None = None) -> None:
        self.session = session
        self.in_place = in_place  # decoding steps on the slots themselves, when given
        self.shape = shape
        cache = (max_slots, shape.heads, shape.context, shape.head_dim)
        # [past_key_0, past_value_0, past_key_1, ...]: the graph's input order
        self.cache = [np.zeros(cache, np.float32) for _ in range(2 * shape.layers)]
        self.lengths = np.zeros(max_slots, np.int64)  # tokens in each slot's cache
        self.calls = 0  # ORT calls made (a unit test checks the two-call bound)
        self._last: _Batch | None = None  # the last decoding call, reused while its rows stay

    def run(self, plan: Plan) -> StepResult:
        """Run the plan's step: the token each emitting sequence produced, by request id,
        pushed into its Generation (GenRequest.item), and the ids whose token ended them
        (EOS or a stop string): what scheduler.complete() takes as `stopped`."""
        prefill = [_Row(c.sequence, _gen(c.sequence).prompt[c.start:c.start + c.tokens], c.start,
                        c.completes_prompt) for c in plan.prefill]
        decode = [_Row(s, [_gen(s).last_token], s.context_tokens - 1, True) for s in plan.decode]
        out = StepResult({}, set())
        for rows, decoding in ((prefill, False), (decode, True)):
            if rows:
                step = self._decode_in_place if decoding and self.in_place is not None else self._call
                logits = step(rows, decoding)
                best = logits.argmax(axis=1).tolist()  # greedy rows' tokens, in one pass
                for row, row_logits, top in zip(rows, logits, best, strict=True):
                    if row.emits:
                        gen = _gen(row.seq)
                        token = top if gen.temperature <= 0.0 else sample(row_logits, gen.temperature, gen.rng)
                        out.tokens[row.seq.request_id] = token
                        ended = gen.push(token)
                        if ended:
                            out.stopped.add(row.seq.request_id)
                        if ended or len(gen.tokens) >= gen.max_new_tokens:
                            # its slot is free once the scheduler retires it; at length 0
                            # it costs an in-place step nothing while it waits in range
                            self.lengths[row.seq.slot] = 0
        return out

    def _decode_in_place(self, rows: list[_Row], decoding: bool = True) -> np.ndarray:
        """One in-place decoding call (pipeline/generation/slot_decoder.py); the rows' logits."""
        assert self.in_place is not None
        self._check(rows)
        logits = self.in_place.step(self.cache, self.lengths, {r.seq.slot: r.tokens[0] for r in rows})
        self.calls += 1
        self.lengths[[r.seq.slot for r in rows]] += 1
        return logits

    def _call(self, rows: list[_Row], decoding: bool) -> np.ndarray:
        """One ORT call for rows; each row's last real logits, [rows, vocab]."""
        self._check(rows)
        n, layers = len(rows), self.shape.layers
        slots = np.array([r.seq.slot for r in rows])
        starts = np.array([r.start for r in rows], np.int64)
        last = self._last
        if decoding and last is not None and last.slots == tuple(slots) and np.array_equal(starts, last.starts + 1):
            # The same sequences as the last decoding call, one token on: its present_*
            # are this call's past as they stand (each row's holes where they were), so
            # nothing is gathered: the gather copies every row's whole cache, and at 16
            # rows it took longer than the ORT call itself.
            past_kv, past = last.present, last.mask.shape[1]
            mask = np.concatenate([last.mask, np.ones((n, 1), np.int64)], axis=1)
        else:
            past = int(starts.max())
            past_kv = [c[slots, :, :past, :] for c in self.cache]
            width = max(len(r.tokens) for r in rows)
            mask = np.zeros((n, past + width), np.int64)
            mask[:, :past] = np.arange(past)[None, :] < starts[:, None]
            for i, r in enumerate(rows):
                mask[i, past:past + len(r.tokens)] = 1
        width = mask.shape[1] - past
        ids = np.zeros((n, width), np.int64)
        positions = np.zeros((n, width), np.int64)
        for i, r in enumerate(rows):
            k = len(r.tokens)
            ids[i, :k] = r.tokens
            positions[i, :k] = np.arange(r.start, r.start + k)
        feeds = {"input_ids": ids, "positions": positions, "attention_mask": mask}
        for li in range(layers):
            feeds[f"past_key_{li}"], feeds[f"past_value_{li}"] = past_kv[2 * li], past_kv[2 * li + 1]
        result = self.session.run(feeds)
        self.calls += 1
        present = [result[f"present_{kind}_{li}"] for li in range(layers) for kind in ("key", "value")]
        for store, new in zip(self.cache, present, strict=True):  # each row's new columns to its slot
            if decoding:
                store[slots, :, starts, :] = new[:, :, past, :]
            else:
                for i, r in enumerate(rows):
                    store[r.seq.slot, :, r.start:r.start + len(r.tokens), :] = new[i, :, past:past + len(r.tokens), :]
        for r in rows:
            self.lengths[r.seq.slot] = r.start + len(r.tokens)
        if decoding:
            self._last = _Batch(tuple(slots), starts, mask, present)
        elif last is not None and set(last.slots) & set(slots.tolist()):
            self._last = None  # a slot of it holds a new sequence now
        return result["logits"][np.arange(n), [len(r.tokens) - 1 for r in rows]]

    def _check(self, rows: list[_Row]) -> None:
        ctx = self.shape.context
        for r in rows:
            if r.start == 0:
                self.lengths[r.seq.slot] = 0  # a fresh prompt in a reused slot
            if self.lengths[r.seq.slot] != r.start:
                raise RuntimeError(f"slot {r.seq.slot} holds {self.lengths[r.seq.slot]} tokens, "
                                   f"the plan feeds {r.seq.request_id} from position {r.start}")
            if r.start + len(r.tokens) > ctx:
                raise ValueError(f"{r.seq.request_id} runs past the {ctx}-token context")


def _gen(seq: Sequence) -> Generation:
    return seq.request.item


def gen_request(gen: Generation, arrival: float, deadline: float, priority: int = 0,
                key: str | None = None) -> GenRequest:
    """The scheduler's view of a Generation (the Generation rides along as its item).
    key: the scheduler's id of it, unique among requests in flight (the Kafka loop
    uses the record's topic/partition/offset: two records may name one request_id);
    default the request_id."""
    return GenRequest(key or gen.request_id, len(gen.prompt), gen.max_new_tokens, arrival, deadline, priority, gen)


def open_decoder(providers: str = "cpu", intra_op_threads: int = 1) -> tuple[Session, DecoderShape]:
    """The shipped decoder (models/decoder/spec.json) in an ONNX Runtime session."""
    from models.registry import load_spec
    from pipeline.runtime.session import InferenceSession

    spec = load_spec("decoder")
    session = InferenceSession(spec.onnx_path, providers=providers, intra_op_threads=intra_op_threads)
    return session, DecoderShape.from_spec(spec.raw["architecture"])
