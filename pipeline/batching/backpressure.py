"""When the source thread takes records from its Kafka client, given the queue's rows.

Pure: the worker passes in the queue's backpressure rows and its clock and acts on the
answer (how many records to poll for, whether the partitions should be paused).

Why not simply pause the partitions above the high watermark: librdkafka's pause()
purges the records it has already prefetched, and after resume() it only fetches again
on its broker thread's next wake-up. Measured on the embedded broker: 0.7-0.8 s from
resume() to the first record, every time (bench/pipeline_capacity.py saturation went
from 36k to about 150k rows/s once the worker stopped pausing). librdkafka's own prefetch
queue is bounded (queued.max.messages.kbytes, queued.min.messages) and stops fetching
when full, so not taking records is backpressure already (the librdkafka author's
advice, confluentinc/librdkafka#1447).

Three states:

- OPEN: the queue is at or below its low watermark, or has not yet reached the high
  one: poll for a full batch of records.
- HOLD: the queue reached its high watermark. Take no records, except one every
  ``trickle_interval`` seconds: rebalance callbacks and the max.poll.interval.ms
  liveness check are served only inside a poll, and a slow model (a camera pipeline
  on CPU needs minutes for 20k frames) must not stall a group rebalance or get the
  member evicted. The trickled records are admitted normally.
- PAUSED: the trickled records did not drain: the queue grew by ``stall_rows`` (the
  high watermark by default) above what it held when the hold began (a stuck model).
  Pause the partitions so nothing more arrives, and keep polling for events only.
  This is the rare path, so its refetch cost does not matter. (Measured from the
  hold's start, not as an absolute limit: one full poll can overshoot the high
  watermark by many rows, and that alone must not pause.)

Both HOLD and PAUSED end, back to OPEN, once the queue is at or below the low watermark.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Intake(Enum):
    OPEN = "open"
    HOLD = "hold"
    PAUSED = "paused"


@dataclass(frozen=True, slots=True)
class IntakeDecision:
    state: Intake
    max_records: int  # 0: do not poll for records now
    started_hold: bool  # this step moved OPEN -> HOLD (a new backpressure episode)


class Backpressure:
    def __init__(
        self,
        high_rows: int,
        low_rows: int,
        *,
        poll_records: int,
        stall_rows: int | None = None,
        trickle_interval: float = 0.1,
    ) -> None:
        if not 0 <= low_rows < high_rows:
            raise ValueError("need 0 <= low_rows < high_rows")
        stall = high_rows if stall_rows is None else stall_rows
        if stall < 1:
            raise ValueError("stall_rows must be >= 1")
        if poll_records < 1 or trickle_interval <= 0:
            raise ValueError("poll_records must be >= 1 and trickle_interval > 0")
        self.high_rows = high_rows
        self.low_rows = low_rows
        self.stall_rows = stall
        self.poll_records = poll_records
        self.trickle_interval = trickle_interval
        self.state = Intake.OPEN
        self.episodes = 0
        self._next_trickle = 0.0
        self._pause_at_rows = 0

    def step(self, rows: int, now: float) -> IntakeDecision:
        """The state for a queue holding ``rows`` backpressure rows at ``now``, and how
        many records to poll for in this turn of the source loop."""
        started = False
        if self.state is Intake.OPEN:
            if rows >= self.high_rows:
                self.state = Intake.HOLD
                self.episodes += 1
                started = True
                self._next_trickle = now + self.trickle_interval
                self._pause_at_rows = rows + self.stall_rows
        elif rows <= self.low_rows:
            self.state = Intake.OPEN
        elif self.state is Intake.HOLD and rows >= self._pause_at_rows:
            self.state = Intake.PAUSED

        if self.state is Intake.OPEN:
            return IntakeDecision(Intake.OPEN, self.poll_records, started)
        if self.state is Intake.PAUSED:
            # The partitions are paused: a poll returns no records, only events.
            return IntakeDecision(Intake.PAUSED, self.poll_records, started)
        if now >= self._next_trickle:
            self._next_trickle = now + self.trickle_interval
            return IntakeDecision(Intake.HOLD, 1, started)
        return IntakeDecision(Intake.HOLD, 0, started)
