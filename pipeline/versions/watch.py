"""Which model version to load next, from what successive scans saw (pure: no files,
no clock; pipeline/versions/manager.py calls it on every poll).

A candidate is loaded when
- it is the newest version found (repository.py orders them), and
- it is not the one serving, nor one already refused as it is now (a refused
  version is tried again only once its file changes), and
- its file looked the same on the previous scan: a version still being copied
  (its size or mtime moving) waits for the next poll instead of failing half-written.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.registry.version_folders import Candidate


class VersionWatch:
    def __init__(self, serving: Candidate | None) -> None:
        self.serving = serving
        self._refused: set[Candidate] = set()
        self._previous: Candidate | None = None

    def next_to_load(self, found: Sequence[Candidate]) -> Candidate | None:
        """The candidate to load after a scan that found `found` (oldest first)."""
        newest = found[-1] if found else None
        previous, self._previous = self._previous, newest
        if newest is None or newest == self.serving or newest in self._refused:
            return None
        return newest if newest == previous else None

    def loaded(self, candidate: Candidate) -> None:
        self.serving = candidate

    def refused(self, candidate: Candidate) -> None:
        self._refused.add(candidate)
