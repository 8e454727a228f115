"""The camera half of bench/camera_text.py: CenterFace on 320x240 frames of CAMERAS
cameras at a fixed frame rate each, per policy none / static / adaptive: a drained
burst of frames and the latency at shares of the model's single-frame capacity.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from bench.camera_text_variants import (
    Variant,
    drain_rounds,
    drain_summary,
    fmt,
    load_rounds,
    merge,
    send_paced,
    slice_p99,
    summarize,
    workers,
)
from bench.harness import table
from consumers.profiles import large_message_overrides, producer_config

CAMERAS = 4
CAMERA_RESOLUTION = (320, 240)
FRAMES_PER_CAMERA = 8  # rendered once, re-sent with fresh frame ids
# static "as commonly deployed" (docs/BATCHING.md, "The simulator"): 64 rows, 10 ms linger
STATIC = {"max_batch_rows": 64, "max_queue_delay_ms": 10.0}


class FramePool:
    """Rendered frames of CAMERAS cameras, re-sent with fresh ids (rendering a frame
    costs tens of ms in Python: done before the clock starts)."""

    def __init__(self, seed: int = 5) -> None:
        from pipeline.loadgen.camera import CameraFrameFactory

        factory = CameraFrameFactory(seed=seed, cameras=CAMERAS, resolutions=[CAMERA_RESOLUTION])
        self.frames = [[factory.make(k, j, j * 0.2)[1] for j in range(FRAMES_PER_CAMERA)] for k in range(CAMERAS)]

    def message(self, run: str, camera: int, frame: int) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
        # camera_id carries the run: request_id = camera_id/frame_id starts with "<run>-".
        camera_id = f"{run}-cam{camera}"
        headers = [("camera_id", camera_id.encode()), ("frame_id", str(frame).encode())]
        return camera_id.encode(), self.frames[camera][frame % FRAMES_PER_CAMERA], headers


def camera_model_seconds(pool: FramePool) -> float:
    """Median single-frame model time in the frames' bucket (1 intra-op thread, as the
    worker runs it): sets the loads."""
    import onnxruntime as ort

    from models.camera import MODEL_PATH
    from pipeline.codecs.camera import CameraCodec

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    session = ort.InferenceSession(str(MODEL_PATH), opts, providers=["CPUExecutionProvider"])
    codec = CameraCodec()
    feeds = codec.collate([codec.decode(pool.frames[0][0], {"camera_id": b"c", "frame_id": b"0"}).payload])
    session.run(None, feeds)
    times = []
    for _ in range(9):
        t0 = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - t0)
    return float(np.percentile(times, 25))  # other processes share the cores: near-best


def camera_producer(bootstrap: str, topic: str):
    from confluent_kafka import Producer

    from pipeline.app.produce import warm_up_producer
    from pipeline.registry.pipelines import get_pipeline

    limit = get_pipeline("camera").max_message_bytes or 16 * 1024 * 1024
    producer = Producer(producer_config("embedded", bootstrap, large_message_overrides(limit).producer))
    warm_up_producer(producer, topic)
    return producer


def send_frames(bootstrap: str, topic: str, pool: FramePool, run: str, fps_total: float | None,
                count: int, seed: int = 1) -> tuple[int, float]:
    """count frames of CAMERAS cameras at fps_total / CAMERAS each (a fixed frame rate,
    random phases), or all at once when fps_total is None. Returns (sent, seconds)."""
    from pipeline.loadgen.camera import camera_schedule

    producer = camera_producer(bootstrap, topic)
    fps = (fps_total or 1.0) / CAMERAS
    events = camera_schedule(CAMERAS, fps, count, seed=seed)
    times = iter([0.0] * count) if fps_total is None else iter([t for t, _, _ in events])
    return send_paced(producer, topic, times, lambda i: pool.message(run, *events[i][1:]))


def bench_camera(bootstrap: str, slice_s: float, rounds: int, slo_ms: float, loads: tuple[float, ...],
                 drain: int) -> dict:
    pool = FramePool()
    t1 = camera_model_seconds(pool)
    capacity = 1.0 / t1
    print(f"camera: {CAMERAS} cameras at {CAMERA_RESOLUTION[0]}x{CAMERA_RESOLUTION[1]}; model alone "
          f"{t1 * 1e3:.1f} ms/frame -> capacity {capacity:.1f} frames/s", flush=True)
    static_env = {f"TIDEBATCH_BATCHING__{k.upper()}": str(v) for k, v in STATIC.items()}
    variants = [Variant("none", "none", {}), Variant("static", "static", static_env),
                Variant("adaptive", "adaptive", {})]
    report: dict[str, Any] = {"model_ms_per_frame": round(t1 * 1e3, 2), "capacity_fps": round(capacity, 2),
                              "loads": list(loads), "static_settings": STATIC, "rounds": rounds,
                              "slice_seconds": slice_s, "policies": {v.name: {} for v in variants}}
    with workers(bootstrap, "camera", variants, slo_ms):
        drains = drain_rounds(  # a burst of frames, drained
            bootstrap, variants, timeout=drain * t1 * 6 + 60,
            send=lambda v, run, r: send_frames(bootstrap, v.inp, pool, run, None, drain))
        for v in variants:
            report["policies"][v.name]["drain"] = drain_summary(drains[v.name])
        for load in loads:
            n = max(int(load * capacity * slice_s), 1)
            slices = load_rounds(
                bootstrap, variants, rounds, f"l{int(load * 100)}", timeout=slice_s * 4 + 30,
                send=lambda v, run, r, load=load, n=n: send_frames(
                    bootstrap, v.inp, pool, run, load * capacity, n, seed=r))
            for v in variants:
                report["policies"][v.name][f"load_{load}"] = summarize(
                    merge(slices.parts[v.name]), slices.sent[v.name], slices.seconds[v.name]) | {
                    "slice_p99_ms": slice_p99(slices.parts[v.name])}
            print(f"  load {load}: " + "; ".join(
                f"{v.name} {report['policies'][v.name][f'load_{load}']}" for v in variants), flush=True)
    return report


def print_camera(cam: dict, slo_ms: float) -> None:
    loads = cam["loads"]
    headers = ["policy", "drain fps", "drain batch"]
    for load in loads:
        pct = f"{int(load * 100)}%"
        headers += [f"{pct} p50 ms", f"{pct} p99 ms", f"{pct} batch", f"{pct} model ms/row"]
    rows = []
    for policy, r in cam["policies"].items():
        line = [policy, fmt(r["drain"]["per_s"]), fmt(r["drain"]["mean_batch_rows"], 2)]
        for load in loads:
            s = r[f"load_{load}"]
            line += [fmt(s.get("p50_ms")), fmt(s.get("p99_ms")), fmt(s.get("mean_batch_rows"), 2),
                     fmt(s.get("model_ms_per_row"))]
        rows.append(line)
    print(f"\nCamera (CenterFace, {CAMERA_RESOLUTION[0]}x{CAMERA_RESOLUTION[1]} frames, {CAMERAS} cameras; model alone "
          f"{cam['model_ms_per_frame']} ms/frame = {cam['capacity_fps']} frames/s; loads as a share of that; "
          f"static = {STATIC['max_batch_rows']} rows / {STATIC['max_queue_delay_ms']:g} ms linger; SLO {slo_ms:g} ms)")
    print(table(headers, rows))
    base = cam["policies"]["none"]
    for load in loads:
        a, n = cam["policies"]["adaptive"][f"load_{load}"], base[f"load_{load}"]
        if "p99_ms" in a and "p99_ms" in n:
            print(f"  adaptive vs none at {int(load * 100)}%: p50 {a['p50_ms'] - n['p50_ms']:+.1f} ms, "
                  f"p99 {a['p99_ms'] - n['p99_ms']:+.1f} ms")
