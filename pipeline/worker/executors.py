"""Executor threads: take a batch from the BatchQueue, score it (pipeline/scoring.py),
hand the outcome to the publisher in dispatch order.

ONNX Runtime runs on the executor thread itself (it releases the GIL), or with
runtime.model_process in a process of its own (runtime/model_process.py), where the
model never waits for the worker's GIL. One batch in flight per executor.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from models.registry import ModelSpec
from pipeline.batching.concurrent import BatchQueue
from pipeline.batching.request import Batch, Request
from pipeline.clock import wall_ms
from pipeline.runtime import affinity, thread_names
from pipeline.runtime.model_process import ProcessSession
from pipeline.scoring import ScoringStep, score_batch
from pipeline.versions.slot import ModelSlot
from pipeline.worker.admission import InFlight

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Finished:
    """A batch the model has run, on its way to the publisher thread."""

    batch: Batch
    results: list[dict] | None
    batch_rows: int
    seconds: float
    started_wall: int
    model: ModelSpec  # the version that scored it (pipeline/versions/slot.py)
    is_batch: bool = True  # False: one request re-run alone after its batch failed


@dataclass(slots=True)
class Done:
    """What an executor hands the publisher for one dispatched batch: its results as
    one part, or one part per request re-run alone, or none (all dead-lettered)."""

    seq: int
    parts: list[Finished]


class Executors:
    """The executor threads of one worker.

    queue: where batches come from (None from get_batch(): shut down).
    slot: the serving model version's step, which scores a batch; taken per batch, so
    a new version is swapped in between batches (pipeline/versions/slot.py).
    hand_over: gives the publisher a Done; False when nobody will take it any more.
    dead_letter: (record, reason, stage) for a request that cannot be scored.
    """

    def __init__(
        self,
        queue: BatchQueue,
        slot: ModelSlot,
        hand_over: Callable[[Done], bool],
        dead_letter: Callable[..., None],
    ) -> None:
        self.queue = queue
        self.slot = slot
        self.hand_over = hand_over
        self.dead_letter = dead_letter
        self.threads: list[threading.Thread] = []
        self._unpin_to: set[int] | None = None

    # ------------------------------------------------------------------ threads
    def start(
        self,
        count: int,
        guarded: Callable[[str, Callable[[], None]], Callable[[], None]],
        *,
        pin: bool = False,
        intra_op_threads: int = 1,
    ) -> None:
        """Start `count` executors; `guarded` wraps each body so that its death stops
        the worker. pin: one core per executor (or for the model process), the other
        threads on the rest (runtime/affinity.py); needs Linux, enough cores and a
        single-threaded model."""
        model_process = isinstance(self.slot.current.session, ProcessSession)
        # With a model process, the model is what needs a core of its own, not the executors.
        can_pin = pin and intra_op_threads == 1
        pinning = affinity.plan(1 if model_process else count) if can_pin else None
        if pin and pinning is None:
            log.warning(
                "runtime.pin_executors: needs Linux, runtime.intra_op_threads 1 and more allowed "
                "cores than executors; not pinning"
            )
        tids: list[int] = []
        for i in range(count):
            ready = threading.Event()
            core = pinning[0][i] if pinning and not model_process else None
            body = guarded(f"executor-{i}", lambda core=core, ready=ready: self.loop(core, tids, ready))
            t = threading.Thread(target=body, name=f"executor-{i}", daemon=True)
            t.start()
            ready.wait(10)
            self.threads.append(t)
        if not pinning:
            return
        # Undone by unpin(): a worker run inside another program (tests, the demo)
        # must not leave that program's threads on fewer cores.
        self._unpin_to = set(os.sched_getaffinity(0))
        if model_process:
            # A version swapped in later runs unpinned (pipeline/versions/manager.py).
            session = self.slot.current.session
            assert isinstance(session, ProcessSession)
            session.pin(pinning[0][0])
            moved = affinity.pin_other_threads([], pinning[1])
            log.info("model process pinned to core %s; %d worker threads on %s", pinning[0][0], moved, sorted(pinning[1]))
        else:
            moved = affinity.pin_other_threads(tids, pinning[1])
            log.info("executors pinned to cores %s; %d other threads on %s", pinning[0], moved, sorted(pinning[1]))

    def join(self, timeout: Callable[[], float]) -> bool:
        """Wait for every executor, each for at most timeout() s; True if all ended."""
        for t in self.threads:
            t.join(timeout=timeout())
        return not any(t.is_alive() for t in self.threads)

    def unpin(self) -> None:
        """Give every thread of the process its cores back."""
        if self._unpin_to is not None:
            affinity.pin_other_threads([], self._unpin_to)
            self._unpin_to = None

    # ------------------------------------------------------------------ one executor
    def loop(
        self, core: set[int] | None = None, tids: list[int] | None = None, ready: threading.Event | None = None
    ) -> None:
        # Its own name in `top -H` and /proc, for per-thread CPU (runtime/thread_names.py).
        thread_names.name_current_thread(threading.current_thread().name)
        if core is not None:
            affinity.pin_current_thread(core)
        if tids is not None:
            tids.append(threading.get_native_id())
        if ready is not None:
            ready.set()
        while True:
            batch = self.queue.get_batch()
            if batch is None:
                return
            parts: list[Finished] = []
            step = self.slot.acquire()
            try:
                self.run_batch(step, batch, parts)
            except Exception as exc:  # never lose a batch to a bug: dead-letter it
                log.exception("batch failed")
                covered = {id(req) for part in parts for req in part.batch.requests}
                rest = [r for r in batch.requests if id(r) not in covered]
                dead_letter_internal(self.dead_letter, rest, exc, "inference")
            finally:
                self.slot.release(step)
            # Exactly once per dispatched batch, even empty: the publisher waits for
            # every sequence number in turn. False: no publisher to take it any more.
            if not self.hand_over(Done(batch.seq, parts)):
                return

    def run_batch(self, step: ScoringStep, batch: Batch, parts: list[Finished]) -> None:
        """Score one batch with `step` into `parts`: one part, or (the model refused the batch) one
        part per request it accepted alone; the others are dead-lettered."""
        started_wall = wall_ms()
        run = score_batch(step, [r.item.decoded for r in batch.requests], batch.pad_to_rows,
                          refused=partial(self.queue.done, batch, 0.0))
        if run.singles is not None:
            for req, single in zip(batch.requests, run.singles, strict=True):
                if single.result is None:
                    inf: InFlight = req.item
                    self.dead_letter(inf.rec, single.error, "inference")
                    continue
                alone = Batch([req], req.rows, batch.bucket, batch.reason, batch.formed_at, batch.late)
                parts.append(Finished(alone, [single.result], req.rows, single.seconds, single.started_wall, step.model, is_batch=False))
            return
        self.queue.done(batch, run.seconds)
        parts.append(Finished(batch, run.results, batch.rows, run.seconds, started_wall, step.model))


def dead_letter_internal(
    dead_letter: Callable[..., None], requests: list[Request], exc: Exception, stage: str
) -> None:
    """A bug of ours, not bad input: the requests still get an outcome (the DLQ, with
    the error as the reason), so none is lost and the worker keeps going."""
    reason = f"internal error: {type(exc).__name__}: {exc}"
    for req in requests:
        inf: InFlight = req.item
        dead_letter(inf.rec, reason, stage, error=exc)
