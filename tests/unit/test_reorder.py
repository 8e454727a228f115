from __future__ import annotations

import pytest

from pipeline.delivery.reorder import Reorder


def test_items_leave_in_number_order_whatever_order_they_arrive_in() -> None:
    r: Reorder[str] = Reorder()
    assert r.add(1, "b") == []
    assert r.add(3, "d") == []
    assert r.add(0, "a") == ["a", "b"]
    assert len(r) == 1
    assert r.add(2, "c") == ["c", "d"]
    assert r.add(4, "e") == ["e"]
    assert len(r) == 0


def test_rest_gives_what_waits_behind_a_missing_number_in_order() -> None:
    r: Reorder[int] = Reorder()
    for seq in (5, 2, 3):
        assert r.add(seq, seq * 10) == []
    assert r.rest() == [20, 30, 50]
    assert len(r) == 0


def test_a_number_cannot_be_added_twice() -> None:
    r: Reorder[int] = Reorder()
    r.add(0, 0)
    r.add(2, 2)
    with pytest.raises(ValueError):
        r.add(0, 0)
    with pytest.raises(ValueError):
        r.add(2, 2)
