"""The contract every event codec fulfils.

A codec turns one Kafka message value (+ headers) into a `Decoded` request, stacks
the payloads of a batch into model feeds, and splits the model outputs back into one
result document per request. Codecs do no I/O and never see Kafka objects.

Optional, beside the protocol's methods: `decode_many(messages)` (a poll's worth at
once, `decode_all` below) and `samples(seed) -> (i -> Sample)`, valid requests for the
warm-up profile, `tidebatch profile` and `tidebatch produce` (the shipped codecs give
their load generators', pipeline/loadgen/; a codec without one gets them from its
entry's `samples` file or, for tensor-json, from the graph: pipeline/registry/user_pipelines.py);
`tenant_of(value, headers) -> str | None`, a request's tenant read without decoding it
(admission's shed order with tenant classes, pipeline/worker/admission.py; without it
admission sheds tenant-blind, oldest first); `decode_document(doc, raw)`, one request
already read into a mapping of fields (the JSON path after parsing it), with
`request_type(name)` and `result_fields()` describing the documents
(pipeline/codecs/record_types.py): the schema-registry codecs (schema_wire.py) read
records in Avro, Protobuf or JSON Schema and hand the codec their documents; `inner`:
such a codec's document codec, whose sample requests (JSON) the warm-up decodes.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

Sample = tuple[bytes | None, bytes, list[tuple[str, bytes]]]  # one request record: key, value, headers


class DecodeError(ValueError):
    """Input that can never be scored. The message is the one-line reason that goes
    into the dead-letter record, e.g. "items[3].C14: expected string, got int"."""


class NotReady(DecodeError):
    """A request that cannot be decoded yet: something it needs (its writer's schema) is
    being fetched. `ready()` says when decoding it again may give its outcome;
    `failing()` whether the fetch has failed (not merely not answered yet); the message
    is the reason it never got one (the worker dead-letters it with that once its
    deadline passed and the fetch failed: pipeline/worker/waiting.py). Elsewhere it is
    a DecodeError."""

    def __init__(self, reason: str, ready: Callable[[], bool], failing: Callable[[], bool] = lambda: True) -> None:
        super().__init__(reason)
        self.ready = ready
        self.failing = failing


@dataclass(slots=True)
class Decoded:
    request_id: str
    rows: int  # model rows this request occupies (a CTR request with 50 items = 50)
    payload: Any  # codec-specific, consumed by collate()
    priority: int = 0
    deadline_ms: int | None = None  # request's own budget in ms; may only tighten the SLO
    tenant: str | None = None
    bucket: Hashable = 0  # shape bucket key; requests of different buckets never share a batch
    extra: dict[str, Any] = field(default_factory=dict)  # echoed into the result (e.g. item ids)


class Codec(Protocol):
    name: str

    def decode(self, value: bytes | None, headers: Mapping[str, bytes] | None) -> Decoded:
        """Raise DecodeError with a precise one-line reason for anything invalid."""
        ...

    def collate(self, payloads: Sequence[Any], pad_to_rows: int | None = None) -> dict[str, np.ndarray]:
        """Stack payloads into the model's input feeds (input name -> array). If
        pad_to_rows is given, pad the batch axis up to it (padding never reaches a result)."""
        ...

    def split(self, outputs: Mapping[str, np.ndarray], decoded: Sequence[Decoded]) -> list[dict[str, Any]]:
        """One JSON-ready dict per request, in order, from the model outputs of the
        batch (rows in the same order collate() stacked them)."""
        ...


def decode_all(
    codec: Codec, messages: Sequence[tuple[bytes | None, Mapping[str, bytes] | None]]
) -> list[Decoded | Exception]:
    """Decode a poll's worth of messages: a Decoded or the exception per message, in
    order. Uses the codec's ``decode_many`` where it has one (a batch pass can be much
    cheaper per message, e.g. the CTR binary form's feature hashing)."""
    many = getattr(codec, "decode_many", None)
    if many is not None:
        return many(messages)
    out: list[Decoded | Exception] = []
    for value, headers in messages:
        try:
            out.append(codec.decode(value, headers))
        except Exception as exc:  # the caller tells DecodeError from a codec bug
            out.append(exc)
    return out
