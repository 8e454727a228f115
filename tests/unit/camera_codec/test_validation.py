"""CameraCodec refuses what is not a frame it can score, each with its reason: bad
images and headers, sizes over the limits, and what hostile producers send (digits that
are not ASCII, huge numbers, pixel bombs)."""

from __future__ import annotations

import inspect
import struct
import warnings

import orjson
import pytest
from PIL import Image

from pipeline.codecs.base import DecodeError
from pipeline.codecs.camera import CameraCodec
from pipeline.loadgen.camera import CameraFrameFactory, png_header_only
from tests.unit.camera_codec.frames import HEADERS, encode, sample_bytes

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
