"""Cost of the camera path on this machine: CenterFace per bucket and batch size
(ONNX Runtime CPU, 1 intra-op thread; t(n) ~ a + b*n), decode+preprocess per frame,
collate per frame and postprocess per frame. Prints tables; not a test.

    .venv/bin/python -m bench.camera_cost [--repeats 3] [--batches 1,2,4,8]

Short on purpose (about a minute on 2 shared cores). Times are the minimum over
repeats: on a shared machine the minimum is the least disturbed estimate.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import onnxruntime as ort

from models.camera import MODEL_PATH
from pipeline.codecs.camera import DEFAULT_BUCKETS, CameraCodec
from pipeline.codecs.camera_image import bucket_key
from pipeline.loadgen.camera import CameraFrameFactory

SOURCE_SIZES = ((320, 240), (640, 480), (1280, 720), (1920, 1080))
HEADERS = {"camera_id": b"c", "frame_id": b"1"}


def best_of(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: allocations, ORT's first run of a shape
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def session() -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(MODEL_PATH), opts, providers=["CPUExecutionProvider"])


def model_cost(sess: ort.InferenceSession, batches: list[int], repeats: int) -> None:
    print("\nCenterFace, ORT CPU, 1 thread: ms per call (ms per frame)")
    print(f"{'bucket':>9} " + " ".join(f"{'n=' + str(n):>17}" for n in batches) + f" {'a ms':>8} {'b ms/frame':>11}")
    for bw, bh in DEFAULT_BUCKETS:
        ts = []
        for n in batches:
            x = np.random.default_rng(0).uniform(0, 255, (n, 3, bh, bw)).astype(np.float32)
            ts.append(best_of(lambda x=x: sess.run(None, {"input": x}), repeats) * 1e3)
        b, a = np.polyfit(batches, ts, 1)
        cells = " ".join(f"{t:9.1f} ({t / n:5.1f})" for t, n in zip(ts, batches, strict=True))
        print(f"{bucket_key((bw, bh)):>9} {cells} {a:8.1f} {b:11.1f}")


def codec_cost(sess: ort.InferenceSession, repeats: int) -> None:
    codec = CameraCodec()
    gen = CameraFrameFactory(seed=1, cameras=len(SOURCE_SIZES), resolutions=SOURCE_SIZES)
    print("\nper frame, ms: decode+letterbox (source thread), collate at n=8, split at n=8")
    print(f"{'source':>10} {'bucket':>9} {'jpeg kB':>8} {'decode':>8} {'collate':>8} {'split':>8} {'faces/frame':>12}")
    for cam, size in enumerate(SOURCE_SIZES):
        values = [gen.make(cam, i * 25, 300.0)[1] for i in range(8)]
        decoded = [codec.decode(v, HEADERS) for v in values]
        t_dec = best_of(lambda values=values: [codec.decode(v, HEADERS) for v in values], repeats) / 8
        payloads = [d.payload for d in decoded]
        t_col = best_of(lambda p=payloads: codec.collate(p), repeats) / 8
        names = [o.name for o in sess.get_outputs()]
        outputs = dict(zip(names, sess.run(names, codec.collate(payloads)), strict=True))
        t_split = best_of(lambda o=outputs, d=decoded: codec.split(o, d), repeats) / 8
        faces = np.mean([len(r["detections"]) for r in codec.split(outputs, decoded)])
        kb = np.mean([len(v) for v in values]) / 1024
        print(f"{size[0]}x{size[1]:<5} {decoded[0].bucket:>9} {kb:8.0f} {t_dec * 1e3:8.2f} "
              f"{t_col * 1e3:8.2f} {t_split * 1e3:8.3f} {faces:12.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", default="1,2,4,8")
    args = parser.parse_args(argv)
    sess = session()
    codec_cost(sess, args.repeats)
    model_cost(sess, [int(n) for n in args.batches.split(",")], args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
