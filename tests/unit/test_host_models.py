"""The shared model host's sessions (pipeline/runtime/host_models.py), with a fake
session maker: shared per file and settings, closed with their last user."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.errors import UserError
from pipeline.runtime.host_models import Models


class Session:
    def __init__(self, path: str, providers: str, threads: int, options: str | None) -> None:
        if Path(path).read_bytes() == b"broken":
            raise UserError(f"cannot load model {Path(path).name}: not a model")
        self.path, self.closed = path, False
        self.provider, self.input_names, self.output_names = "cpu", ["x"], ["y"]

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "m.onnx"
    path.write_bytes(b"model one")
    return path


def test_the_same_file_and_settings_share_one_session(model: Path, tmp_path: Path) -> None:
    models = Models(Session)
    a = models.open(str(model), "cpu", 1)
    b = models.open(str(tmp_path / "." / "m.onnx"), "cpu", 1)  # the same file by another path
    assert a is b and a.users == 2 and models.opened == 1
    assert models.open(str(model), "cpu", 2) is not a  # other threads: another session
    assert models.open(str(model), "cuda", 1) is not a
    assert models.open(str(model), "cpu", 1, '{"tf32":true}') is not a  # other device keys
    assert a.hello() == {"handle": a.handle, "provider": "cpu", "input_names": ["x"], "output_names": ["y"]}


def test_the_last_user_closes_the_session(model: Path) -> None:
    models = Models(Session)
    a = models.open(str(model), "cpu", 1)
    models.open(str(model), "cpu", 1)
    models.release(a)
    assert not a.session.closed and models.snapshot() == [a]
    models.release(a)
    assert a.session.closed and models.snapshot() == []
    again = models.open(str(model), "cpu", 1)
    assert again is not a and again.handle != a.handle and models.opened == 2


def test_a_new_version_of_the_file_is_a_new_session_beside_the_old(model: Path) -> None:
    models = Models(Session)
    old = models.open(str(model), "cpu", 1)
    model.write_bytes(b"model two, longer")
    os.utime(model, ns=(1, 1))
    new = models.open(str(model), "cpu", 1)
    assert new is not old and not old.session.closed
    assert {m.handle for m in models.snapshot()} == {old.handle, new.handle}


def test_a_model_that_does_not_load_opens_nothing(tmp_path: Path) -> None:
    broken = tmp_path / "b.onnx"
    broken.write_bytes(b"broken")
    models = Models(Session)
    with pytest.raises(UserError, match="b.onnx"):
        models.open(str(broken), "cpu", 1)
    with pytest.raises(FileNotFoundError):
        models.open(str(tmp_path / "missing.onnx"), "cpu", 1)
    assert models.snapshot() == [] and models.opened == 0
