"""The shared model host's runner (pipeline/runtime/host_runner.py) with fake models and
connections, no threads: what one call holds, who gets which rows, in which order, and
what happens when the model refuses a joined call or its outputs are not per row.
tests/integration/test_shared_host.py runs the real host with the CTR model."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

from pipeline.runtime import wire
from pipeline.runtime.host_runner import Request, Runner


class Conn:
    def __init__(self) -> None:
        self.closed = False
        self.sent: list[tuple[int, dict[str, Any], dict[str, np.ndarray]]] = []

    def send(self, kind: int, header: dict[str, Any], arrays: Any = None) -> None:
        self.sent.append((kind, header, dict(arrays or {})))

    def values(self) -> list[Any]:
        return [a["y"].tolist() if kind == wire.RESULT else h["error"] for kind, h, a in self.sent]


class Model:
    """y = 2x per row; refuses any call holding a negative x."""

    def __init__(self, handle: int = 1, fixed_rows: int | None = None, pooled: bool = False) -> None:
        self.handle, self.name = handle, f"m{handle}.onnx"
        self.no_join: str | None = None
        self.counts: dict[str, int] = {}
        self.calls: list[int] = []
        self.fixed_rows, self.pooled = fixed_rows, pooled

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
        x = feeds["x"]
        self.calls.append(len(x))
        if (x < 0).any():
            raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : negative input\nsecond line")
        if self.fixed_rows is not None and len(x) != self.fixed_rows:
            raise RuntimeError(f"Got invalid dimensions for input: x index: 0 Got: {len(x)} Expected: {self.fixed_rows}")
        if self.pooled:
            return {"y": np.atleast_1d(x.sum())}  # one row whatever the batch: not per row
        return {"y": x * 2}


def req(conn: Conn, model: Model, *values: float) -> Request:
    return Request(conn, model, {"x": np.array(values, np.float32)})


class Timer:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 0.5
        return self.t


def drain(runner: Runner) -> None:
    while batch := runner.next_call(block=False):
        runner.run_call(batch)


def test_queued_requests_share_one_call_and_each_gets_its_own_rows_in_order() -> None:
    runner, model, a, b = Runner(4096, Timer()), Model(), Conn(), Conn()
    for r in (req(a, model, 1, 2), req(b, model, 3), req(a, model, 4, 5, 6)):
        runner.submit(r)
    drain(runner)
    assert model.calls == [6]
    assert a.values() == [[2, 4], [8, 10, 12]] and b.values() == [[6]]
    # every answer: the call's own seconds, and how many requests and rows it held
    assert {(h["seconds"], h["requests"], h["rows"]) for _, h, _ in a.sent + b.sent} == {(0.5, 3, 6)}
    assert runner.counts["calls"] == 1 and runner.counts["joined_calls"] == 1 and runner.counts["rows"] == 6
    assert model.counts["joined_requests"] == 3


def test_a_lone_request_runs_at_once_and_max_rows_splits_the_queue() -> None:
    runner, model, a = Runner(3, Timer()), Model(), Conn()
    runner.submit(req(a, model, 1))
    runner.run_call(runner.next_call(block=False))
    assert model.calls == [1]
    for values in ((1, 2), (3,), (4,), (5, 6, 7, 8)):
        runner.submit(req(a, model, *values))
    drain(runner)
    assert model.calls == [1, 3, 1, 4]
    assert a.values() == [[2], [2, 4], [6], [8], [10, 12, 14, 16]]


def test_requests_for_another_model_keep_their_place() -> None:
    runner, m1, m2, a = Runner(4096, Timer()), Model(1), Model(2), Conn()
    for r in (req(a, m1, 1), req(a, m2, 2), req(a, m1, 3), req(a, m1, 4)):
        runner.submit(r)
    drain(runner)
    assert (m1.calls, m2.calls) == ([1, 2], [1])
    assert a.values() == [[2], [4], [6], [8]]


def test_a_refused_joined_call_runs_again_one_by_one_and_only_the_bad_batch_fails(caplog) -> None:
    runner, model, a, b = Runner(4096, Timer()), Model(), Conn(), Conn()
    for r in (req(a, model, 1), req(b, model, -1, 2), req(a, model, 3)):
        runner.submit(r)
    drain(runner)
    assert model.calls == [4, 1, 2, 1]
    assert a.values() == [[2], [6]]
    (error,) = b.values()
    assert "negative input" in error and "\n" not in error
    assert model.no_join is None  # one bad batch: the model still joins the next ones
    assert runner.counts["one_by_one_reruns"] == 1
    runner.submit(req(a, model, 1))
    runner.submit(req(b, model, 2))
    drain(runner)
    assert model.calls[-1] == 2


def test_a_fixed_batch_model_is_run_one_by_one_from_then_on_said_once(caplog) -> None:
    runner, model, a = Runner(4096, Timer()), Model(fixed_rows=2), Conn()
    with caplog.at_level(logging.WARNING, logger="pipeline.runtime.host_runner"):
        for _ in range(2):
            runner.submit(req(a, model, 1, 2))
            runner.submit(req(a, model, 3, 4))
            drain(runner)
    assert model.calls == [4, 2, 2, 2, 2]  # one joined try, never again
    assert a.values() == [[2, 4], [6, 8]] * 2
    assert model.no_join is not None and "Expected: 2" in model.no_join
    assert len([r for r in caplog.records if "one by one" in r.getMessage()]) == 1


def test_outputs_that_are_not_per_row_are_computed_again_one_by_one() -> None:
    runner, model, a, b = Runner(4096, Timer()), Model(pooled=True), Conn(), Conn()
    runner.submit(req(a, model, 1, 2))
    runner.submit(req(b, model, 3))
    drain(runner)
    assert a.values() == [[3.0]] and b.values() == [[3.0]]  # each its own sum, not the call's
    assert model.calls == [3, 2, 1]
    assert model.no_join is not None and "1 rows for 3" in model.no_join


def test_inputs_that_do_not_join_run_one_by_one_without_giving_up_on_the_model() -> None:
    runner, model, a = Runner(4096, Timer()), Model(), Conn()
    runner.submit(Request(a, model, {"x": np.ones((2, 3), np.float32)}))
    runner.submit(Request(a, model, {"x": np.ones((2, 4), np.float32)}))
    drain(runner)
    assert model.calls == [2, 2] and model.no_join is None
    assert [h["requests"] for _, h, _ in a.sent] == [1, 1]


def test_errors_are_answered_in_their_turn_and_closed_connections_skipped() -> None:
    runner, model, a, gone = Runner(4096, Timer()), Model(), Conn(), Conn()
    runner.submit(req(a, model, 1))
    runner.submit(Request(a, None, error="no model open with handle 7 on this connection"))
    runner.submit(req(gone, model, 5))
    runner.submit(req(a, model, 2))
    gone.closed = True
    drain(runner)
    assert a.values() == [[2], "no model open with handle 7 on this connection", [4]]
    assert gone.sent == [] and 5 not in model.calls


@pytest.mark.parametrize("rows", [0, 1])
def test_string_inputs_never_join(rows) -> None:
    runner, a = Runner(4096, Timer()), Conn()

    class Echo(Model):
        def run(self, feeds):
            self.calls.append(len(feeds["s"]))
            return {"t": feeds["s"]}

    model = Echo()
    s = np.array(["a"] * rows, dtype=object)
    for _ in range(2):
        runner.submit(Request(a, model, {"s": s}))
    drain(runner)
    assert model.calls == [rows, rows]
