"""The model process (pipeline/runtime/model_process.py): a real child process running
the shipped CTR model, checked against ONNX Runtime in this process; its failures, and a
worker that loses its model process mid-stream."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from models.registry import load_spec
from pipeline.errors import UserError
from pipeline.runtime.model_process import ModelError, ModelProcessError, ProcessSession
from pipeline.runtime.session import InferenceSession
from tests.integration.opsutil import live_worker, make_topics, produce_ctr, wait_for, worker_config

MODEL = load_spec("ctr").onnx_path


def feeds(rows: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    dense = rng.exponential(5.0, (rows, 13)).astype(np.float32)
    dense[rng.random((rows, 13)) < 0.1] = np.nan
    return {"dense": dense, "cat": rng.integers(0, 65536, (rows, 26), dtype=np.int64)}


@pytest.fixture(scope="module")
def direct() -> InferenceSession:
    return InferenceSession(MODEL, "cpu", 1)


@pytest.fixture
def session():
    with ProcessSession(MODEL, "cpu", 1) as s:
        yield s


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie still answers kill(0): it has exited, its parent has not reaped it yet
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_scores_equal_in_process_onnx_runtime_also_with_batches_in_flight(session, direct) -> None:
    assert (session.provider, session.input_names, session.output_names) == ("cpu", ["dense", "cat"], ["prob"])
    for rows in (1, 7, 512, 3000):  # 3000 rows outgrows the first shared-memory slot
        f = feeds(rows, rows)
        outputs, seconds = session.run_timed(f)
        assert seconds > 0
        np.testing.assert_array_equal(outputs["prob"], direct.run(f)["prob"])
    # three threads, each with its own batches, answered in their own order
    errors: list[str] = []

    def caller(k: int) -> None:
        for i in range(30):
            f = feeds(50 + k, 1000 * k + i)
            got = session.run(f)["prob"]
            if not np.array_equal(got, direct.run(f)["prob"]):
                errors.append(f"thread {k} batch {i} got another batch's scores")

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


def test_a_batch_the_model_refuses_is_a_model_error_and_the_process_keeps_serving(session, direct) -> None:
    pid = session.pid
    bad = {"dense": np.zeros((4, 12), np.float32), "cat": np.zeros((4, 26), np.int64)}  # 12 dense columns
    with pytest.raises(ModelError) as info:
        session.run(bad)
    assert "\n" not in str(info.value) and str(info.value)
    f = feeds(5, 1)
    np.testing.assert_array_equal(session.run(f)["prob"], direct.run(f)["prob"])
    assert session.pid == pid and session.restarts == 0


def test_a_killed_model_process_fails_its_batch_and_the_next_call_starts_a_new_one(session, direct) -> None:
    first = session.pid
    os.kill(first, signal.SIGKILL)
    with pytest.raises(ModelProcessError, match="model process"):
        session.run(feeds(5, 2))
    f = feeds(64, 3)
    np.testing.assert_array_equal(session.run(f)["prob"], direct.run(f)["prob"])
    assert session.pid != first and session.restarts == 1


def test_the_model_process_ignores_sigterm_and_sigint(session) -> None:
    """A signal to the worker's terminal or process group must not kill batches the
    worker is still finishing during its own orderly shutdown."""
    os.kill(session.pid, signal.SIGTERM)
    os.kill(session.pid, signal.SIGINT)
    session.run(feeds(3, 4))
    assert session.restarts == 0


def test_close_stops_the_process_and_later_calls_fail(direct) -> None:
    s = ProcessSession(MODEL, "cpu", 1)
    pid = s.pid
    s.close()
    assert gone(pid)
    with pytest.raises(ModelProcessError):
        s.run(feeds(1, 5))


def test_the_model_process_exits_when_its_worker_is_killed(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys, time
        from pipeline.runtime.model_process import ProcessSession
        s = ProcessSession({str(MODEL)!r}, "cpu", 1)
        print(s.pid, flush=True)
        time.sleep(120)
        """
    )
    child_ends_with_its_parent(script, "the model process to exit after its worker was killed")


def child_ends_with_its_parent(script: str, what: str) -> None:
    """Run `script` (it prints the pid of a process it started, then waits), SIGKILL
    it, and wait for that process to be gone."""
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    try:
        child = int(parent.stdout.readline())
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        wait_for(lambda: gone(child), 30, what)
    finally:
        if parent.poll() is None:
            parent.kill()


def test_a_file_that_is_not_a_model_is_a_one_line_user_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not an onnx model")
    with pytest.raises(UserError) as info:
        ProcessSession(broken, "cpu", 1)
    assert "broken.onnx" in str(info.value) and "\n" not in str(info.value)


def test_string_tensors_and_zipmaps_cross_both_ways_equal_to_in_process(tmp_path: Path) -> None:
    """What is not a numeric array (pipeline/runtime/wire_values.py): a skl2onnx forest's
    string labels and its seq(map(string, float)) probabilities, a LightGBM ZipMap with
    int64 keys, and a string input, equal to ONNX Runtime in this process, through
    batches that outgrow the first shared-memory slot."""
    pytest.importorskip("skl2onnx")
    pytest.importorskip("lightgbm")
    pytest.importorskip("onnxmltools")
    from onnx import TensorProto, helper

    from tests.own_models import _save, forest_with_string_labels, lightgbm_classifier

    echo = _save(helper.make_graph(
        [helper.make_node("Identity", ["s"], ["t"])], "echo",
        [helper.make_tensor_value_info("s", TensorProto.STRING, ["N", 2])],
        [helper.make_tensor_value_info("t", TensorProto.STRING, ["N", 2])]), tmp_path / "echo.onnx")
    rng = np.random.default_rng(9)
    words = np.array(["", "cat", "émeu", "狗\U0001f415", "a" * 300], dtype=object)
    cases = [
        (forest_with_string_labels(tmp_path / "forest.onnx"), lambda n: {"x": rng.standard_normal((n, 4)).astype(np.float32)}),
        (lightgbm_classifier(tmp_path / "lgbm.onnx"), lambda n: {"features": rng.standard_normal((n, 5)).astype(np.float32)}),
        (echo, lambda n: {"s": words[rng.integers(0, len(words), (n, 2))]}),
    ]
    for path, make in cases:
        direct = InferenceSession(path, "cpu", 1)
        with ProcessSession(path, "cpu", 1) as session:
            for rows in (1, 9, 2000):
                f = make(rows)
                got, want = session.run(f), direct.run(f)
                assert list(got) == list(want), path.name
                for name, value in want.items():
                    if isinstance(value, np.ndarray):
                        assert got[name].dtype == value.dtype and got[name].tolist() == value.tolist(), (path.name, name)
                    else:
                        assert got[name] == value, (path.name, name)  # the same dicts, keys and float values


def test_worker_whose_model_process_died_scores_every_request(broker, topic_factory, unique_group_id):
    """The first batch after the death fails; its requests run again one by one on a
    new model process, so none is lost and none is dead-lettered."""
    topics = make_topics(topic_factory, 2)
    cfg = worker_config(
        broker, topics, unique_group_id,
        batching={"policy": "static", "slo_ms": 600_000}, runtime={"model_process": True},
    )
    with live_worker(cfg) as live:
        worker = live.worker
        produce_ctr(broker.bootstrap_servers, topics.input, 500, seed=41)
        wait_for(lambda: worker.stats.scored >= 500, 120, "the first 500 requests scored")
        first = worker.session.pid
        os.kill(first, signal.SIGKILL)
        produce_ctr(broker.bootstrap_servers, topics.input, 1500, seed=41, start=500)
        wait_for(lambda: worker.stats.scored >= 2000, 180, "all 2000 requests scored after the kill")
        assert worker.session.restarts >= 1 and worker.session.pid != first
        restarts = worker.metrics.registry.get_sample_value("tidebatch_model_process_restarts_total", {"pipeline": "ctr"})
        assert restarts == worker.session.restarts
        assert worker.stats.dlq == 0
    assert worker.stats.scored == 2000


def _children() -> set[int]:
    out: set[int] = set()
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/children") as fh:
            out.update(int(pid) for pid in fh.read().split())
    return out


def test_a_worker_that_fails_to_start_stops_its_model_process(broker, topic_factory, unique_group_id, monkeypatch):
    """A step of building a worker after the model process started fails (here the
    Kafka producer, pipeline/app/compose.py): the model process goes with it instead
    of living on until the worker object is garbage-collected."""
    import pipeline.app.compose as compose

    before = _children()
    started: set[int] = set()

    def no_producer(_cfg: object, _group_id: str | None = None, _credentials: object = None) -> None:
        started.update(_children() - before)  # the model process is up by now
        raise RuntimeError("no producer today")

    monkeypatch.setattr(compose, "make_producer", no_producer)
    cfg = worker_config(broker, make_topics(topic_factory, 1), unique_group_id, runtime={"model_process": True})
    with pytest.raises(RuntimeError, match="no producer today"):
        compose.build_worker(cfg)
    assert started, "no model process was started"
    assert all(gone(pid) for pid in started), f"model process {sorted(started)} still running"
