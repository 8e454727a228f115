"""IO binding and CUDA graphs (pipeline/runtime/io_binding.py): padding to the allowed
sizes never leaks a pad row, the CPU provider through IO binding gives session.run's
bits, and the graph path (capture per size, on one thread; one line and plain runs
where a capture fails) against a fake ONNX Runtime, since no GPU is here."""

from __future__ import annotations

import ctypes
import gc
import logging
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from models.registry import load_spec
from pipeline.runtime.device import DeviceOptions
from pipeline.runtime.io_binding import BoundRunner, batch_rows, pad_into, pad_size, take_rows
from pipeline.runtime.session import InferenceSession


def test_pad_size_is_the_next_allowed_size() -> None:
    assert [pad_size(n, (8, 16, 64)) for n in (1, 8, 9, 16, 17, 64)] == [8, 8, 16, 16, 64, 64]
    assert pad_size(65, (8, 16, 64)) is None  # larger than all: runs plain
    assert pad_size(5, ()) == 5


def test_pad_rows_are_zero_and_never_returned() -> None:
    buffer = np.full((8, 2), 7.0)
    pad_into(buffer, np.ones((3, 2)))
    assert buffer[:3].tolist() == [[1, 1]] * 3 and not buffer[3:].any()
    outputs = {"score": np.arange(8.0), "table": np.arange(4.0), "boxes": np.ones((8, 4))}
    cut = take_rows(outputs, 3, 8)
    assert cut["score"].tolist() == [0, 1, 2] and cut["boxes"].shape == (3, 4)
    assert cut["table"].shape == (4,)  # no batch axis: whole
    assert all(a.base is None for a in cut.values())  # own arrays: no view reaches the pad rows
    outputs["score"][:] = -1  # the buffer is written again by the next batch
    assert cut["score"].tolist() == [0, 1, 2]


def test_batch_rows_need_one_batch_axis() -> None:
    assert batch_rows({"a": np.zeros((5, 2)), "b": np.zeros(5)}) == 5
    with pytest.raises(ValueError, match="batch axis"):
        batch_rows({"a": np.zeros((5, 2)), "b": np.zeros(4)})


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """y = relu(x @ W + b) and a per-row sum: [N, 16] -> [N, 8], [N]."""
    rng = np.random.default_rng(3)
    w = helper.make_tensor("W", TensorProto.FLOAT, [16, 8], rng.normal(size=(16, 8)).astype(np.float32).ravel())
    b = helper.make_tensor("B", TensorProto.FLOAT, [8], rng.normal(size=8).astype(np.float32))
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "B"], ["a"]),
         helper.make_node("Relu", ["a"], ["y"]), helper.make_node("ReduceSum", ["y", "axes"], ["s"], keepdims=0)],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, ["N"])],
        [w, b, axes],
    )
    path = tmp_path_factory.mktemp("tiny") / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize("sizes", [(), (4, 16, 64)])
def test_cpu_io_binding_is_bit_identical_to_session_run(tiny_model: Path, sizes: tuple[int, ...]) -> None:
    plain = InferenceSession(tiny_model, "cpu")
    bound = InferenceSession(tiny_model, "cpu", device=DeviceOptions(io_binding=True, batch_sizes=sizes))
    assert bound._bound is not None
    rng = np.random.default_rng(0)
    for n in (1, 3, 4, 5, 16, 3, 64, 70, 1):  # repeats reuse the buffers; 70 > 64 runs plain
        feeds = {"x": rng.normal(size=(n, 16)).astype(np.float32)}
        want, got = plain.run(feeds), bound.run(feeds)
        for name in ("y", "s"):
            assert got[name].shape == want[name].shape
            assert np.array_equal(got[name], want[name]), (n, name)


def test_ctr_model_through_io_binding_scores_what_session_run_scores() -> None:
    """Bit for bit against session.run on the batch as it ran: padded to an allowed size
    (a 1-row CTR batch alone takes another kernel path, 1 ulp apart: padding does that,
    as batching.allowed_batch_sizes always did)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from model_peak import synthetic_feeds

    spec = load_spec("ctr")
    plain = InferenceSession(spec.onnx_path, "cpu")
    exact = InferenceSession(spec.onnx_path, "cpu", device=DeviceOptions(io_binding=True))
    bound = InferenceSession(spec.onnx_path, "cpu", device=DeviceOptions(io_binding=True, batch_sizes=(8, 32)))
    rng = np.random.default_rng(1)
    for n in (1, 7, 8, 20, 32, 7):
        feeds = synthetic_feeds(spec, n, rng)
        size = 8 if n <= 8 else 32
        padded = {k: np.concatenate([v, np.zeros((size - n, *v.shape[1:]), v.dtype)]) for k, v in feeds.items()}
        want, want_padded = plain.run(feeds), plain.run(padded)
        got, got_padded = exact.run(feeds), bound.run(feeds)
        assert all(np.array_equal(got[k], want[k]) for k in want)
        assert all(np.array_equal(got_padded[k], want_padded[k][:n]) for k in want)


def test_auto_does_not_bind_on_cpu_and_graphs_on_cpu_say_so(tiny_model: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert InferenceSession(tiny_model, "cpu", device=DeviceOptions())._bound is None
    with caplog.at_level(logging.WARNING, logger="pipeline.runtime.session"):
        session = InferenceSession(tiny_model, "auto", device=DeviceOptions(cuda_graphs=True, batch_sizes=(8,)))
    assert session.provider == "cpu" and not session.graphs
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and lines[0].startswith("runtime.cuda_graphs: tiny.onnx runs on CPU here (no usable CUDA provider)")


# -- CUDA graphs against a fake ONNX Runtime ---------------------------------------------


class FakeValue:
    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def data_ptr(self) -> int:
        return self.array.ctypes.data

    def update_inplace(self, array: np.ndarray) -> None:
        self.array[...] = array

    def numpy(self) -> np.ndarray:
        return self.array.copy()


class FakeOrtValue:
    @staticmethod
    def ortvalue_from_shape_and_type(shape, dtype, device, device_id=0):  # noqa: ANN001, ANN205
        return FakeValue(np.zeros(tuple(shape), dtype))

    @staticmethod
    def ortvalue_from_numpy(array, *args):  # noqa: ANN001, ANN205
        return FakeValue(array)


class FakeRunOptions:
    def __init__(self) -> None:
        self.entries: dict[str, str] = {}

    def add_run_config_entry(self, key: str, value: str) -> None:
        self.entries[key] = value


class FakeBinding:
    def __init__(self) -> None:
        self.inputs: dict[str, FakeValue] = {}
        self.outputs: dict[str, FakeValue | None] = {}
        self.produced: dict[str, np.ndarray] = {}

    def bind_ortvalue_input(self, name, value):  # noqa: ANN001, ANN201
        self.inputs[name] = value

    def bind_output(self, name, device, device_id=0):  # noqa: ANN001, ANN201
        self.outputs[name] = None

    def bind_ortvalue_output(self, name, value):  # noqa: ANN001, ANN201
        self.outputs[name] = value

    def clear_binding_outputs(self) -> None:
        self.outputs = {}

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        return [self.produced[n] for n in self.outputs]


class FakeOrt:
    OrtValue = FakeOrtValue
    RunOptions = FakeRunOptions


class FakeSession:
    """score = 2 * the row's sum; refuses to capture when told to (a CPU-only node)."""

    def __init__(self, refuse_capture: bool = False) -> None:
        self.refuse_capture = refuse_capture
        self.calls: list[tuple[str, str | None, str]] = []  # (kind, gpu_graph_id, thread)

    def io_binding(self) -> FakeBinding:
        return FakeBinding()

    @staticmethod
    def model(x: np.ndarray) -> np.ndarray:
        return 2 * x.sum(axis=1)

    def run_with_iobinding(self, binding: FakeBinding, options: FakeRunOptions | None = None) -> None:
        gid = options.entries.get("gpu_graph_id") if options else None
        self.calls.append(("bound", gid, threading.current_thread().name))
        if self.refuse_capture and gid not in (None, "-1"):
            raise RuntimeError("CUDA graph capture failed: a node runs on CPU\nsecond line")
        score = self.model(binding.inputs["x"].array)
        for name, value in binding.outputs.items():
            if value is None:
                binding.produced[name] = score
            else:
                value.array[...] = score

    def run(self, names, feeds, options=None):  # noqa: ANN001, ANN201
        self.calls.append(("plain", options.entries.get("gpu_graph_id") if options else None, ""))
        return [self.model(feeds["x"])]


class Input:
    name, type, shape = "x", "tensor(float)", ["N", 3]


def graph_runner(session: FakeSession) -> BoundRunner:
    return BoundRunner(FakeOrt(), session, ["score"], device="cuda", sizes=(2, 8), graphs=True, name="m.onnx")


def test_graphs_are_captured_per_size_at_start_and_replayed_on_their_thread() -> None:
    session = FakeSession()
    runner = graph_runner(session)
    assert runner.prepare([Input()]) == 2
    captures = {gid for kind, gid, _ in session.calls if gid not in (None, "-1")}
    assert captures == {"1", "2"}  # one graph per allowed size, never ORT's own 0
    session.calls.clear()
    x = np.arange(15, dtype=np.float32).reshape(5, 3)
    out = runner.run({"x": x})
    assert out["score"].tolist() == (2 * x.sum(axis=1)).tolist()  # 5 rows, not the 8 it ran as
    assert session.calls == [("bound", "2", session.calls[0][2])]  # one replay of the size-8 graph
    assert session.calls[0][2].startswith("cuda-graphs")
    runner.close()


def test_a_batch_above_the_largest_size_runs_plain_with_graphs_off_for_it() -> None:
    session = FakeSession()
    runner = graph_runner(session)
    x = np.ones((9, 3), np.float32)
    assert runner.run({"x": x})["score"].tolist() == [6.0] * 9
    assert session.calls == [("plain", "-1", "")]
    runner.close()


def test_a_model_that_cannot_be_captured_runs_on_with_one_line(caplog: pytest.LogCaptureFixture) -> None:
    session = FakeSession(refuse_capture=True)
    runner = graph_runner(session)
    with caplog.at_level(logging.WARNING, logger="pipeline.runtime.io_binding"):
        runner.prepare([Input()])
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        first, again = runner.run({"x": x}), runner.run({"x": x})
    assert not runner.graphs
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        "CUDA graphs off for m.onnx: RuntimeError: CUDA graph capture failed: a node runs on CPU; it runs without them"
    ]
    assert first["score"].tolist() == again["score"].tolist() == [6.0, 24.0]
    assert {gid for _, gid, _ in session.calls[-2:]} == {"-1"}  # plain runs of the graph-enabled session
    runner.close()


def test_two_batches_of_one_size_use_two_staging_buffers() -> None:
    runner = BoundRunner(FakeOrt(), FakeSession(), ["score"], device="cpu", sizes=(4,))
    first = runner._acquire((("x", (4, 3), "<f4"),))
    second = runner._acquire((("x", (4, 3), "<f4"),))
    assert first is not None and second is not None and first is not second
    assert runner._made[(("x", (4, 3), "<f4"),)] == 2


class FakeCudart:
    """cudaHostAlloc / cudaFreeHost over ctypes buffers: which blocks were made and freed."""

    def __init__(self) -> None:
        self.blocks: dict[int, ctypes.Array] = {}
        self.freed: list[int] = []

    def cudaHostAlloc(self, ref, size, flags):  # noqa: ANN001, ANN201, N802
        buffer = ctypes.create_string_buffer(size.value)
        ref._obj.value = ctypes.addressof(buffer)
        self.blocks[ctypes.addressof(buffer)] = buffer
        return 0

    def cudaFreeHost(self, ptr):  # noqa: ANN001, ANN201, N802
        self.freed.append(ptr.value)
        return 0


def test_cuda_buffers_are_pinned_and_freed_with_the_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.runtime import io_binding

    cudart = FakeCudart()
    monkeypatch.setattr(io_binding, "_cudart", lambda: cudart)
    runner = BoundRunner(FakeOrt(), FakeSession(), ["score"], device="cuda", sizes=(4,))
    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    for _ in range(2):  # the second run reads its outputs from the bound (pinned) buffers
        assert runner.run({"x": x})["score"].tolist() == [6.0, 24.0, 42.0]
    assert len(cudart.blocks) == 2  # the input and the output of the 4-row set
    del runner
    gc.collect()
    assert sorted(cudart.freed) == sorted(cudart.blocks)


def test_without_pinned_memory_the_buffers_are_pageable(monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    from pipeline.runtime import io_binding

    def missing() -> None:
        raise OSError("no libcudart")

    monkeypatch.setattr(io_binding, "_cudart", missing)
    runner = BoundRunner(FakeOrt(), FakeSession(), ["score"], device="cuda", sizes=(4,))
    with caplog.at_level(logging.INFO, logger="pipeline.runtime.io_binding"):
        for _ in range(2):
            assert runner.run({"x": np.ones((2, 3), np.float32)})["score"].tolist() == [6.0, 6.0]
    assert [r.getMessage() for r in caplog.records] == ["pinned host buffers not available (no libcudart); pageable ones"]


# -- where the options travel: the model process, a new model version ---------------------


def test_the_model_process_gets_the_device_options(tiny_model: Path) -> None:
    from pipeline.runtime.model_process import ProcessSession

    feeds = {"x": np.random.default_rng(2).normal(size=(3, 16)).astype(np.float32)}
    want = InferenceSession(tiny_model, "cpu", device=DeviceOptions(io_binding=True, batch_sizes=(4,))).run(feeds)
    with ProcessSession(tiny_model, "cpu", device=DeviceOptions(io_binding=True, batch_sizes=(4,))) as session:
        assert "--session-options" in session._channel.proc.args
        got = session.run(feeds)
    assert all(np.array_equal(got[k], want[k]) for k in want)


def test_a_new_model_version_is_opened_with_the_first_ones_batch_sizes(tmp_path: Path) -> None:
    """A hot swap opens a new session (pipeline/versions/loader.py): its buffers (and on a
    GPU its graphs) are made for the same sizes as the first version's, at its warm-up."""
    from pipeline.config import load_config
    from pipeline.observe.metrics import WorkerMetrics
    from pipeline.registry.pipelines import pipeline_for
    from pipeline.versions.loader import VersionLoader
    from tests.own_models import ranker

    (tmp_path / "1").mkdir()
    model = ranker(tmp_path / "1" / "model.onnx", 7)
    cfg = load_config(overrides={
        "pipeline": "mine", "runtime": {"io_binding": True},
        "pipelines": [{"name": "mine", "model": str(model), "inputs": {"features": "dense", "tokens": "tokens"},
                       "outputs": {"score": "prob"}}],
    }, environ={})
    pipeline = pipeline_for(cfg)
    loader = VersionLoader(cfg, pipeline, pipeline.make_codec(cfg), [], WorkerMetrics("mine", "adaptive"),
                           ["dense", "tokens"], (2, 4))
    step, _cost = loader(pipeline.load_model())
    try:
        assert step.session._bound is not None and step.session._bound.sizes == (2, 4)
    finally:
        step.session.close()


def test_a_session_ort_refuses_with_graphs_is_opened_without_them(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """ORT refuses enable_cuda_graph when the session is made if a node would run on the
    CPU: the session is opened again without graphs, and one line says why."""
    from pipeline.runtime.session import _open

    made: list[str] = []

    class Ort:
        @staticmethod
        def InferenceSession(path, sess_options, providers, provider_options):  # noqa: ANN001, ANN205, N802
            graphs = provider_options[0].get("enable_cuda_graph")
            made.append(graphs)
            if graphs == "1":
                raise RuntimeError("This session cannot use the graph capture feature as all compute graph nodes "
                                   "have not been partitioned to the CUDAExecutionProvider.\nmore")
            return "session"

    with caplog.at_level(logging.WARNING, logger="pipeline.runtime.session"):
        session = _open(Ort(), tmp_path / "m.onnx", None, ["CUDAExecutionProvider", "CPUExecutionProvider"],
                        DeviceOptions(cuda_graphs=True))
    assert session == "session" and made == ["1", "0"]
    assert [r.getMessage() for r in caplog.records] == [
        "CUDA graphs off for m.onnx: This session cannot use the graph capture feature as all compute graph nodes "
        "have not been partitioned to the CUDAExecutionProvider.; it runs without them"
    ]
