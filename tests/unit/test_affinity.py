"""Executor core pinning (pipeline/runtime/affinity.py)."""

from __future__ import annotations

import os
import threading

import pytest

from pipeline.runtime import affinity

pytestmark = pytest.mark.skipif(not affinity.supported(), reason="Linux thread affinity")


def test_plan_gives_each_executor_a_core_and_keeps_the_rest(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert affinity.plan(1) == ([{0}], {1, 2, 3})
    assert affinity.plan(3) == ([{0}, {1}, {2}], {3})


def test_plan_declines_without_a_core_left_for_the_other_threads(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert affinity.plan(2) is None
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5})
    assert affinity.plan(1) is None


def test_pinning_moves_the_other_threads_but_not_the_kept_one():
    original = os.sched_getaffinity(0)
    target = {min(original)}
    started, release = threading.Event(), threading.Event()
    tid: list[int] = []

    def other() -> None:
        tid.append(threading.get_native_id())
        started.set()
        release.wait(10)

    t = threading.Thread(target=other)
    t.start()
    started.wait(10)
    me = threading.get_native_id()
    try:
        moved = affinity.pin_other_threads([me], target)
        assert moved >= 1
        assert os.sched_getaffinity(tid[0]) == target
        assert os.sched_getaffinity(me) == original  # kept
    finally:
        release.set()
        t.join()
        affinity.pin_other_threads([], original)
