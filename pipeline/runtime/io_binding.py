"""A session run through ONNX Runtime's IO binding, in buffers made once per batch size
(runtime.io_binding and runtime.cuda_graphs; docs/MODELS.md, "On a GPU host").

Why: measured on an H200, a CTR call on the CUDA provider cost 0.51 ms at any batch up
to 512 rows, its calling thread busy throughout: per call, ORT allocated its inputs
and outputs, copied from pageable memory and launched every kernel one by one. Here:
- each batch is padded to the next allowed size (pad_size) and staged into a host
  buffer made for that size, pinned on CUDA so the copy to the device is one DMA;
  two buffers per size, so the next batch is staged while the current one runs;
- outputs land in buffers bound once and are copied back once per batch, cut to the
  batch's own rows (take_rows): a pad row never leaves this module;
- with CUDA graphs, one graph per size (ORT's gpu_graph_id), captured when the size is
  first prepared (at start: prepare()), its inputs and outputs at fixed device
  addresses; a batch then costs one graph launch. A capture that fails (a node ORT
  cannot capture) turns graphs off for this session with one log line; batches run on.

A batch larger than the largest size, or with string inputs, runs plain (session.run).
ORT keeps a captured graph in the capturing thread's context and captures in CUDA's
global mode (another thread's CUDA call then breaks the capture), so graphs are
captured and replayed on one thread, under one process-wide lock.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

log = logging.getLogger(__name__)

MAX_SHAPES = 64  # distinct padded input shapes with buffers (and graphs); more run plain
_GRAPH_LOCK = threading.Lock()
_ORT_TYPES = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_,
}
T = TypeVar("T")
Key = tuple[tuple[str, tuple[int, ...], str], ...]


def pad_size(rows: int, sizes: Sequence[int]) -> int | None:
    """The smallest of the ascending `sizes` that holds `rows`; None when none does (the
    batch runs plain); `rows` itself when there are no sizes."""
    if not sizes:
        return rows
    return next((s for s in sizes if s >= rows), None)


def batch_rows(feeds: Mapping[str, np.ndarray]) -> int:
    """The rows of a batch: the first axis every input shares."""
    rows = {a.shape[0] for a in feeds.values() if a.ndim}
    if len(rows) != 1:
        raise ValueError(f"inputs disagree on the batch axis: {sorted(rows)}")
    return rows.pop()


def pad_into(dst: np.ndarray, src: np.ndarray) -> None:
    """`src`'s rows at the top of `dst`, zeros below (a pad row's outputs are dropped)."""
    n = src.shape[0]
    dst[:n] = src
    dst[n:] = 0


def take_rows(outputs: Mapping[str, np.ndarray], rows: int, padded: int) -> dict[str, np.ndarray]:
    """Outputs of a batch run at `padded` rows, as arrays of their own holding only the
    batch's `rows`: an output whose first axis is the batch loses the pad rows; any
    other is copied whole. Copies, because the buffers are written again next batch."""
    return {
        name: np.array(v[:rows] if v.ndim and v.shape[0] == padded else v)
        for name, v in outputs.items()
    }


@functools.cache
def _cudart() -> Any:
    """The CUDA runtime the CUDA provider loaded (ORT's Python API makes no pinned host
    memory: its OrtValue knows "cpu" and "cuda" only)."""
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise OSError("no libcudart")


class _PinnedBlock:
    """Page-locked host memory (cudaHostAlloc), freed with its last reference."""

    def __init__(self, nbytes: int) -> None:
        self.ptr = ctypes.c_void_p()  # before anything can raise: __del__ reads it
        self._lib = _cudart()
        status = self._lib.cudaHostAlloc(ctypes.byref(self.ptr), ctypes.c_size_t(max(nbytes, 1)), 0)
        if status != 0 or not self.ptr.value:
            raise OSError(f"cudaHostAlloc returned {status}")

    def array(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        count = int(np.prod(shape, dtype=np.int64))
        raw = (ctypes.c_uint8 * max(count * dtype.itemsize, 1)).from_address(self.ptr.value)
        return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)

    def __del__(self) -> None:
        if self.ptr.value:
            self._lib.cudaFreeHost(self.ptr)
            self.ptr = ctypes.c_void_p()


class _Buffers:
    """One staging set for one padded shape: host inputs bound once, outputs bound
    after the first run told their shapes."""

    def __init__(self, binding: Any) -> None:
        self.binding = binding
        self.inputs: dict[str, np.ndarray] = {}
        self.outputs: dict[str, np.ndarray] | None = None
        self.keep: list[Any] = []  # the OrtValues (and pinned blocks) behind the arrays


class _Graph:
    def __init__(self, binding: Any, run_options: Any, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
        self.binding, self.run_options, self.inputs, self.outputs = binding, run_options, inputs, outputs


class BoundRunner:
    """session.run's contract (input name -> array in, output name -> array out) over IO
    binding; see the module doc. `ort` is the onnxruntime module, `session` its
    InferenceSession; device "cpu" or "cuda"."""

    def __init__(
        self,
        ort: Any,
        session: Any,
        output_names: Sequence[str],
        *,
        device: str = "cpu",
        device_id: int = 0,
        sizes: Sequence[int] = (),
        graphs: bool = False,
        graphs_on_caller_thread: bool = False,
        name: str = "model",
    ) -> None:
        self._ort, self._session = ort, session
        self._outputs = list(output_names)
        self._device, self._device_id = device, device_id
        self.sizes = tuple(sorted(set(sizes)))
        self.graphs = graphs and device == "cuda"
        self._name = name
        self._pinned = device == "cuda"
        self._lock = threading.Lock()
        self._cond = threading.Condition()
        self._free: dict[Key, list[_Buffers]] = {}
        self._made: dict[Key, int] = {}
        self._graph_of: dict[Key, _Graph] = {}
        self._plain_options = None
        if graphs:  # the session was opened with enable_cuda_graph: a plain run says so
            self._plain_options = ort.RunOptions()
            self._plain_options.add_run_config_entry("gpu_graph_id", "-1")
        own_thread = self.graphs and not graphs_on_caller_thread
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="cuda-graphs") if own_thread else None

    # -- the caller's side ------------------------------------------------------------

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = batch_rows(feeds)
        padded = pad_size(rows, self.sizes)
        if padded is None or any(a.dtype.kind in "OUS" for a in feeds.values()):
            return self._plain(feeds)
        key: Key = tuple((n, (padded, *a.shape[1:]), a.dtype.str) for n, a in sorted(feeds.items()))
        buffers = self._acquire(key)
        if buffers is None:
            return self._plain(feeds)
        try:
            for name, array in feeds.items():  # staging: outside the run lock
                pad_into(buffers.inputs[name], array)
            outputs = self._on_thread(self._execute, key, buffers)
            return take_rows(outputs, rows, padded)
        finally:
            with self._cond:
                self._free[key].append(buffers)
                self._cond.notify_all()

    def prepare(self, inputs: Sequence[Any]) -> int:
        """Make the buffers (and capture the graphs) of every size now, from the model's
        input metadata (ORT's NodeArg list); returns how many shapes were prepared. A
        model with a dynamic dimension besides the batch has its shapes prepared on
        first use instead."""
        if not self.sizes or any(_ORT_TYPES.get(i.type) is None for i in inputs):
            return 0
        if any(not isinstance(d, int) for i in inputs for d in list(i.shape)[1:]):
            return 0
        for size in self.sizes:
            feeds = {i.name: np.zeros((size, *i.shape[1:]), _ORT_TYPES[i.type]) for i in inputs}
            self.run(feeds)
        return len(self.sizes)

    def close(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=True)

    def _on_thread(self, fn: Callable[..., T], *args: Any) -> T:
        if self._thread is None:
            return fn(*args)
        return self._thread.submit(fn, *args).result()

    def _plain(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        def go() -> dict[str, np.ndarray]:
            with self._run_lock():
                outputs = self._session.run(self._outputs, dict(feeds), self._plain_options)
            return dict(zip(self._outputs, outputs, strict=True))

        return self._on_thread(go)

    def _acquire(self, key: Key) -> _Buffers | None:
        """A free staging set for `key`; a second one is made while the first is busy,
        then callers wait for one. None: too many shapes already."""
        with self._cond:
            if key not in self._made:
                if len(self._made) >= MAX_SHAPES:
                    return None
                self._made[key], self._free[key] = 0, []
            while not self._free[key] and self._made[key] >= 2:
                self._cond.wait()
            if self._free[key]:
                return self._free[key].pop()
            self._made[key] += 1
        return self._new_buffers(key)

    # -- the run side (the graph thread when graphs are on) -----------------------------

    def _run_lock(self) -> Any:
        return _Both(self._lock, _GRAPH_LOCK) if self.graphs else self._lock

    def _execute(self, key: Key, buffers: _Buffers) -> dict[str, np.ndarray]:
        with self._run_lock():
            if self.graphs:
                graph = self._graph_of.get(key) or self._capture(key)
                if graph is not None:
                    for name, device_value in graph.inputs.items():
                        device_value.update_inplace(buffers.inputs[name])
                    self._session.run_with_iobinding(graph.binding, graph.run_options)
                    return {name: graph.outputs[name].numpy() for name in self._outputs}
            if buffers.outputs is None:  # first run at this shape: ORT allocates, shapes learnt
                for name in self._outputs:
                    buffers.binding.bind_output(name, self._device, self._device_id)
                self._session.run_with_iobinding(buffers.binding, self._plain_options)
                produced = dict(zip(self._outputs, buffers.binding.copy_outputs_to_cpu(), strict=True))
                buffers.outputs = {}
                buffers.binding.clear_binding_outputs()
                for name, array in produced.items():
                    host, keep = self._host(array.shape, array.dtype)
                    buffers.outputs[name] = host
                    buffers.keep.append(keep)
                    buffers.binding.bind_ortvalue_output(name, keep[0])
                return produced
            self._session.run_with_iobinding(buffers.binding, self._plain_options)
            return buffers.outputs

    def _capture(self, key: Key) -> _Graph | None:
        """The graph of one padded shape: device buffers, a plain run for the output
        shapes, then runs under its graph id (ORT runs regular ones first, then
        captures; later runs replay). None, and graphs off, when ORT refuses."""
        ort = self._ort
        try:
            binding = self._session.io_binding()
            inputs = {}
            for name, shape, dtype in key:
                inputs[name] = ort.OrtValue.ortvalue_from_shape_and_type(shape, np.dtype(dtype), "cuda", self._device_id)
                binding.bind_ortvalue_input(name, inputs[name])
            for name in self._outputs:
                binding.bind_output(name, "cuda", self._device_id)
            self._session.run_with_iobinding(binding, self._plain_options)
            shapes = binding.copy_outputs_to_cpu()
            binding.clear_binding_outputs()
            outputs = {}
            for name, array in zip(self._outputs, shapes, strict=True):
                outputs[name] = ort.OrtValue.ortvalue_from_shape_and_type(array.shape, array.dtype, "cuda", self._device_id)
                binding.bind_ortvalue_output(name, outputs[name])
            options = ort.RunOptions()
            options.add_run_config_entry("gpu_graph_id", str(len(self._graph_of) + 1))  # 0 is ORT's own
            for _ in range(3):
                self._session.run_with_iobinding(binding, options)
        except Exception as exc:  # ORT's own types; the reason is its first line
            self.graphs = False
            log.warning("CUDA graphs off for %s: %s; it runs without them",
                        self._name, f"{type(exc).__name__}: {exc}".splitlines()[0])
            return None
        graph = self._graph_of[key] = _Graph(binding, options, inputs, outputs)
        return graph

    def _new_buffers(self, key: Key) -> _Buffers:
        buffers = _Buffers(self._session.io_binding())
        for name, shape, dtype in key:
            host, keep = self._host(shape, np.dtype(dtype))
            buffers.inputs[name] = host
            buffers.keep.append(keep)
            buffers.binding.bind_ortvalue_input(name, keep[0])
        return buffers

    def _host(self, shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, Any]:
        """A host buffer and what keeps it (the OrtValue over it, its pinned block):
        page-locked on CUDA, so the copies to and from the device are one DMA each
        (pageable, with one log line, where it cannot be had)."""
        ort, dtype = self._ort, np.dtype(dtype)
        if self._pinned:
            try:
                block = _PinnedBlock(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
                array = block.array(tuple(shape), dtype)
                return array, (ort.OrtValue.ortvalue_from_numpy(array), block)
            except OSError as exc:
                self._pinned = False
                log.info("pinned host buffers not available (%s); pageable ones", str(exc).splitlines()[0])
        array = np.zeros(shape, dtype)
        return array, (ort.OrtValue.ortvalue_from_numpy(array), None)


class _Both:
    """Two locks taken in order, released in reverse."""

    def __init__(self, first: threading.Lock, second: threading.Lock) -> None:
        self._locks = (first, second)

    def __enter__(self) -> None:
        self._locks[0].acquire()
        self._locks[1].acquire()

    def __exit__(self, *exc: object) -> None:
        self._locks[1].release()
        self._locks[0].release()
