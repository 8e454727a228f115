"""ONNX Runtime session with provider selection by what actually loads.

`onnxruntime-gpu` lists CUDA/TensorRT as *available* even on a machine without a GPU;
asking for them there silently falls back to CPU. So we ask, then read back which
provider the session really got, and report that one.

ONNX Runtime is an extra (`cpu` or `gpu`): it is imported when a session is made, through
pipeline/extras.py, so a missing or doubled build is one line naming the extra.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.batching.cost import AffineCost
from pipeline.errors import UserError
from pipeline.extras import onnxruntime
from pipeline.runtime.device import DeviceOptions, provider_options
from pipeline.runtime.io_binding import BoundRunner

log = logging.getLogger(__name__)

PROVIDER_PREFERENCE = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
_SHORT = {
    "TensorrtExecutionProvider": "tensorrt",
    "CUDAExecutionProvider": "cuda",
    "CPUExecutionProvider": "cpu",
}


def _cuda_loadable() -> str | None:
    """None if ORT's CUDA provider library and its CUDA/cuDNN dependencies load, else
    why not. Checked up front: a failed attempt inside ORT prints an error banner."""
    import ctypes
    import os

    ort = onnxruntime()
    lib = os.path.join(os.path.dirname(ort.__file__), "capi", "libonnxruntime_providers_cuda.so")
    if not os.path.exists(lib):
        return "this onnxruntime build has no CUDA provider"
    try:
        ctypes.CDLL(lib)
    except OSError as exc:
        return str(exc).replace(lib + ": ", "")
    return None


def _requested(providers: str | Sequence[str]) -> list[str]:
    available = onnxruntime().get_available_providers()
    if "CUDAExecutionProvider" in available and (why := _cuda_loadable()) is not None:
        log.info("CUDA provider not usable here (%s); CPU it is", why)
        available = [p for p in available if p not in ("CUDAExecutionProvider", "TensorrtExecutionProvider")]
    if providers == "auto":
        # TensorRT builds engines per shape on first use (minutes): only on request.
        wanted = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    else:
        names = [providers] if isinstance(providers, str) else list(providers)
        by_short = {v: k for k, v in _SHORT.items()}
        wanted = [by_short.get(n.lower(), n) for n in names]
        unknown = [n for n in wanted if n not in _SHORT]
        if unknown:
            raise UserError(f"unknown ONNX Runtime provider {unknown[0]!r}; use auto, cpu, cuda or tensorrt")
        if "CPUExecutionProvider" not in wanted:
            wanted.append("CPUExecutionProvider")
    return [p for p in wanted if p in available]


def model_file(onnx_path: str | Path) -> Path:
    """The model's path, or a one-line UserError when there is no such file."""
    path = Path(onnx_path)
    if not path.is_file():
        raise UserError(f"model file not found: {path}")
    return path


class ProfiledSession:
    """The warm-up profile, for any session that times its own runs."""

    def run_timed(self, feeds: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        raise NotImplementedError

    def profile(
        self,
        make_feeds: Callable[[int], Mapping[str, np.ndarray]],
        sizes: Sequence[int] = (1, 8, 32, 128, 512),
        repeats: int = 5,
    ) -> AffineCost:
        return profile_cost(lambda feeds: self.run_timed(feeds)[1], make_feeds, sizes, repeats)


class InferenceSession(ProfiledSession):
    def __init__(
        self,
        onnx_path: str | Path,
        providers: str | Sequence[str] = "auto",
        intra_op_threads: int = 1,
        inter_op_threads: int = 1,
        device: DeviceOptions | None = None,
    ) -> None:
        """device: the `runtime` section's GPU keys (device.py); None: ORT's defaults,
        plain runs."""
        path = model_file(onnx_path)
        dev = device or DeviceOptions()
        ort = onnxruntime()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = intra_op_threads
        opts.inter_op_num_threads = inter_op_threads
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Failing GPU providers log an error per attempt; we report the outcome ourselves.
        opts.log_severity_level = 3
        requested = _requested(providers)
        # The CUDA provider library logs through the default logger while it fails to
        # load (no GPU, no CUDA libraries); the outcome is reported below instead.
        ort.set_default_logger_severity(3)
        try:
            self._session = _open(ort, path, opts, requested, dev)
        except Exception as exc:  # ORT raises its own exception types per failure
            raise UserError(f"cannot load model {path.name}: {exc}".splitlines()[0]) from None
        active = self._session.get_providers()
        self.provider = _SHORT.get(active[0], active[0])
        self.path = path
        self.input_names = [i.name for i in self._session.get_inputs()]
        self.output_names = [o.name for o in self._session.get_outputs()]
        log.info(
            "model %s loaded on provider %s (asked for %s; intra-op threads %d)",
            path.name, self.provider, ",".join(_SHORT.get(p, p) for p in requested), intra_op_threads,
        )
        self._bound = _bound_runner(ort, self._session, self.provider, dev, path.name)

    @property
    def graphs(self) -> bool:
        """Whether batches replay CUDA graphs (runtime.cuda_graphs, and they captured)."""
        return self._bound is not None and self._bound.graphs

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._bound is not None:
            return self._bound.run(feeds)
        outputs = self._session.run(self.output_names, dict(feeds))
        return dict(zip(self.output_names, outputs, strict=True))

    def run_timed(self, feeds: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        """(outputs, seconds the call took)."""
        t0 = time.perf_counter()
        outputs = self.run(feeds)
        return outputs, time.perf_counter() - t0

    def close(self) -> None:
        """The graph thread, if any; the session itself lives as long as this object."""
        if self._bound is not None:
            self._bound.close()


def _open(ort: Any, path: Path, opts: Any, requested: list[str], dev: DeviceOptions) -> Any:
    """ORT's session with the device's provider options. With CUDA graphs asked for, ORT
    refuses a model it cannot capture whole (a node on the CPU) when the session is
    made: then it is opened without them, and one line says why."""
    def make(d: DeviceOptions) -> Any:
        return ort.InferenceSession(str(path), sess_options=opts, providers=requested,
                                    provider_options=provider_options(requested, d))

    if not dev.cuda_graphs or requested[:1] == ["CPUExecutionProvider"]:
        return make(replace(dev, cuda_graphs=False))
    try:
        return make(dev)
    except Exception as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    session = make(replace(dev, cuda_graphs=False))  # a model that fails for another reason raises here
    log.warning("CUDA graphs off for %s: %s; it runs without them", path.name, why)
    return session


def _bound_runner(ort: Any, session: Any, provider: str, dev: DeviceOptions, name: str) -> BoundRunner | None:
    """IO binding where runtime.io_binding asks for it; CUDA graphs where the session
    got a GPU (on CPU one line says they are off: the same config serves both)."""
    graphs = dev.cuda_graphs and provider == "cuda"
    if dev.cuda_graphs and provider != "cuda":
        why = "no usable CUDA provider" if provider == "cpu" else "graphs are the CUDA provider's only (device.py)"
        log.warning("runtime.cuda_graphs: %s runs on %s here (%s); plain runs", name, provider.upper(), why)
    cuda = session.get_provider_options().get("CUDAExecutionProvider", {})
    graphs = graphs and str(cuda.get("enable_cuda_graph", "0")).lower() in ("1", "true")  # not if _open fell back
    if not dev.binds(provider):
        return None
    runner = BoundRunner(
        ort, session, [o.name for o in session.get_outputs()], device="cpu" if provider == "cpu" else "cuda",
        device_id=dev.device_id, sizes=dev.batch_sizes, graphs=graphs,
        graphs_on_caller_thread=dev.graphs_on_caller_thread, name=name,
    )
    if runner.graphs:
        prepared = runner.prepare(session.get_inputs())
        if runner.graphs:
            log.info("CUDA graphs for %s: %s", name, f"{prepared} batch sizes captured" if prepared else
                     "captured per shape on first use (a dynamic dimension besides the batch)")
    return runner


def profile_cost(
    run_seconds: Callable[[Mapping[str, np.ndarray]], float],
    make_feeds: Callable[[int], Mapping[str, np.ndarray]],
    sizes: Sequence[int] = (1, 8, 32, 128, 512),
    repeats: int = 5,
) -> AffineCost:
    """Warm-up profile: median latency per batch size, least-squares a + b·n.
    Seeds the online cost model so the first decisions are not guesses."""
    xs, ys = [], []
    for n in sizes:
        feeds = make_feeds(n)
        run_seconds(feeds)  # first call per shape allocates; not representative
        samples = [run_seconds(feeds) for _ in range(repeats)]
        xs.append(n)
        ys.append(float(np.median(samples)))
    b, a = np.polyfit(np.array(xs, float), np.array(ys, float), 1)
    return AffineCost(a=max(float(a), 0.0), b=max(float(b), 1e-9))
