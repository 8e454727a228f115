"""The CPU window of bench/peers/measure.py's drains (no broker, no timing): the CPU
between the first and the last result, read off a trace that must cover both."""

from __future__ import annotations

import pytest

from bench.peers.measure import Collected


def traced(*samples: tuple[float, float, float]) -> Collected:
    got = Collected()
    got.trace.extend(samples)
    return got


def test_cpu_between_interpolates_inside_the_trace() -> None:
    got = traced((1000.0, 1.0, 0.5), (2000.0, 2.0, 0.7), (3000.0, 4.0, 0.9))
    peer, broker = got.cpu_between(1500.0, 3000.0)
    assert peer == pytest.approx(2.5)
    assert broker == pytest.approx(0.3)


def test_a_window_that_starts_before_the_trace_is_refused_not_read_as_free() -> None:
    # tidebatch's rows were handed over (and traced) only once they had partitions, after
    # they had scored part of the backlog: the first result came before the first sample,
    # and np.interp clamped it there, as if that work had cost nothing.
    got = traced((2000.0, 5.0, 1.0), (3000.0, 6.0, 1.2))
    with pytest.raises(ValueError, match="outside the trace"):
        got.cpu_between(1000.0, 3000.0)
    with pytest.raises(ValueError, match="outside the trace"):
        got.cpu_between(2000.0, 3500.0)


def test_a_workers_children_are_found_as_its_descendants() -> None:
    # A `--processes N` row is a parent whose children do the work: the CPU trace must
    # read the tree (pipeline/profiling/calibration.py ProcessTree), not the parent alone.
    import subprocess
    import sys

    from pipeline.profiling.calibration import ProcessTree, descendants

    code = "import subprocess, sys; c = subprocess.Popen(['sleep', '30']); print(c.pid, flush=True); sys.stdin.read()"
    parent = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(parent.stdout.readline())  # type: ignore[union-attr]
        assert {parent.pid, grandchild} <= set(descendants(parent.pid))
        assert ProcessTree(parent.pid).cpu_seconds() >= 0.0
    finally:
        subprocess.run(["kill", str(grandchild)], check=False)
        parent.kill()
        parent.wait()
