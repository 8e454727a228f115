"""The codecs `avro`, `protobuf` and `jsonschema`: requests and results in Confluent's
schema-registry wire format (docs/SCHEMA_REGISTRY.md), around a codec with a document
form (ctr.py, tensor_json.py: `decode_document`, `request_type`, `result_fields`).

A request is read with confluent-kafka's deserializer into a document, and the inner
codec maps the document's fields to the model's inputs exactly as it maps a JSON
request's (one code path from a document to feeds). Batches and results are the inner
codec's; a result document is written with confluent-kafka's serializer, its schema
(made from the result document's fields: record_types.result_record) registered under
`<output topic>-value`, so a consumer reads it with the stock deserializer.

Schemas: the writer's schema is found by the record's id, and each id is fetched once
(the client caches it for good); a new id mid-stream (schema evolution) is just one
more fetch. The fetch of an id the codec has not seen runs on a thread of its own
(`fetches`, pipeline/registry/schema_fetch.py), never in decode: the request gets
NotReady (base.py) and waits in the worker, bounded by its deadline, while records of
known ids go on being decoded, also while the registry is down. An id the registry
does not have, a record in another encoding, a bad magic byte, a payload its schema
does not read: DecodeError with a one-line reason, the request's dead letter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, Protocol

import numpy as np

from pipeline.codecs.base import Decoded, DecodeError, NotReady
from pipeline.codecs.record_types import check_name, record_name, records, result_record
from pipeline.codecs.schema_records import SCHEMA_TYPES, RecordReader, RecordWriter, check_format

HEADER_BYTES = 5  # magic byte + 4-byte schema id (Confluent's wire format)
_TYPE_WORDS = {"AVRO": "an Avro", "PROTOBUF": "a Protobuf", "JSON": "a JSON Schema"}


class SchemaFetches(Protocol):
    """The writer schemas being fetched (pipeline/registry/schema_fetch.py SchemaFetcher)."""

    def known(self, key: str) -> bool:
        """Fetched: decoding a record of it asks the registry nothing."""
        ...

    def fetch(self, key: str, fetch: Callable[[], object]) -> None:
        """Have `fetch` called on the fetcher's thread until it succeeds (once per key)."""
        ...

    def refusal(self, key: str) -> str | None:
        """Why the registry cannot give it (it has no such id), or None."""
        ...

    def trouble(self, key: str) -> str:
        """Why it is not fetched yet (one line)."""
        ...

    def failing(self, key: str) -> bool:
        """A fetch of it has failed (the registry did not answer, or answered with an error)."""
        ...


class SchemaWireCodec:
    """Requests and results of `inner`'s documents as `fmt` records.

    client: confluent-kafka's SchemaRegistryClient (or its mock:// client in tests);
    fetches: fetches unknown writer schemas off the decoding thread; pipeline: names
    the request and result records; output_topic: its `<topic>-value` subject holds
    the result schema."""

    def __init__(self, fmt: str, inner: Any, client: Any, fetches: SchemaFetches, pipeline: str,
                 output_topic: str) -> None:
        self.name = check_format(fmt)
        missing = [m for m in ("decode_document", "request_type", "result_fields") if not hasattr(inner, m)]
        if missing:
            raise ValueError(f"codec {getattr(inner, 'name', type(inner).__name__)} has no document form "
                             f"({', '.join(missing)}), so it cannot read {fmt} records")
        self.inner = inner
        self.fetches = fetches
        self.request = inner.request_type(record_name(pipeline, "Request"))
        self.result = result_record(record_name(pipeline, "Result"), inner.result_fields())
        for what, root in (("request", self.request), ("result", self.result)):
            for rec in records(root):
                for f in rec.fields:
                    check_name(f.name, what)
        self.reader = RecordReader(fmt, client, self.request)
        self.writer = RecordWriter(fmt, self.result, client, output_topic)
        self._expected = SCHEMA_TYPES[fmt]
        self._types: dict[str, str | None] = {}  # key -> why its schema is not this codec's, or None

    # ------------------------------------------------------------------------ decode
    def decode(self, value: bytes | None, headers: Mapping[str, bytes] | None = None) -> Decoded:
        if not value:
            raise DecodeError("empty message value")
        key = self._key(value)
        if not self.fetches.known(key):
            refused = self.fetches.refusal(key)
            if refused is not None:
                raise DecodeError(refused)
            self.fetches.fetch(key, partial(self.reader, value))
            raise NotReady(f"{key} could not be fetched from the schema registry ({self.fetches.trouble(key)})",
                           partial(self._settled, key), partial(self.fetches.failing, key))
        wrong = self._types.get(key, "")
        if wrong == "":
            wrong = self._wrong_type(value, key)
        if wrong is not None:
            raise DecodeError(wrong)
        try:
            doc = self.reader(value)
        except Exception as exc:  # fastavro, protobuf and jsonschema each raise their own
            raise DecodeError(one_line(f"{self.name} record of {key} does not decode: {type(exc).__name__}: {exc}")) from None
        if type(doc) is not dict:
            raise DecodeError(f"{key} is not a record schema: the record holds a {type(doc).__name__}")
        return self.inner.decode_document(doc, b"")

    def _key(self, value: bytes) -> str:
        """"schema id 12" (or "schema guid ...") from the record's framing."""
        if len(value) < HEADER_BYTES:
            raise DecodeError(f"{len(value)}-byte value: shorter than the schema-registry header "
                              f"(magic byte + 4-byte schema id), so not a {self.name} record")
        try:
            sid = self.reader.schema_id(value)
        except EOFError as exc:  # a Protobuf record's message indexes cut short
            raise DecodeError(f"schema-registry header cut short: {exc}") from None
        except Exception:  # confluent-kafka's SerializationError("Invalid magic byte")
            raise DecodeError(_bad_magic(value[0], self.name)) from None
        return f"schema id {sid.id}" if sid.id is not None else f"schema guid {sid.guid}"

    def _settled(self, key: str) -> bool:
        return self.fetches.known(key) or self.fetches.refusal(key) is not None

    def _wrong_type(self, value: bytes, key: str) -> str | None:
        """Why the writer's schema is not one this codec reads (a Protobuf schema's
        id on an Avro pipeline), or None."""
        try:
            got = self.reader.writer_type(self.reader.schema_id(value))
        except Exception as exc:  # not remembered: the next record of the id asks again
            return one_line(f"{key}: its schema cannot be read: {type(exc).__name__}: {exc}")
        wrong = None if got == self._expected else (
            f"{key} is {_TYPE_WORDS.get(got, got)} schema, but this pipeline reads {self.name} records "
            "(schema_registry.format, or the pipeline's codec)")
        self._types[key] = wrong
        return wrong

    # ------------------------------------------------------------------------ batch
    def collate(self, payloads: Sequence[Any], pad_to_rows: int | None = None) -> dict[str, np.ndarray]:
        return self.inner.collate(payloads, pad_to_rows)

    def split(self, outputs: Mapping[str, Any], decoded: Sequence[Decoded]) -> list[dict[str, Any]]:
        return self.inner.split(outputs, decoded)

    # ------------------------------------------------------------------------ results
    def encode_result(self, doc: Mapping[str, Any]) -> bytes:
        """The result record of a result document; ValueError (one line) when it
        cannot be written (the request's dead letter says so)."""
        try:
            return self.writer(doc)
        except Exception as exc:  # the serializers' own errors, a registry refusal
            raise ValueError(one_line(f"{self.name}: {type(exc).__name__}: {exc}")) from None

    def register_results(self) -> None:
        """Register the result schema under `<output topic>-value` now (the worker's
        start), so that no result waits for the registry; raises what the registry said."""
        self.writer.register()


def _bad_magic(byte: int, fmt: str) -> str:
    hint = ""
    if byte in b"{[":
        hint = " (a JSON request?)"
    elif 0x80 <= byte <= 0x8f:  # a msgpack map
        hint = " (a msgpack request?)"
    return (f"not a schema-registry record: magic byte 0x{byte:02x}{hint}, expected 0x00 "
            f"(Confluent wire format: magic byte, schema id, {fmt} payload)")


def one_line(text: str, limit: int = 300) -> str:
    return " ".join(text.split())[:limit]
