"""The shared model host's planner (pipeline/runtime/coalesce.py): which queued requests
share one call, how their inputs join and the outputs split back, and when not."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.runtime.coalesce import Queued, join, joinable, rows_of, split, take


def q(handle: int, rows: int | None) -> Queued:
    return Queued(handle, rows)


def test_every_request_queued_for_the_model_joins_the_call() -> None:
    assert take([q(1, 64), q(1, 64), q(1, 64)], 4096) == 3
    assert take([q(1, 64)], 4096) == 1


def test_the_call_stops_at_max_rows_and_keeps_fifo() -> None:
    # 3 x 64 = 192 > 150: the third waits for the next call, nothing behind it jumps ahead
    assert take([q(1, 64), q(1, 64), q(1, 64), q(1, 1)], 150) == 2
    # a head bigger than max_rows still runs, alone
    assert take([q(1, 5000), q(1, 1)], 4096) == 1


def test_never_past_a_request_for_another_model() -> None:
    """A request for model 2 queued between two for model 1 must not wait for the later
    one: the call takes the first only, then model 2's, then the rest."""
    queue = [q(1, 8), q(2, 8), q(1, 8), q(1, 8)]
    assert take(queue, 4096) == 1
    assert take(queue[1:], 4096) == 1
    assert take(queue[2:], 4096) == 2


def test_a_request_that_cannot_join_runs_alone_and_stops_the_run() -> None:
    assert take([q(1, None), q(1, 4)], 4096) == 1
    assert take([q(1, 4), q(1, None), q(1, 4)], 4096) == 1


def test_rows_are_the_first_dimension_every_input_shares() -> None:
    f32, i64 = np.zeros((5, 13), np.float32), np.zeros((5, 26), np.int64)
    assert rows_of({"dense": f32, "cat": i64}) == 5
    assert rows_of({"dense": f32, "cat": np.zeros((4, 26), np.int64)}) is None
    assert rows_of({"s": np.array(["a"], dtype=object)}) is None  # strings never join
    assert rows_of({"x": np.float32(1.0).reshape(())}) is None  # a scalar has no rows
    assert rows_of({}) is None


def test_inputs_join_in_request_order_and_outputs_split_back() -> None:
    a = {"x": np.arange(6, dtype=np.float32).reshape(3, 2), "k": np.array([1, 2, 3])}
    b = {"x": np.arange(6, 10, dtype=np.float32).reshape(2, 2), "k": np.array([4, 5])}
    assert joinable([a, b]) is None
    joined = join([a, b])
    np.testing.assert_array_equal(joined["x"], np.arange(10, dtype=np.float32).reshape(5, 2))
    np.testing.assert_array_equal(joined["k"], [1, 2, 3, 4, 5])
    outputs = {"y": joined["x"].sum(axis=1), "z": joined["k"][:, None] * 2}
    parts = split(outputs, [3, 2])
    assert not isinstance(parts, str)
    np.testing.assert_array_equal(parts[0]["y"], a["x"].sum(axis=1))
    np.testing.assert_array_equal(parts[1]["z"], [[8], [10]])


@pytest.mark.parametrize(
    ("other", "says"),
    [
        ({"x": np.zeros((2, 3), np.float32), "k": np.zeros(2, np.int64)}, "input 'x'"),  # another width
        ({"x": np.zeros((2, 2), np.float64), "k": np.zeros(2, np.int64)}, "input 'x'"),  # another dtype
        ({"k": np.zeros(2, np.int64), "x": np.zeros((2, 2), np.float32)}, "inputs differ"),  # another order
    ],
)
def test_inputs_that_do_not_concatenate_say_why(other, says) -> None:
    first = {"x": np.zeros((3, 2), np.float32), "k": np.zeros(3, np.int64)}
    why = joinable([first, other])
    assert why is not None and says in why and "\n" not in why


@pytest.mark.parametrize(
    ("outputs", "says"),
    [
        ({"y": np.zeros((4, 1), np.float32)}, "4 rows for 5"),  # a fixed batch, or pooled over rows
        ({"y": np.float32(0.5).reshape(())}, "not a numeric array per row"),  # one number per call
        ({"label": np.array(["a"] * 5, dtype=object)}, "object array"),  # string tensor
        ({"probs": [{"a": 0.5}] * 5}, "a list"),  # a ZipMap's maps
    ],
)
def test_outputs_that_are_not_per_row_do_not_split(outputs, says) -> None:
    why = split(outputs, [3, 2])
    assert isinstance(why, str) and says in why
