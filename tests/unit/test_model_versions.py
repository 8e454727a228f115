"""Issue 20, item 5: model versions and hot swap (pipeline/versions/). The pure parts
(which version to load, the slot's hand-over between batches) with fakes; the manager
with real ONNX Runtime sessions of models built here (tests/own_models.py), no Kafka."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from pipeline.config import load_config
from pipeline.errors import UserError
from pipeline.observe.metrics import WorkerMetrics
from pipeline.registry.pipelines import pipeline_for
from pipeline.registry.version_folders import Candidate, scan
from pipeline.runtime.sessions import open_session
from pipeline.scoring import ScoringStep
from pipeline.versions.loader import VersionLoader
from pipeline.versions.manager import ModelVersions
from pipeline.versions.slot import ModelSlot
from pipeline.versions.watch import VersionWatch
from tests.own_models import fixed_batch, ranker, run_alone

pytest.importorskip("onnx")


# ----------------------------------------------------------------------------- repository
def _version(root: Path, n: str, seed: int = 7) -> Path:
    (root / n).mkdir(parents=True, exist_ok=True)
    return ranker(root / n / "model.onnx", seed)


def test_scan_orders_version_folders_by_number_and_skips_the_rest(tmp_path):
    for n in ("2", "10", "1"):
        _version(tmp_path, n)
    (tmp_path / "3.tmp").mkdir()  # being staged: not a version yet
    (tmp_path / "4").mkdir()  # no model.onnx (yet)
    (tmp_path / "0").mkdir()
    assert [c.version for c in scan(tmp_path)] == ["1", "2", "10"]
    single = ranker(tmp_path / "plain.onnx")
    (only,) = scan(single)
    assert (only.version, only.path) == (None, single)
    assert scan(tmp_path / "missing.onnx") == []


# ----------------------------------------------------------------------------- watch
def _c(version: str, size: int = 100, mtime: int = 1) -> Candidate:
    return Candidate(version, Path(f"/m/{version}/model.onnx"), (size, mtime))


def test_watch_loads_the_newest_version_once_its_file_has_settled():
    watch = VersionWatch(_c("1"))
    assert watch.next_to_load([_c("1")]) is None
    assert watch.next_to_load([_c("1"), _c("2", size=50)]) is None  # first seen: maybe still copying
    assert watch.next_to_load([_c("1"), _c("2", size=80)]) is None  # still growing
    assert watch.next_to_load([_c("1"), _c("2", size=80)]) == _c("2", size=80)
    watch.loaded(_c("2", size=80))
    assert watch.next_to_load([_c("1"), _c("2", size=80)]) is None


def test_watch_does_not_retry_a_refused_version_until_it_changes():
    watch = VersionWatch(_c("1"))
    found = [_c("1"), _c("2")]
    watch.next_to_load(found)
    assert watch.next_to_load(found) == _c("2")
    watch.refused(_c("2"))
    assert watch.next_to_load(found) is None and watch.next_to_load(found) is None
    fixed = [_c("1"), _c("2", mtime=2)]  # replaced by a good copy
    assert watch.next_to_load(fixed) is None
    assert watch.next_to_load(fixed) == _c("2", mtime=2)


def test_watch_ignores_older_versions_appearing():
    watch = VersionWatch(_c("5"))
    assert watch.next_to_load([_c("3"), _c("5")]) is None
    assert watch.next_to_load([_c("3"), _c("5")]) is None


# ----------------------------------------------------------------------------- slot
class FakeSession:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def _step(version: str) -> ScoringStep:
    from models.registry import ModelSpec

    return ScoringStep(ModelSpec("m", version, Path("x.onnx"), [], [], {}), None, FakeSession())  # type: ignore[arg-type]


def test_slot_swaps_between_batches_and_closes_the_old_session_after_its_last_batch():
    v1, v2 = _step("1"), _step("2")
    slot = ModelSlot(v1)
    a = slot.acquire()
    b = slot.acquire()
    assert slot.swap(v2) is v1
    assert slot.acquire() is v2  # new batches get the new version at once...
    assert a is v1 and b is v1  # ...batches under way keep theirs
    slot.release(a)
    assert v1.session.closed == 0
    slot.release(b)
    assert v1.session.closed == 1
    slot.release(v2)
    assert v2.session.closed == 0
    slot.close()
    assert (v1.session.closed, v2.session.closed) == (1, 1)


def test_slot_closes_an_idle_replaced_session_at_once():
    v1, v2 = _step("1"), _step("2")
    slot = ModelSlot(v1)
    slot.swap(v2)
    assert v1.session.closed == 1 and v2.session.closed == 0


# ----------------------------------------------------------------------------- manager
FEEDS = {"dense": np.array([[0.1, -0.2, 0.3, 0.5]], np.float32), "tokens": np.array([[1, 2, 3]], np.int64)}
REQUEST = b'{"request_id": "r", "features": [0.1, -0.2, 0.3, 0.5], "tokens": [1, 2, 3]}'


class Harness:
    """A worker's model parts as pipeline/app/compose.py builds them, without Kafka."""

    def __init__(
        self, model: Path, *, base_version: str = "1", model_process: bool = False, host_address: str | None = None
    ) -> None:
        cfg = load_config(overrides={
            "pipeline": "mine",
            "pipelines": [{"name": "mine", "model": str(model), "version": base_version,
                           "inputs": {"features": "dense", "tokens": "tokens"}, "outputs": {"score": "prob"}}],
            "runtime": {"model_process": model_process},
        }, environ={})
        pipeline = pipeline_for(cfg)
        spec = pipeline.load_model()
        self.codec = pipeline.make_codec(cfg)
        metrics = WorkerMetrics("mine", "adaptive")
        session = open_session(spec.onnx_path, cfg.runtime, host_address=host_address)
        self.slot = ModelSlot(ScoringStep(spec, self.codec, session))
        self.swaps: list[str] = []
        self.refusals: list[str] = []
        self.versions = ModelVersions(
            "mine", self.slot, spec.source or spec.onnx_path, spec.version,
            VersionLoader(cfg, pipeline, self.codec, [], metrics, session.input_names, host_address=host_address), 0.0,
            lambda step, cost: self.swaps.append(step.model.version), self.refusals.append,
        )

    def score(self) -> tuple[str, float]:
        step = self.slot.acquire()
        try:
            (result,), _ = step.infer([self.codec.decode(REQUEST)])
        finally:
            self.slot.release(step)
        return step.model.version, float(np.asarray(result["score"]).ravel()[0])

    def close(self) -> None:
        self.slot.close()


def _prob(model: Path) -> float:
    return float(run_alone(model, FEEDS)["prob"][0][0])


@pytest.mark.parametrize("model_process", [False, True], ids=["in-process", "model-process"])
def test_a_new_version_folder_is_loaded_warmed_up_and_swapped_in(tmp_path, model_process):
    repo = tmp_path / "repo"
    v1 = _version(repo, "1", seed=7)
    h = Harness(repo, model_process=model_process)
    try:
        assert h.score() == ("1", pytest.approx(_prob(v1), rel=1e-6))
        v2 = _version(repo, "2", seed=8)
        assert h.versions.poll().version is None  # first seen: waits one poll to settle
        outcome = h.versions.poll()
        assert (outcome.loaded, outcome.refused) == ("2", None)
        assert h.swaps == ["2"] and h.versions.version == "2"
        assert h.score() == ("2", pytest.approx(_prob(v2), rel=1e-6))
        assert _prob(v1) != pytest.approx(_prob(v2))  # the versions really differ
    finally:
        h.close()


@pytest.mark.parametrize(("broken", "reason"), [
    (lambda p: p.write_bytes(b"not an onnx model"), "model version 3 of mine refused: "),
    (lambda p: fixed_batch(p), "its inputs are ['x'], the serving version's ['dense', 'tokens']"),
    (lambda p: shutil.copy(ranker(p.parent / "tmp.onnx", 9), p) and os.truncate(p, 300), "model version 3 of mine refused: "),
])
def test_a_broken_version_is_refused_and_the_serving_one_keeps_serving(tmp_path, caplog, broken, reason):
    repo = tmp_path / "repo"
    v2 = _version(repo, "2", seed=8)
    h = Harness(repo)
    try:
        (repo / "3").mkdir()
        broken(repo / "3" / "model.onnx")
        outcome = h.versions.reload()  # the HTTP API: no settling wait
        assert outcome.loaded is None and reason in outcome.refused
        assert outcome.refused.endswith("; version 2 keeps serving") and "\n" not in outcome.refused
        assert h.refusals == ["3"] and h.swaps == []
        assert h.score() == ("2", pytest.approx(_prob(v2), rel=1e-6))
        assert h.versions.poll().version is None and h.versions.poll().version is None  # not retried
        assert h.refusals == ["3"]
    finally:
        h.close()


def test_a_version_whose_outputs_lack_a_configured_one_is_refused(tmp_path):
    from tests.own_models import tree_classifier

    repo = tmp_path / "repo"
    _version(repo, "1")
    h = Harness(repo)
    try:
        (repo / "2").mkdir()
        tree_classifier(repo / "2" / "model.onnx")
        assert "refused" in (h.versions.reload().refused or "")
        assert h.versions.version == "1"
    finally:
        h.close()


def test_a_changed_model_file_is_a_new_version_named_by_its_content(tmp_path):
    model = ranker(tmp_path / "m.onnx", 7)
    h = Harness(model, base_version="4")
    try:
        assert h.score()[0] == "4"
        staged = ranker(tmp_path / "staged.onnx", 8)
        os.replace(staged, model)  # an atomic replace, as a deploy would do it
        outcome = h.versions.reload()
        import hashlib

        assert outcome.loaded == f"4+{hashlib.sha256(model.read_bytes()).hexdigest()[:8]}"
        assert h.score() == (outcome.loaded, pytest.approx(_prob(model), rel=1e-6))
        assert h.versions.reload().loaded == outcome.loaded  # nothing new: still serving
    finally:
        h.close()


def test_a_repository_without_versions_is_one_line_at_start(tmp_path):
    (tmp_path / "repo" / "v1").mkdir(parents=True)
    with pytest.raises(UserError, match=r"no version folder with a model.onnx under .*repo \(e.g. .*/1/model.onnx\)"):
        Harness(tmp_path / "repo")


def test_model_poll_s_must_not_be_negative():
    with pytest.raises(UserError, match="runtime.model_poll_s"):
        load_config(overrides={"runtime": {"model_poll_s": -1}}, environ={})


def test_polling_an_unchanged_model_loads_nothing(tmp_path, monkeypatch):
    """The version serving at start is the one the watch starts from, also for a
    relative path: polls without a change swap nothing in."""
    monkeypatch.chdir(tmp_path)
    ranker(tmp_path / "m.onnx")
    repo = tmp_path / "repo"
    _version(repo, "1")
    for model in (Path("m.onnx"), Path("repo")):
        h = Harness(model)
        try:
            assert [h.versions.poll().version for _ in range(3)] == [None, None, None]
            assert h.swaps == [] and h.versions.reload().loaded == h.versions.version
        finally:
            h.close()


def test_a_version_folder_without_its_model_file_is_said_once(tmp_path, caplog):
    """Issue 48: a version copied in under another file name (or an empty folder) was
    skipped without a word; the worker says so once, and again only if it empties again."""
    import logging

    repo = tmp_path / "repo"
    _version(repo, "1")
    (repo / "2").mkdir()
    ranker(repo / "2" / "ranker.onnx")  # not model.onnx
    caplog.set_level(logging.WARNING, logger="pipeline.versions.manager")
    h = Harness(repo)
    try:
        h.versions.poll()
        h.versions.reload()
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 1 and said[0] == (
            f"mine: version folder {repo / '2'} has no model.onnx, so it is not a version (yet); 1 keeps serving")
        (repo / "2" / "ranker.onnx").rename(repo / "2" / "model.onnx")
        assert h.versions.reload().loaded == "2" and len(caplog.records) == 1
    finally:
        h.close()


def test_an_explicit_reload_tries_a_refused_version_again(tmp_path):
    """Documented (docs/OWN_MODEL.md, "Versions and hot swap"): polling never retries a
    refused version until its file changes, but `POST /model/reload` does (a refusal can
    be transient: memory, a model process that died while loading), and answers 409 again."""
    repo = tmp_path / "repo"
    _version(repo, "1")
    h = Harness(repo)
    try:
        (repo / "2").mkdir()
        (repo / "2" / "model.onnx").write_bytes(b"not an onnx model")
        assert h.versions.reload().refused and h.versions.reload().refused
        assert h.refusals == ["2", "2"] and h.versions.version == "1"
    finally:
        h.close()
