"""The one place a model session is opened from the `runtime` section: ONNX Runtime on
the calling threads (session.py), in a model process of its own (model_process.py) or
in the shared model host of several workers (model_host.py --listen).
The worker (pipeline/app/compose.py) and `tidebatch profile` (pipeline/profiling/)
both open theirs here, so what the profile measures is what the worker runs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pipeline.runtime.device import device_options
from pipeline.runtime.model_process import ProcessSession
from pipeline.runtime.session import InferenceSession


def open_session(
    onnx_path: str | Path,
    rt: Any,
    on_restart: Callable[[], None] | None = None,
    batch_sizes: Sequence[int] = (),
    host_address: str | None = None,
) -> InferenceSession | ProcessSession:
    """A session for `rt` (a RuntimeConfig: providers, intra_op_threads, model_process,
    the device keys). on_restart: called before a dead model process is started (or
    connected to) again. batch_sizes: what IO binding and CUDA graphs pad to (device.py
    batch_sizes_for). host_address: the shared model host's socket
    (pipeline/runtime/model_host.py --listen) to connect to, whatever rt.model_process says."""
    device = device_options(rt, batch_sizes)
    if host_address is not None:
        return ProcessSession(onnx_path, rt.providers, rt.intra_op_threads, on_restart=on_restart, device=device,
                              address=host_address)
    if rt.model_process:
        return ProcessSession(onnx_path, rt.providers, rt.intra_op_threads, on_restart=on_restart, device=device)
    return InferenceSession(onnx_path, rt.providers, rt.intra_op_threads, device=device)
