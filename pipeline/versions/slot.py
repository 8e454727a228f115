"""The scoring step executors take for each batch; a new model version is swapped in
between batches, never under one.

    step = slot.acquire()        # an executor, before a batch
    try: ... step.infer(...) ...
    finally: slot.release(step)
    slot.swap(new_step)          # the version manager: later batches get new_step

A batch is scored by exactly one version, the one it acquired, and its results name
that version (pipeline/worker/publisher.py reads the model from the finished batch).
The replaced step's session (a model process, maybe) is closed once the last batch
that acquired it is released, by whichever thread releases it.
"""

from __future__ import annotations

import threading

from pipeline.scoring import ScoringStep


class ModelSlot:
    def __init__(self, step: ScoringStep) -> None:
        self._lock = threading.Lock()
        self._current = step
        self._uses: dict[int, int] = {}
        self._retiring: dict[int, ScoringStep] = {}

    @property
    def current(self) -> ScoringStep:
        return self._current

    def acquire(self) -> ScoringStep:
        with self._lock:
            step = self._current
            self._uses[id(step)] = self._uses.get(id(step), 0) + 1
            return step

    def release(self, step: ScoringStep) -> None:
        with self._lock:
            left = self._uses[id(step)] - 1
            if left:
                self._uses[id(step)] = left
                return
            del self._uses[id(step)]
            idle = self._retiring.pop(id(step), None)
        if idle is not None:
            idle.session.close()

    def swap(self, step: ScoringStep) -> ScoringStep:
        """Serve `step` from the next acquire on; returns the replaced one."""
        with self._lock:
            old, self._current = self._current, step
            busy = id(old) in self._uses
            if busy:
                self._retiring[id(old)] = old
        if not busy:
            old.session.close()
        return old

    def close(self) -> None:
        """At shutdown, after the executors have ended: close every session still open."""
        with self._lock:
            steps = [self._current, *self._retiring.values()]
            self._retiring.clear()
        for step in steps:
            step.session.close()
