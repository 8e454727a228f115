"""pipeline/runtime/thread_names.py: the worker's threads carry their names into the
kernel, where per-thread CPU is read (top -H, /proc/PID/task)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from pipeline.runtime import thread_names

linux = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs /proc (Linux)")


def _kernel_name_of(body_name: str) -> tuple[bool, str]:
    got: dict[str, object] = {}

    def body() -> None:
        got["named"] = thread_names.name_current_thread(body_name)
        got["comm"] = Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()

    t = threading.Thread(target=body)
    t.start()
    t.join()
    return got["named"], got["comm"]  # type: ignore[return-value]


@linux
def test_a_thread_gets_its_name_in_the_kernel() -> None:
    assert _kernel_name_of("executor-0") == (True, "executor-0")


@linux
def test_long_and_non_ascii_names_are_cut_to_what_the_kernel_keeps() -> None:
    named, comm = _kernel_name_of("publisher-thread-with-a-long-name")
    assert named and comm == "publisher-threa"
    assert thread_names.os_name("exécuteur") == "ex?cuteur"


@linux
def test_the_main_thread_keeps_the_process_name() -> None:
    before = Path("/proc/self/comm").read_text()
    assert thread_names.name_current_thread("source") is False
    assert Path("/proc/self/comm").read_text() == before


@linux
def test_cpu_seconds_by_thread_counts_a_busy_named_thread() -> None:
    done = threading.Event()
    seen: dict[str, float] = {}

    def body() -> None:
        thread_names.name_current_thread("cpu-burner")
        x = 0
        while thread_names.cpu_seconds_by_thread().get("cpu-burner", 0.0) < 0.02:  # at least two clock ticks
            for i in range(20000):
                x += i
        seen.update(thread_names.cpu_seconds_by_thread())
        done.set()

    t = threading.Thread(target=body, daemon=True)
    t.start()
    assert done.wait(30)
    t.join()
    assert seen["cpu-burner"] >= 0.02
    assert thread_names.cpu_seconds_by_thread(sys.maxsize) == {}  # no such process
