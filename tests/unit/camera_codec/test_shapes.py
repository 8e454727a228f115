"""CameraCodec's shape buckets and vectorised collate: the bucket a frame goes to, the
letterbox into it, greyscale to RGB, and batches padded with zero rows."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.codecs.camera import DEFAULT_BUCKETS, INPUT_NAME, CameraCodec, CameraFrame
from pipeline.codecs.camera_image import choose_bucket
from tests.unit.camera_codec.frames import HEADERS, astronaut, encode, sample_bytes


# ------------------------------------------------------------------ buckets
@pytest.mark.parametrize(
    ("size", "bucket", "scale"),
    [
        ((160, 120), (320, 256), 1.0),  # small frames are padded, never enlarged
        ((320, 240), (320, 256), 1.0),
        ((400, 300), (320, 256), 0.8),  # shrinking by <= 25 % beats a 4x larger input
        ((512, 512), (640, 480), 0.9375),
        ((640, 480), (640, 480), 1.0),
        ((800, 600), (640, 480), 0.8),
        ((1024, 768), (1280, 736), 736 / 768),
        ((1280, 720), (1280, 736), 1.0),
        ((1920, 1080), (1280, 736), 1280 / 1920),  # larger than every bucket: shrink into the largest
        ((3840, 2160), (1280, 736), 1280 / 3840),
    ],
)
def test_bucket_choice(size: tuple[int, int], bucket: tuple[int, int], scale: float) -> None:
    got_bucket, got_scale = choose_bucket(*size, DEFAULT_BUCKETS)
    assert got_bucket == bucket
    assert got_scale == pytest.approx(scale)


@pytest.mark.parametrize(
    ("size", "key"), [((320, 240), "320x256"), ((640, 480), "640x480"), ((1920, 1080), "1280x736"), ((200, 600), "640x480")]
)
def test_decoded_frame_is_letterboxed_into_its_bucket(codec: CameraCodec, size: tuple[int, int], key: str) -> None:
    d = codec.decode(encode(astronaut().resize(size)), HEADERS)
    frame: CameraFrame = d.payload
    bw, bh = (int(v) for v in key.split("x"))
    assert d.bucket == key
    assert frame.image.shape == (bh, bw, 3) and frame.image.dtype == np.uint8
    assert (frame.width, frame.height) == size
    nw, nh = round(size[0] * frame.scale_x), round(size[1] * frame.scale_y)
    assert nw <= bw and nh <= bh
    assert not frame.image[nh:].any() and not frame.image[:, nw:].any()  # padding is 0
    assert frame.image[:nh, :nw].mean() > 20


def test_grey_jpeg_becomes_rgb(codec: CameraCodec) -> None:
    frame = codec.decode(sample_bytes("camera"), HEADERS).payload
    assert frame.image.shape[2] == 3
    assert np.array_equal(frame.image[..., 0], frame.image[..., 2])


def test_bucket_sizes_must_be_multiples_of_32() -> None:
    with pytest.raises(ValueError, match="multiples of 32"):
        CameraCodec(buckets=[(320, 240)])


# ------------------------------------------------------------------ collate
def test_collate_is_shape_correct_and_pads_with_zero_rows(codec: CameraCodec) -> None:
    decoded = [codec.decode(sample_bytes(n), HEADERS) for n in ("astronaut", "camera", "chelsea")]
    assert {d.bucket for d in decoded} == {"640x480"}
    feeds = codec.collate([d.payload for d in decoded], pad_to_rows=5)
    assert list(feeds) == [INPUT_NAME]
    x = feeds[INPUT_NAME]
    assert x.shape == (5, 3, 480, 640) and x.dtype == np.float32 and x.flags.c_contiguous
    for i, d in enumerate(decoded):  # the batch equals the per-frame conversion
        assert np.array_equal(x[i], d.payload.image.transpose(2, 0, 1).astype(np.float32))
    assert not x[3:].any()
    assert codec.collate([decoded[0].payload])[INPUT_NAME].shape == (1, 3, 480, 640)


def test_collate_refuses_mixed_buckets_and_short_padding(codec: CameraCodec) -> None:
    a = codec.decode(sample_bytes("astronaut"), HEADERS).payload
    b = codec.decode(encode(astronaut().resize((320, 240))), HEADERS).payload
    with pytest.raises(ValueError, match="different buckets"):
        codec.collate([a, b])
    with pytest.raises(ValueError, match="cannot collate 2 frames into 1 rows"):
        codec.collate([a, a], pad_to_rows=1)
