"""The codec the tests of tests/unit/camera_codec/ share (CameraCodec with its
defaults)."""

from __future__ import annotations

import pytest

from pipeline.codecs.camera import CameraCodec


@pytest.fixture(scope="module")
def codec() -> CameraCodec:
    return CameraCodec()
