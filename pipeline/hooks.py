"""Extension points of the worker's executor path (Redis features, deduplication).

Hooks run in executor threads, once per batch, so anything they do over the network
should be one round trip per batch — that is the point of batching it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from consumers.records import SourceRecord
from pipeline.codecs.base import Decoded


class WorkerHook(Protocol):
    name: str

    def before_inference(self, decoded: Sequence[Decoded]) -> None:
        """Complete the payloads of a batch in place (e.g. features looked up by id).
        Raising DecodeError-like exceptions is not allowed here: degrade instead."""
        ...

    def after_inference(self, records: Sequence[SourceRecord], docs: list[dict[str, Any]]) -> list[bool]:
        """See the result documents before they are published; may annotate them in
        place (e.g. "duplicate": true). Returns, per document, whether to publish it
        (False = drop, e.g. a replayed request with dedup action "drop")."""
        ...

    def close(self) -> None: ...
