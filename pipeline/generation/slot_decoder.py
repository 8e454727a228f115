"""Decoding steps in place on the runner's slot caches (pipeline/generation/runner.py).

The decoder's shipped graph (models/decoder/export.py) takes the past as one padded
tensor and returns past + new as present_*, so every decoding call had the runner
gather each row's cache up to the longest row, every row's attention ran over that
longest length, and ORT's Concat copied the whole past into present_*. Continuous
batching changes the rows at almost every step, so it paid all of that every step
(docs/GENERATION.md, "Where a step's time went").

Here the same weights run as the graph's in-place variant (`build_graph(...,
in_place=True)`: ONNX Runtime's GroupQueryAttention, com.microsoft, CPU kernel), on a
contiguous range of slots of the persistent caches bound as both past_* and present_*
through an IOBinding: each row attends to its own slot up to its own length, and the
kernel writes the row's new key and value at that position in the slot. Nothing is
gathered, nothing is copied back, and a slot whose sequence retired is left where it
is for the next admission.

A slot in the range that does not decode in this step (a prompt still in chunked
prefill, a free slot) still runs as a row: it is given its current length, so the
kernel's write lands on the column its next real token overwrites (models/decoder's
context bounds a sequence's cache to context - 1 tokens, pipeline/generation/
requests.py refuses longer requests, so the column is inside the slot).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from models.decoder.numpy_model import Config, Params
from pipeline.extras import onnxruntime
from pipeline.generation.shape import DecoderShape

log = logging.getLogger(__name__)


class InPlaceDecoder:
    """One decoding step for a set of slots, on caches shaped [slots, heads, context,
    head_dim] (float32, C-contiguous; the runner's), written in place."""

    def __init__(self, model_bytes: bytes, layers: int, vocab: int, intra_op_threads: int = 1) -> None:
        ort = onnxruntime()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = intra_op_threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        # CPU only: the CUDA GroupQueryAttention kernel takes float16 caches.
        self._session = ort.InferenceSession(model_bytes, sess_options=opts, providers=["CPUExecutionProvider"])
        self.layers = layers
        self.vocab = vocab
        self.calls = 0
        self.last_call_s = 0.0  # the last ORT call's own time, binding apart (bench/generation_steps.py)
        self._bound: tuple[tuple[int, int], list[np.ndarray], object] | None = None  # slot range, cache, binding
        self._ids: np.ndarray | None = None  # the step's inputs and logits, one row per slot
        self._positions = self._seqlens = self._logits = np.zeros(0)
        self._total = np.zeros((), np.int32)

    def step(self, cache: list[np.ndarray], lengths: np.ndarray, rows: dict[int, int]) -> np.ndarray:
        """Decode one token for each slot in `rows` (slot -> the token it feeds); the
        slot's cache holds lengths[slot] tokens before the call and one more after.
        Returns logits [len(rows), vocab] in the order of `rows`."""
        order = np.fromiter(rows, np.int64, len(rows))
        lo, hi = int(order.min()), int(order.max()) + 1
        io = self._binding(cache, lo, hi)
        at = self._seqlens[lo:hi]
        at[:] = lengths[lo:hi]  # each row's new column is at its length: total tokens after, minus one
        self._ids[lo:hi] = 0
        self._ids[order, 0] = list(rows.values())
        self._positions[lo:hi, 0] = at
        self._total[...] = at.max() + 1
        t0 = time.perf_counter()
        self._session.run_with_iobinding(io)
        self.last_call_s = time.perf_counter() - t0
        self.calls += 1
        return self._logits[order, 0]

    def _binding(self, cache: list[np.ndarray], lo: int, hi: int):  # -> onnxruntime.IOBinding
        """Every input and output bound by address to views of buffers that live as long
        as this decoder, so a step with the slot range of the last one binds nothing:
        binding per call (an OrtValue made per input) cost a fifth of a 16-row step."""
        if self._bound is not None and self._bound[0] == (lo, hi) and self._bound[1] is cache:
            return self._bound[2]
        if self._ids is None or self._ids.shape[0] != cache[0].shape[0]:
            slots = cache[0].shape[0]
            self._ids = np.zeros((slots, 1), np.int64)
            self._positions = np.zeros((slots, 1), np.int64)
            self._seqlens = np.zeros(slots, np.int32)
            self._logits = np.zeros((slots, 1, self.vocab), np.float32)
        io = self._session.io_binding()
        views = [("input_ids", self._ids), ("positions", self._positions), ("seqlens_k", self._seqlens)]
        for name, buf in views:
            view = buf[lo:hi]
            io.bind_input(name, "cpu", 0, view.dtype, list(view.shape), view.ctypes.data)
        io.bind_input("total_sequence_length", "cpu", 0, np.int32, [], self._total.ctypes.data)
        for li in range(self.layers):
            for ci, kind in ((2 * li, "key"), (2 * li + 1, "value")):
                view = cache[ci][lo:hi]  # contiguous: a range of the leading axis
                shape = list(view.shape)
                io.bind_input(f"past_{kind}_{li}", "cpu", 0, np.float32, shape, view.ctypes.data)
                io.bind_output(f"present_{kind}_{li}", "cpu", 0, np.float32, shape, view.ctypes.data)
        out = self._logits[lo:hi]
        io.bind_output("logits", "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
        self._bound = ((lo, hi), cache, io)  # holding `cache` keeps its buffers where they are bound
        return io


def in_place_graph(params: Params, cfg: Config):  # -> onnx.ModelProto
    """The decoding-step variant of the decoder on its own weights (models/decoder/export.py)."""
    from models.decoder.export import build_graph

    return build_graph(params, cfg, in_place=True)


def open_in_place(onnx_path: str, shape: DecoderShape, intra_op_threads: int = 1, provider: str = "cpu",
                  build: Callable[[Params, Config], Any] = in_place_graph) -> InPlaceDecoder | None:
    """The in-place decoder on the weights of the decoder file, or None with one warning
    line, and the runner then decodes with the shipped graph by gathering the KV cache
    (pipeline/generation/runner.py): where the provider is not cpu (the GroupQueryAttention
    kernel this binds is CPU float32; CUDA's takes float16 caches), or where building the
    graph or ORT's session on it fails (an ORT build without CPU GroupQueryAttention
    refuses the graph: "com.microsoft:GroupQueryAttention(-1) is not a registered
    function/op"). build: the graph from the weights, a parameter so a test can hand ORT
    a graph it refuses (tests/unit/test_generation_fallback.py)."""
    from models.decoder.export import read_params

    if provider != "cpu":
        log.warning("in-place decoding runs on the cpu provider only (provider %s); decoding steps gather "
                    "the KV cache", provider)
        return None
    params = read_params(onnx_path)
    vocab = int(params["tok_emb"].shape[0])
    cfg = Config(vocab=vocab, d_model=shape.heads * shape.head_dim, heads=shape.heads, layers=shape.layers,
                 context=shape.context, mlp=int(params["l0.fc1.w"].shape[1]))
    try:
        return InPlaceDecoder(build(params, cfg).SerializeToString(), shape.layers, vocab, intra_op_threads)
    except Exception as exc:  # ORT raises its own exception types per failure
        log.warning("in-place decoding unavailable (%s); decoding steps gather the KV cache",
                    (str(exc).splitlines() or [type(exc).__name__])[0])
        return None
