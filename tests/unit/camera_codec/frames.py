"""Frames for the tests of tests/unit/camera_codec/: the shipped sample images
(models/camera/samples/), images encoded here, and a frame's headers."""

from __future__ import annotations

import io

from PIL import Image

from models.camera import SAMPLES_DIR

HEADERS = {"camera_id": b"cam-7", "frame_id": b"42", "capture_ts_ms": b"1700000000123"}


def sample_bytes(name: str) -> bytes:
    return (SAMPLES_DIR / f"{name}.jpg").read_bytes()


def encode(img: Image.Image, fmt: str = "JPEG") -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    return buf.getvalue()


def astronaut() -> Image.Image:
    with Image.open(SAMPLES_DIR / "astronaut.jpg") as im:
        return im.convert("RGB")
