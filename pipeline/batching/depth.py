"""How many batches may be in flight at once, from the queue's backlog. Pure.

With the model in a process of its own (pipeline/runtime/model_process.py), batches
can wait in its socket while it runs another: the model never idles while the worker's
threads take the GIL back, which is what a backlog needs (a binary-request drain ran
at 322-324k rows/s with 4 in flight against 306k with 2). But a batch dispatched early
is formed early: under light load the requests that arrive meanwhile wait for the next
one, and every extra batch costs hand-overs between threads. At 50 % load (JSON CTR
requests, adaptive policy) 4 in flight with a 5 ms GIL switch interval gave mean
end-to-end latencies of 25-37 ms against 15-26 ms with one batch at a time.

So two modes, with hysteresis:

- calm: one batch in flight, formed when the model is free (as with the model in the
  worker's process), and the worker keeps its short GIL switch interval;
- backlogged: from ``enter_rows`` queued rows (the in-time queue, what the backpressure
  watermarks count) until the queue is back at ``leave_rows``: up to ``max_in_flight``
  batches and the long switch interval. Requests in a backlog wait for the model
  anyway, so what they need is the model's full rate.
"""

from __future__ import annotations


class PipelineDepth:
    def __init__(self, max_in_flight: int, enter_rows: int, leave_rows: int) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        if not 0 <= leave_rows < enter_rows:
            raise ValueError("need 0 <= leave_rows < enter_rows")
        self.max_in_flight = max_in_flight
        self.enter_rows = enter_rows
        self.leave_rows = leave_rows
        self.backlogged = False
        self.switches = 0

    def update(self, rows: int) -> bool:
        """Take the queue's rows now; True if the mode changed."""
        if not self.backlogged and rows >= self.enter_rows:
            self.backlogged = True
        elif self.backlogged and rows <= self.leave_rows:
            self.backlogged = False
        else:
            return False
        self.switches += 1
        return True

    @property
    def in_flight(self) -> int:
        return self.max_in_flight if self.backlogged else 1
