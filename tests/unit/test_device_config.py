"""The runtime section's GPU keys (pipeline/config/sections.py RuntimeConfig): their
one-line errors, and what they become for ONNX Runtime (pipeline/runtime/device.py)."""

from __future__ import annotations

import pytest

from pipeline.config import load_config
from pipeline.errors import UserError
from pipeline.runtime.device import DeviceOptions, batch_sizes_for, device_options, provider_options


def test_defaults_keep_tf32_off_and_bind_only_on_a_gpu() -> None:
    rt = load_config(environ={}).runtime
    assert (rt.device_id, rt.tf32, rt.gpu_mem_limit_mb, rt.cuda_graphs, rt.io_binding) == (0, False, None, False, "auto")
    dev = device_options(rt)
    assert not dev.binds("cpu") and dev.binds("cuda") and dev.binds("tensorrt")


@pytest.mark.parametrize(("value", "expected"), [(True, True), (False, False), ("auto", "auto")])
def test_io_binding_takes_true_false_or_auto(value: object, expected: object) -> None:
    assert load_config(overrides={"runtime": {"io_binding": value}}, environ={}).runtime.io_binding == expected


def test_io_binding_from_the_environment() -> None:
    cfg = load_config(environ={"TIDEBATCH_RUNTIME__IO_BINDING": "true", "TIDEBATCH_RUNTIME__TF32": "true"})
    assert cfg.runtime.io_binding is True and cfg.runtime.tf32 is True


@pytest.mark.parametrize(
    ("runtime", "message"),
    [
        ({"device_id": -1}, "config key 'runtime.device_id': must be >= 0"),
        ({"gpu_mem_limit_mb": 0}, "config key 'runtime.gpu_mem_limit_mb': must be >= 1"),
        ({"io_binding": "sometimes"}, "config key 'runtime.io_binding': 'sometimes' is not one of auto, true, false"),
        ({"io_binding": 3}, "config key 'runtime.io_binding': expected bool or str, got a value of type int"),
        ({"tf32": "yes"}, "config key 'runtime.tf32': expected true or false"),
        ({"cuda_graphs": True, "io_binding": False}, "config key 'runtime.cuda_graphs': needs runtime.io_binding"),
        ({"cuda_graphs": True, "providers": "cpu"}, "config key 'runtime.cuda_graphs': needs a GPU provider"),
    ],
)
def test_bad_device_keys_are_one_line_errors(runtime: dict, message: str) -> None:
    with pytest.raises(UserError) as err:
        load_config(overrides={"runtime": runtime}, environ={})
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_cuda_graphs_with_auto_providers_is_accepted() -> None:
    """The same file serves a GPU host and a laptop: on CPU the session says graphs are off."""
    assert load_config(overrides={"runtime": {"cuda_graphs": True}}, environ={}).runtime.cuda_graphs


def test_cuda_provider_options() -> None:
    dev = DeviceOptions(device_id=1, tf32=False, gpu_mem_limit_mb=512, cuda_graphs=True)
    cuda, trt, cpu = provider_options(["CUDAExecutionProvider", "TensorrtExecutionProvider", "CPUExecutionProvider"], dev)
    assert cuda == {"device_id": "1", "use_tf32": "0", "enable_cuda_graph": "1", "gpu_mem_limit": str(512 << 20)}
    assert trt == {"device_id": "1", "trt_max_workspace_size": str(512 << 20)}
    assert cpu == {}
    assert provider_options(["CUDAExecutionProvider"], DeviceOptions(tf32=True))[0]["use_tf32"] == "1"
    assert "gpu_mem_limit" not in provider_options(["CUDAExecutionProvider"], DeviceOptions())[0]


def test_batch_sizes_are_the_allowed_ones_else_powers_of_two() -> None:
    assert batch_sizes_for([32, 8, 8, 16], 512) == (8, 16, 32)
    assert batch_sizes_for([], 512) == (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    assert batch_sizes_for([], 100)[-1] == 128
    assert batch_sizes_for([], 1) == (1,)


def test_options_cross_to_the_model_process_as_one_json_argument() -> None:
    dev = DeviceOptions(device_id=2, tf32=True, gpu_mem_limit_mb=64, cuda_graphs=True, io_binding=True,
                        batch_sizes=(1, 8), graphs_on_caller_thread=True)
    assert DeviceOptions.from_json(dev.to_json()) == dev
