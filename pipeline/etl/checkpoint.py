"""The checkpoint of a `tidebatch etl` job: what lets a rerun of the same command
resume where the last run stopped, and refuse an output that holds another job
(docs/ETL.md, "Resuming")."""

from __future__ import annotations

import json
from typing import Any

from pipeline.errors import UserError
from pipeline.sinks.storage import Storage

CHECKPOINT = "_etl/checkpoint.json"


class Checkpoint:
    """`_etl/checkpoint.json` in the output: the job's identity and, per source, where
    the next unfinished chunk starts and the totals so far. Rewritten atomically after
    every chunk whose files are durable."""

    def __init__(self, storage: Storage, identity: dict[str, Any]) -> None:
        self.storage = storage
        self.identity = identity
        self.sources: dict[str, dict[str, Any]] = {}
        self.resumed = False

    @staticmethod
    def saved_identity(storage: Storage) -> dict[str, Any] | None:
        raw = storage.get(CHECKPOINT)
        if raw is None:
            return None
        try:
            return json.loads(raw)["job"]
        except (ValueError, KeyError, TypeError):
            raise UserError(f"{storage.root}/{CHECKPOINT} is unreadable; delete it to start the job over") from None

    def load(self) -> None:
        raw = self.storage.get(CHECKPOINT)
        if raw is None:
            return
        doc = json.loads(raw)
        if doc["job"] != self.identity:
            raise UserError(
                f"output {self.storage.root} holds a different job ({_difference(doc['job'], self.identity)}); "
                "use another --output, or delete its _etl/checkpoint.json to start over"
            )
        self.sources = doc.get("sources", {})
        self.resumed = True

    def get(self, source_id: str) -> dict[str, Any]:
        return self.sources.setdefault(
            source_id, {"next": None, "chunks": 0, "rows_in": 0, "rows_scored": 0, "rejected": 0, "files": 0, "done": False}
        )

    def save(self) -> None:
        doc = {"version": 1, "job": self.identity, "sources": self.sources}
        self.storage.put(CHECKPOINT, json.dumps(doc, indent=1, sort_keys=True).encode())


def _difference(old: dict[str, Any], new: dict[str, Any]) -> str:
    key = next((k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)), "?")
    return f"{key} differs"
