"""Loads a pipeline's new model version, warms it up and swaps it in while the worker
keeps consuming, or refuses it with one line and keeps the serving one.

Two ways in:
- polling (runtime.model_poll_s > 0): a thread scans the model's file or version
  folders (repository.py) and loads what watch.py picks;
- `POST /model/reload` on the ops server (pipeline/ops/http.py): load the newest
  version now, without waiting for its file to look settled, and answer with the
  outcome.

Loading (`load`, built by pipeline/app/compose.py) opens a session the way the
worker's first one was opened and runs the warm-up profile through the serving codec:
a file that is corrupt, has other input names or types, or fails on the pipeline's
sample requests is refused before any request could reach it. Only one load runs at
a time; consumption and scoring go on meanwhile (the load competes for CPU, not for
any lock the worker holds). The swap itself is between batches (slot.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline.batching.cost import AffineCost
from pipeline.errors import UserError
from pipeline.registry import version_folders as repository
from pipeline.registry.version_folders import Candidate
from pipeline.scoring import ScoringStep
from pipeline.versions.slot import ModelSlot
from pipeline.versions.watch import VersionWatch

log = logging.getLogger(__name__)

# (the new version's spec) -> its warmed-up step and the cost it measured
Loader = Callable[["repository.ModelSpec"], tuple[ScoringStep, AffineCost]]


@dataclass(frozen=True, slots=True)
class LoadOutcome:
    """What one load did: `loaded` is the version now serving; `refused` why not."""

    loaded: str | None = None
    refused: str | None = None
    version: str | None = None  # the version tried (None: nothing new to load)

    def as_dict(self) -> dict[str, str | None]:
        return {"loaded": self.loaded, "refused": self.refused, "version": self.version}


class ModelVersions:
    """slot: where the serving step is swapped. model_path: the configured file or
    version folder. base_version: a plain file's configured version. load: opens and
    warms up a version. on_swap(step, cost): after a swap (metrics, the cost model)."""

    def __init__(
        self,
        pipeline: str,
        slot: ModelSlot,
        model_path: Path,
        base_version: str,
        load: Loader,
        poll_s: float,
        on_swap: Callable[[ScoringStep, AffineCost], None],
        on_refused: Callable[[str], None],
    ) -> None:
        self.pipeline = pipeline
        self.slot = slot
        self.model_path = model_path
        self.base_version = base_version
        self.load = load
        self.poll_s = poll_s
        self.on_swap = on_swap
        self.on_refused = on_refused
        serving = slot.current.model.onnx_path
        start = [c for c in repository.scan(model_path) if c.path.resolve() == serving]
        self.watch = VersionWatch(start[-1] if start else None)
        self._empty: set[Path] = set()  # version folders without a model.onnx, said once each
        self._say_empty()
        self._lock = threading.Lock()  # one load at a time
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None

    @property
    def version(self) -> str:
        return self.slot.current.model.version

    def start(self) -> None:
        if self.poll_s > 0:
            self.thread = threading.Thread(target=self._loop, name="model-versions", daemon=True)
            self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self.thread is not None:
            self.thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except Exception:  # a scan that failed (a file system hiccup): try next time
                log.exception("checking %s for a new model version failed", self.model_path)

    def poll(self) -> LoadOutcome:
        """One polling step: scan, and load what the watch picks."""
        with self._lock:
            self._say_empty()
            candidate = self.watch.next_to_load(repository.scan(self.model_path))
            return LoadOutcome() if candidate is None else self._load(candidate)

    def reload(self) -> LoadOutcome:
        """Load the newest version now (the HTTP API): no settling wait."""
        with self._lock:
            self._say_empty()
            found = repository.scan(self.model_path)
            if not found:
                return LoadOutcome(refused=f"no model version found at {self.model_path}")
            newest = found[-1]
            if newest == self.watch.serving:
                return LoadOutcome(loaded=self.version, version=self.version)
            return self._load(newest)

    def _say_empty(self) -> None:
        """One line per version folder that holds no model.onnx (a scan skips it, so a
        version copied in under another file name would otherwise wait in silence);
        again only once it held one and is empty again."""
        empty = set(repository.without_model(self.model_path))
        for folder in sorted(empty - self._empty):
            log.warning("%s: version folder %s has no %s, so it is not a version (yet); %s keeps serving",
                        self.pipeline, folder, repository.MODEL_FILE, self.version)
        self._empty = empty

    def _load(self, candidate: Candidate) -> LoadOutcome:
        serving = self.slot.current
        try:
            spec = repository.spec_for(serving.model, candidate, self.base_version)
        except OSError as exc:
            return self._refuse(candidate, candidate.version or str(candidate.path), f"cannot read it: {exc}")
        log.info("loading model version %s of %s from %s", spec.version, self.pipeline, spec.onnx_path)
        try:
            step, cost = self.load(spec)
        except UserError as exc:
            return self._refuse(candidate, spec.version, str(exc))
        except Exception as exc:  # the warm-up's own failure: the model ran and broke
            return self._refuse(candidate, spec.version, f"{type(exc).__name__}: {exc}".splitlines()[0])
        self.slot.swap(step)
        self.watch.loaded(candidate)
        self.on_swap(step, cost)
        log.info(
            "model version %s of %s serving (was %s); warm-up t(n) = %.3f ms + %.4f ms/row",
            spec.version, self.pipeline, serving.model.version, cost.a * 1e3, cost.b * 1e3,
        )
        return LoadOutcome(loaded=spec.version, version=spec.version)

    def _refuse(self, candidate: Candidate, version: str, reason: str) -> LoadOutcome:
        self.watch.refused(candidate)
        self.on_refused(version)
        line = f"model version {version} of {self.pipeline} refused: {reason}; version {self.version} keeps serving"
        log.error("%s", line)
        return LoadOutcome(refused=line, version=version)
