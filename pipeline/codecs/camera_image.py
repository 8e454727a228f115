"""Camera frames' images: the format and size from the file header alone, the shape
bucket a frame goes to, and the decode into its letterboxed bucket canvas (camera.py
describes the buckets and the limits the codec checks in between).

Every failure is a DecodeError with a one-line reason; a decoder's own message is
quoted shortened, without object addresses.
"""

from __future__ import annotations

import io
import re
import struct
from collections.abc import Sequence

import numpy as np
from PIL import Image

from pipeline.codecs.base import DecodeError

# Where a reason may quote a decoder's message, it is cut to this many characters.
_MAX_QUOTED_CHARS = 160
# An object repr in a decoder's message ("<_io.BytesIO object at 0x7f...>") means
# nothing to a producer and makes every reason unique; it becomes "the image".
_OBJECT_REPR = re.compile(r"<[^<>]*? at 0x[0-9a-fA-F]+>")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
JPEG_SOI = b"\xff\xd8"
# Start-of-frame markers carry the dimensions; C4 (DHT), C8 (JPG), CC (DAC) are not SOFs.
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Markers with no length field.
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})


def bucket_key(size: tuple[int, int]) -> str:
    """Bucket label, e.g. "640x480" (width x height); short and fit for a metric label."""
    return f"{size[0]}x{size[1]}"


def choose_bucket(
    width: int, height: int, buckets: Sequence[tuple[int, int]], min_scale: float = 0.75
) -> tuple[tuple[int, int], float]:
    """Return (bucket (w, h), scale) for a frame: the first bucket (smallest first) that
    holds it shrunk by no more than min_scale; else the largest. scale <= 1 always."""
    ordered = sorted(buckets, key=lambda b: b[0] * b[1])
    for bw, bh in ordered:
        fit = min(bw / width, bh / height)
        if fit >= min_scale:
            return (bw, bh), min(fit, 1.0)
    bw, bh = ordered[-1]
    return (bw, bh), min(bw / width, bh / height, 1.0)


def probe_image(value: bytes) -> tuple[str, int, int]:
    """Format and (width, height) from the file header alone, allocating nothing, so a
    decompression bomb is refused before any pixel is decoded."""
    if value.startswith(PNG_SIGNATURE):
        # IHDR is always the first chunk: length(4) "IHDR"(4) width(4) height(4).
        if len(value) < 24 or value[12:16] != b"IHDR":
            raise DecodeError("corrupt PNG: no IHDR header chunk")
        width, height = struct.unpack(">II", value[16:24])
        return "PNG", width, height
    if value.startswith(JPEG_SOI):
        width, height = _jpeg_dimensions(value)
        return "JPEG", width, height
    raise DecodeError(f"unsupported image format (first bytes {value[:8].hex()}): send JPEG or PNG")


def _jpeg_dimensions(value: bytes) -> tuple[int, int]:
    """Walk the JPEG marker segments up to the first start-of-frame."""
    i, n = 2, len(value)
    while i < n:
        if value[i] != 0xFF:
            raise DecodeError(f"corrupt JPEG: expected a marker at byte {i}")
        while i < n and value[i] == 0xFF:  # fill bytes may precede a marker
            i += 1
        if i >= n:
            break
        marker = value[i]
        i += 1
        if marker in _JPEG_STANDALONE:
            continue
        if marker in (0xD9, 0xDA):  # end of image / start of scan before any frame header
            raise DecodeError("corrupt JPEG: no frame header (SOF) before the image data")
        if i + 2 > n:
            break
        (length,) = struct.unpack(">H", value[i : i + 2])
        if marker in _JPEG_SOF:
            if i + 7 > n:
                break
            height, width = struct.unpack(">HH", value[i + 3 : i + 7])
            return width, height
        i += length
    raise DecodeError("corrupt JPEG: truncated before the frame header (SOF)")


def _one_line(exc: BaseException) -> str:
    """A decoder's message as part of a reason: first line, no object address, bounded."""
    lines = _OBJECT_REPR.sub("the image", str(exc)).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= _MAX_QUOTED_CHARS else text[: _MAX_QUOTED_CHARS - 3] + "..."


def decode_letterboxed(
    value: bytes, fmt: str, width: int, height: int, scale: float, bucket: tuple[int, int]
) -> tuple[np.ndarray, float, float]:
    """Decode, resize by `scale`, paste at the top-left of a zeroed bucket canvas.
    Returns (canvas, scale_x, scale_y) with the exact per-axis scales after rounding."""
    nw = max(1, min(bucket[0], round(width * scale)))
    nh = max(1, min(bucket[1], round(height * scale)))
    try:
        with Image.open(io.BytesIO(value), formats=[fmt]) as im:
            if im.size != (width, height):
                raise DecodeError(f"corrupt {fmt}: header says {width}x{height}, decoder {im.size[0]}x{im.size[1]}")
            # For a JPEG shrunk 2x or more, libjpeg decodes at 1/2..1/8 scale directly
            # (much cheaper); `box` is the full image in the reduced image's coordinates.
            box = im.draft("RGB", (nw, nh)) if fmt == "JPEG" and (nw, nh) != (width, height) else None
            rgb = im.convert("RGB")  # decodes; grey, palette, RGBA and CMYK all end as RGB
            if (nw, nh) != rgb.size or box is not None:
                rgb = rgb.resize((nw, nh), Image.Resampling.BILINEAR, box=box[1] if box else None)
            pixels = np.asarray(rgb)
    except DecodeError:
        raise
    # DecompressionBombWarning only arrives as an exception where warnings are errors;
    # max_pixels keeps accepted frames under Pillow's limit, this is the backstop.
    except (
        OSError, SyntaxError, ValueError, EOFError, struct.error,
        Image.DecompressionBombError, Image.DecompressionBombWarning,
    ) as exc:
        raise DecodeError(f"corrupt {fmt}: {_one_line(exc)}") from None
    canvas = np.zeros((bucket[1], bucket[0], 3), dtype=np.uint8)
    canvas[:nh, :nw] = pixels
    return canvas, nw / width, nh / height
