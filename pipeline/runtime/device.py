"""What a session asks of the GPU: the `runtime` section's device keys (pipeline/config/
sections.py) as one value the worker and its model process share, and the CUDA and
TensorRT provider options they become (docs/MODELS.md, "On a GPU host").

Pure: no ONNX Runtime here. session.py passes provider_options() to ORT; the model
process gets the same value as one JSON argument (to_json/from_json).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class DeviceOptions:
    device_id: int = 0
    tf32: bool = False
    gpu_mem_limit_mb: int | None = None
    cuda_graphs: bool = False
    io_binding: bool | str = "auto"  # "auto": on a GPU provider only
    # Batch sizes the IO-binding buffers (and graphs) exist for; a batch is padded to
    # the next one. Empty: every batch runs at its own size.
    batch_sizes: tuple[int, ...] = field(default_factory=tuple)
    # Run graphs on the thread that calls run() (the model process's only thread)
    # instead of a thread of their own: ORT keeps a captured graph per thread.
    graphs_on_caller_thread: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> DeviceOptions:
        data = json.loads(text)
        data["batch_sizes"] = tuple(data.get("batch_sizes", ()))
        return cls(**data)

    def binds(self, provider: str) -> bool:
        """Whether a session on `provider` ("cpu", "cuda", "tensorrt") runs through IO binding."""
        return provider != "cpu" if self.io_binding == "auto" else bool(self.io_binding)


def device_options(rt: object, batch_sizes: Sequence[int] = ()) -> DeviceOptions:
    """The device keys of a RuntimeConfig `rt` (read by name: runtime/ sits below config/)."""
    return DeviceOptions(
        device_id=getattr(rt, "device_id", 0),
        tf32=getattr(rt, "tf32", False),
        gpu_mem_limit_mb=getattr(rt, "gpu_mem_limit_mb", None),
        cuda_graphs=getattr(rt, "cuda_graphs", False),
        io_binding=getattr(rt, "io_binding", "auto"),
        batch_sizes=tuple(batch_sizes),
    )


def batch_sizes_for(allowed: Sequence[int], max_rows: int) -> tuple[int, ...]:
    """The sizes buffers and graphs are made for: batching.allowed_batch_sizes (the
    batcher pads to them already), else powers of two up to the first >= max_rows, so
    padding at most doubles a batch (a GPU call of the shipped models costs about the
    same at 1 and 512 rows: docs/MODELS.md)."""
    if allowed:
        return tuple(sorted(set(int(s) for s in allowed)))
    sizes, n = [], 1
    while True:
        sizes.append(n)
        if n >= max_rows:
            return tuple(sizes)
        n *= 2


def provider_options(requested: Sequence[str], dev: DeviceOptions) -> list[dict[str, str]]:
    """One options mapping per requested provider (ORT's provider_options, all strings)."""
    out: list[dict[str, str]] = []
    for name in requested:
        if name == "CUDAExecutionProvider":
            opts = {
                "device_id": str(dev.device_id),
                "use_tf32": "1" if dev.tf32 else "0",
                "enable_cuda_graph": "1" if dev.cuda_graphs else "0",
            }
            if dev.gpu_mem_limit_mb is not None:
                opts["gpu_mem_limit"] = str(dev.gpu_mem_limit_mb << 20)
            out.append(opts)
        elif name == "TensorrtExecutionProvider":
            # FP16 stays off (TensorRT's default): scores as close to the CPU's as it builds them.
            # No graphs: TensorRT's own (trt_cuda_graph_enable) want device-resident
            # inputs, which io_binding.py does not give it; untried without a GPU.
            opts = {"device_id": str(dev.device_id)}
            if dev.gpu_mem_limit_mb is not None:
                opts["trt_max_workspace_size"] = str(dev.gpu_mem_limit_mb << 20)
            out.append(opts)
        else:
            out.append({})
    return out
