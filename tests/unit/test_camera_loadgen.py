"""CameraFrameFactory: deterministic, well-formed, varied frames and a day/night rate."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from pipeline.codecs.base import DecodeError
from pipeline.codecs.camera import CameraCodec
from pipeline.loadgen.camera import (
    INVALID_KINDS,
    CameraFrameFactory,
    daylight,
    png_header_only,
    rate_at,
)

DAY = 600.0


@pytest.fixture(scope="module")
def factory() -> CameraFrameFactory:
    return CameraFrameFactory(seed=5, cameras=4, resolutions=[(320, 240), (640, 480)], day_seconds=DAY)


def pixels(value: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(value)) as im:
        return np.asarray(im.convert("RGB"), dtype=np.float32)


def test_frames_are_deterministic_per_seed(factory: CameraFrameFactory) -> None:
    again = CameraFrameFactory(seed=5, cameras=4, resolutions=[(320, 240), (640, 480)], day_seconds=DAY)
    assert factory.make(2, 7, 123.0) == again.make(2, 7, 123.0)
    other = CameraFrameFactory(seed=6, cameras=4, resolutions=[(320, 240), (640, 480)], day_seconds=DAY)
    assert factory.make(2, 7, 123.0)[1] != other.make(2, 7, 123.0)[1]


def test_message_layout(factory: CameraFrameFactory) -> None:
    key, value, headers = factory.make(1, 9, 2.5)
    h = dict(headers)
    assert key == b"cam-0001" == h["camera_id"]
    assert h["frame_id"] == b"9"
    assert int(h["capture_ts_ms"]) == factory.start_ms + 2500
    assert value[:2] == b"\xff\xd8"
    with Image.open(io.BytesIO(value)) as im:
        assert im.format == "JPEG" and im.size == (640, 480)  # camera 1 -> second resolution
    d = CameraCodec().decode(value, h)
    assert (d.request_id, d.bucket) == ("cam-0001/9", "640x480")


def test_frames_vary_per_frame_and_per_camera(factory: CameraFrameFactory) -> None:
    a, b = pixels(factory.make(0, 0, 300.0)[1]), pixels(factory.make(0, 40, 300.0)[1])
    assert np.abs(a - b).mean() > 5  # the view pans
    a2 = pixels(factory.make(0, 0, 300.0 + DAY)[1])
    assert np.array_equal(a, a2)  # same frame, same time of day: same pixels
    c = pixels(factory.make(2, 0, 300.0)[1])
    assert c.shape == a.shape and np.abs(a - c).mean() > 5  # different cameras, different views


def test_nights_are_darker_than_days(factory: CameraFrameFactory) -> None:
    noon = pixels(factory.make(3, 0, DAY / 2)[1]).mean()
    midnight = pixels(factory.make(3, 0, 0.0)[1]).mean()
    assert midnight < 0.5 * noon


def test_rate_follows_the_day() -> None:
    assert daylight(0.0, DAY) == pytest.approx(0.0) and daylight(DAY / 2, DAY) == pytest.approx(1.0)
    assert rate_at(DAY / 2, 30.0, DAY) == pytest.approx(30.0)
    assert rate_at(0.0, 30.0, DAY) == pytest.approx(3.0)
    assert rate_at(DAY, 30.0, DAY) == pytest.approx(3.0)
    assert 3.0 < rate_at(DAY / 4, 30.0, DAY) < 30.0


@pytest.mark.parametrize("kind", INVALID_KINDS)
def test_every_invalid_kind_is_refused(factory: CameraFrameFactory, kind: str) -> None:
    _, value, headers = factory.make_invalid(kind)
    with pytest.raises(DecodeError):
        CameraCodec().decode(value, dict(headers))


def test_absurd_header_is_tiny_and_unknown_kinds_fail(factory: CameraFrameFactory) -> None:
    assert len(png_header_only(100_000, 100_000)) < 64
    with pytest.raises(ValueError, match="unknown invalid kind"):
        factory.make_invalid("cosmic_ray")
