"""Synthetic camera-frame events made from real photographs.

Each camera gets one sample photograph (models/camera/samples/), a resolution, a JPEG
quality and a slow pan/zoom path over the photograph; every frame is that view at the
frame's position on the path, lit by a day/night cycle driven by the simulated time
`t`, with a little sensor noise, JPEG-encoded. Frames are a pure function of
(seed, camera_index, frame_index, t), so a run can be replayed byte for byte.

The message layout is the one pipeline/codecs/camera.py documents: key = camera id
(one camera's frames stay in one partition, in order), value = JPEG bytes, headers
camera_id, frame_id, capture_ts_ms.
"""

from __future__ import annotations

import heapq
import io
import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from models.camera import SAMPLES_DIR

Message = tuple[bytes, bytes, list[tuple[str, bytes]]]

# (width, height) assigned to cameras round-robin: VGA, HD, QVGA, full HD.
DEFAULT_RESOLUTIONS: tuple[tuple[int, int], ...] = ((640, 480), (1280, 720), (320, 240), (1920, 1080))
DEFAULT_DAY_SECONDS = 600.0  # one simulated day; a load test compresses 24 h into minutes
DEFAULT_START_MS = 1_700_000_000_000  # capture_ts_ms of t = 0 (fixed: replayable)
DEFAULT_MAX_BYTES = 8 * 1024 * 1024  # the codec's default limit
INVALID_KINDS = (
    "corrupt_jpeg", "zero_bytes", "absurd_dimensions", "oversized", "missing_header",
    "unsupported_format",
)
_NOISE_MARGIN = 32  # noise bank is this much larger than the frame; frames take shifted windows


def daylight(t: float, day_seconds: float = DEFAULT_DAY_SECONDS) -> float:
    """0 at midnight (t = 0, day_seconds, ...), 1 at noon; a smooth cosine in between."""
    return 0.5 - 0.5 * math.cos(2.0 * math.pi * t / day_seconds)


def rate_at(t: float, fps: float, day_seconds: float = DEFAULT_DAY_SECONDS, night_fraction: float = 0.1) -> float:
    """Total frames/s at time t: `fps` at noon, `fps * night_fraction` at midnight
    (motion-triggered cameras send little at night, a lot by day)."""
    return fps * (night_fraction + (1.0 - night_fraction) * daylight(t, day_seconds))


@dataclass(slots=True)
class _Camera:
    camera_id: str
    image: Image.Image  # the sample, RGB or L
    size: tuple[int, int]  # output (width, height)
    quality: int
    zoom: float  # fraction of the largest crop of the right aspect
    phase: tuple[float, float, float]  # pan x, pan y, zoom wobble
    speed: float  # radians per frame of the pan path
    gain: float  # per-camera exposure difference
    noise: np.ndarray  # int16 bank, (h + margin, w + margin[, 1])


class CameraFrameFactory:
    """Makes (key, value, headers) camera-frame messages, deterministic per seed."""

    def __init__(
        self,
        seed: int,
        cameras: int,
        resolutions: Sequence[tuple[int, int]] = DEFAULT_RESOLUTIONS,
        day_seconds: float = DEFAULT_DAY_SECONDS,
        start_ms: int = DEFAULT_START_MS,
        samples_dir: Path = SAMPLES_DIR,
    ) -> None:
        if cameras < 1:
            raise ValueError("cameras must be >= 1")
        if not resolutions:
            raise ValueError("at least one resolution is needed")
        self.seed = seed
        self.cameras = cameras
        self.resolutions = tuple((int(w), int(h)) for w, h in resolutions)
        self.day_seconds = day_seconds
        self.start_ms = start_ms
        self._samples = _load_samples(samples_dir)
        self._cams: dict[int, _Camera] = {}

    def camera_id(self, camera_index: int) -> str:
        return f"cam-{camera_index:04d}"

    def make(self, camera_index: int, frame_index: int, t: float) -> Message:
        """One frame of camera `camera_index` at simulated time `t` (seconds from start)."""
        cam = self._camera(camera_index)
        value = self._render(cam, camera_index, frame_index, t)
        return cam.camera_id.encode(), value, self._headers(cam.camera_id, frame_index, t)

    def make_invalid(self, kind: str, camera_index: int = 0, frame_index: int = 0,
                     t: float = 0.0, max_bytes: int = DEFAULT_MAX_BYTES) -> Message:
        """A message the codec must refuse, of one of INVALID_KINDS."""
        key, good, headers = self.make(camera_index, frame_index, t)
        if kind == "corrupt_jpeg":
            # A partial upload: markers and frame header intact, entropy data cut short.
            return key, good[: len(good) * 3 // 5], headers
        if kind == "zero_bytes":
            return key, b"", headers
        if kind == "absurd_dimensions":
            return key, png_header_only(100_000, 100_000), headers
        if kind == "oversized":
            # Valid JPEG followed by junk after its end marker: only the size is wrong.
            return key, good + bytes(max_bytes + 1 - len(good)), headers
        if kind == "missing_header":
            return key, good, [(k, v) for k, v in headers if k != "camera_id"]
        if kind == "unsupported_format":
            buf = io.BytesIO()
            Image.new("RGB", (64, 48), (90, 90, 90)).save(buf, format="GIF")
            return key, buf.getvalue(), headers
        raise ValueError(f"unknown invalid kind {kind!r}; one of {', '.join(INVALID_KINDS)}")

    # ------------------------------------------------------------ internals
    def _headers(self, camera_id: str, frame_index: int, t: float) -> list[tuple[str, bytes]]:
        return [
            ("camera_id", camera_id.encode()),
            ("frame_id", str(frame_index).encode()),
            ("capture_ts_ms", str(self.start_ms + round(t * 1000.0)).encode()),
        ]

    def _camera(self, index: int) -> _Camera:
        cam = self._cams.get(index)
        if cam is None:
            cam = self._cams[index] = self._new_camera(index)
        return cam

    def _new_camera(self, index: int) -> _Camera:
        rng = np.random.default_rng((self.seed, index, 0xCA))
        name = sorted(self._samples)[index % len(self._samples)]
        image = self._samples[name]
        w, h = self.resolutions[index % len(self.resolutions)]
        bank_shape = (h + _NOISE_MARGIN, w + _NOISE_MARGIN) + ((1,) if image.mode == "RGB" else ())
        sigma = rng.uniform(1.5, 4.0)
        # One noise bank per camera, windows shifted per frame: noise that changes every
        # frame at the cost of one add, not one random draw per pixel per frame.
        noise = np.rint(rng.normal(0.0, sigma, bank_shape)).astype(np.int16)
        return _Camera(
            camera_id=self.camera_id(index),
            image=image,
            size=(w, h),
            quality=int(rng.integers(70, 91)),
            zoom=float(rng.uniform(0.75, 1.0)),
            phase=tuple(float(p) for p in rng.uniform(0, 2 * math.pi, 3)),
            speed=float(rng.uniform(0.01, 0.05)),
            gain=float(rng.uniform(0.85, 1.1)),
            noise=noise,
        )

    def _render(self, cam: _Camera, camera_index: int, frame_index: int, t: float) -> bytes:
        view = cam.image.resize(cam.size, Image.Resampling.BILINEAR, box=_crop_box(cam, frame_index))
        light = cam.gain * (0.2 + 0.8 * daylight(t, self.day_seconds))  # never fully black
        lut = [min(255, round(v * light)) for v in range(256)] * len(view.getbands())
        pixels = np.asarray(view.point(lut), dtype=np.int16)
        rng = np.random.default_rng((self.seed, camera_index, frame_index))
        dy, dx = (int(v) for v in rng.integers(0, _NOISE_MARGIN, 2))
        h, w = pixels.shape[:2]
        pixels += cam.noise[dy : dy + h, dx : dx + w]
        np.clip(pixels, 0, 255, out=pixels)
        buf = io.BytesIO()
        Image.fromarray(pixels.astype(np.uint8)).save(buf, format="JPEG", quality=cam.quality)
        return buf.getvalue()


def _crop_box(cam: _Camera, frame_index: int) -> tuple[float, float, float, float]:
    """The part of the photograph this frame shows: the target aspect ratio, a slowly
    breathing zoom, and a centre that pans along a Lissajous path inside the image."""
    sw, sh = cam.image.size
    aspect = cam.size[0] / cam.size[1]
    full_w = min(sw, sh * aspect)
    a = cam.speed * frame_index
    zoom = cam.zoom * (0.95 + 0.05 * math.sin(0.3 * a + cam.phase[2]))
    cw, ch = full_w * zoom, full_w * zoom / aspect
    cx = sw / 2 + (sw - cw) / 2 * math.sin(a + cam.phase[0])
    cy = sh / 2 + (sh - ch) / 2 * math.sin(0.7 * a + cam.phase[1])
    return (cx - cw / 2, cy - ch / 2, cx + cw / 2, cy + ch / 2)


def _load_samples(samples_dir: Path) -> dict[str, Image.Image]:
    files = sorted(Path(samples_dir).glob("*.jpg"))
    if not files:
        raise FileNotFoundError(f"no sample photographs (*.jpg) in {samples_dir}")
    out = {}
    for f in files:
        with Image.open(f) as im:
            out[f.stem] = im.convert("L" if im.mode == "L" else "RGB")
    return out


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims width x height (valid CRC) with no pixel data: a
    decompression-bomb shape that costs 57 bytes instead of width*height*3."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


def camera_schedule(
    cameras: int,
    fps: float,
    count: int,
    day_seconds: float | None = None,
    seed: int = 0,
) -> list[tuple[float, int, int]]:
    """The first `count` frames of `cameras` cameras, each sending `fps` frames/s, as
    (t seconds from start, camera_index, frame_index) in time order.

    Cameras run at a fixed frame rate (not Poisson), each with its own phase so they do
    not all fire at once. With day_seconds, each camera's rate follows the day/night
    wave `rate_at` (t = 0 is midnight: fps / 10, fps at noon); the next frame comes
    1 / rate(t) after the last one."""
    if cameras < 1:
        raise ValueError("cameras must be >= 1")
    if fps <= 0:
        raise ValueError("fps must be > 0")
    rng = np.random.default_rng((seed, 0x5C4ED))

    def interval(t: float) -> float:
        return 1.0 / (rate_at(t, fps, day_seconds) if day_seconds else fps)

    heap = [(float(rng.uniform(0.0, interval(0.0))), k, 0) for k in range(cameras)]
    heapq.heapify(heap)
    out: list[tuple[float, int, int]] = []
    while len(out) < count:
        t, k, j = heapq.heappop(heap)
        out.append((t, k, j))
        heapq.heappush(heap, (t + interval(t), k, j + 1))
    return out


def parse_resolutions(text: str) -> tuple[tuple[int, int], ...]:
    """"640x480,320x240" -> ((640, 480), (320, 240)); ValueError naming the bad part."""
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        w, sep, h = part.lower().partition("x")
        if not sep or not w.isdigit() or not h.isdigit() or int(w) < 1 or int(h) < 1:
            raise ValueError(f"resolution {part!r}: expected WIDTHxHEIGHT, e.g. 640x480")
        out.append((int(w), int(h)))
    if not out:
        raise ValueError("no resolution given: expected WIDTHxHEIGHT[,WIDTHxHEIGHT...]")
    return tuple(out)
