"""A model process that dies and cannot be started again (the model no longer loads:
a file replaced under the worker, the GPU gone) is counted on every attempt, so
tidebatch_model_process_restarts_total and the TidebatchModelProcessRestarting alert
see it, and the counter agrees with ProcessSession.restarts. No real process: a fake
channel stands in (tests/integration/test_model_process.py runs the real one)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.errors import UserError
from pipeline.runtime import model_process


class _FakeProc:
    pid = 4242


class _FakeChannel:
    starts = 0
    fail_from = 2  # the second start (the first restart) on fails to load the model

    def __init__(self, path, providers, threads) -> None:
        type(self).starts += 1
        if type(self).starts >= self.fail_from:
            raise UserError("model process for m.onnx did not start: cannot load the model")
        self.proc = _FakeProc()
        self.hello = {"provider": "cpu", "input_names": ["x"], "output_names": ["y"]}
        self.dead: str | None = None
        self.closed = False

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def session(monkeypatch, tmp_path):
    monkeypatch.setattr(model_process, "_Channel", type("Channel", (_FakeChannel,), {"starts": 0}))
    path = tmp_path / "m.onnx"
    path.write_bytes(b"not read by the fake")
    calls: list[int] = []
    s = model_process.ProcessSession(path, on_restart=lambda: calls.append(1))
    return s, calls


def test_every_failed_restart_is_counted(session):
    s, calls = session
    s._channel.dead = "model process exited with signal 9"
    for attempt in (1, 2, 3):
        with pytest.raises(UserError, match="did not start"):
            s.run_timed({"x": np.zeros((1, 1), np.float32)})
        assert s.restarts == attempt and len(calls) == attempt
