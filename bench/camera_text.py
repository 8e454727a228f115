"""Camera and text pipelines side by side, in one run on this machine.

Camera (CenterFace, 320x240 frames -> the 320x256 bucket, K cameras keyed by camera id
at a fixed frame rate each), per policy none / static / adaptive:
  - throughput: a burst of frames drained by the worker (frames/s, from the first
    frame's consumption to the last result),
  - p50/p99 end-to-end latency (result timestamp - frame's Kafka timestamp) at two
    loads, as fractions of the model's single-frame capacity measured at start.
  On CPU a convolutional model gains nothing from batching (t(n) ~ b*n): the question
  is whether a policy ADDS latency there.

Text (MiniLM, the generator's mixed lengths: 70 % chat lines, 20 % medium, 10 % long
reviews), three variants on the same load:
  - bucketed: adaptive policy, padding to the length bucket's edge (the default),
  - longest:  adaptive policy, codec pad_to=longest (one bucket, each batch padded to
              its longest request: the usual approach without buckets),
  - bucketed-greedy / longest-greedy: the same two paddings under greedy batching
              (whatever is queued, up to the max), where batches always form,
  - none:     no batching.
  Each: backlog drain throughput, p50/p99 at one open-loop load, and the padded-token
  ratio (share of token slots that are padding, from the result documents: the requests
  of one batch share batch_rows, inference_ms and scored_at_ms).

Every worker is a `tidebatch run --pipeline camera|text` process; the variants' workers
run side by side (each on its own topics) and the open-loop traffic goes to one at a
time, in slices of --slice-seconds, the order rotated every round, so the machine's
other tenants weigh on every variant alike. Budgets are generous
(--slo-ms, default 60000; the text requests' own deadline_ms is dropped, their priority
kept) so that the comparison is about batching and padding, not about deadline
handling: nothing goes to the adaptive policy's late lane. Loads are shares of the
model's own speed measured at start (best of a few runs); on a shared 2-core machine
the worker's model time per row (reported) can be much higher, which is the load the
run really saw.

    .venv/bin/python bench/camera_text.py [--slice-seconds 5] [--rounds 3] [--only camera|text] [--quick]

Prints tables and writes out/bench/camera_text.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import (  # noqa: E402
    OUT,
    REPO,
    Results,
    _wait_assigned,
    embedded_broker,
    fresh_topics,
    make_producer,
    read_results,
    table,
)
from consumers.brokers.embedded import free_port  # noqa: E402
from consumers.profiles import large_message_overrides, producer_config  # noqa: E402
from pipeline.loadgen.pacing import poisson_schedule, run_open_loop  # noqa: E402

CAMERAS = 4
CAMERA_RESOLUTION = (320, 240)
FRAMES_PER_CAMERA = 8  # rendered once, re-sent with fresh frame ids
# static "as commonly deployed" (docs/BATCHING.md, "The simulator"): 64 rows, 10 ms linger
STATIC = {"max_batch_rows": 64, "max_queue_delay_ms": 10.0}
DRAIN_ROUNDS = 2  # drains per variant, the order rotated
GREEDY_TEXT = {"TIDEBATCH_BATCHING__MAX_BATCH_ROWS": "32"}  # a common cap for a transformer


# ----------------------------------------------------------------------------- workers
@dataclass
class Variant:
    name: str
    policy: str
    env: dict[str, str]
    inp: str = ""
    out: str = ""


@contextmanager
def workers(bootstrap: str, pipeline: str, variants: list[Variant], slo_ms: float) -> Iterator[None]:
    """One `tidebatch run --pipeline P` process per variant, each on its own fresh
    topics, all started together; yields once every one has its partitions. Idle
    workers only poll, so the one receiving traffic has the cores (as much as the other
    tenants of this machine leave)."""
    procs: list[tuple[subprocess.Popen, int, Path]] = []
    try:
        for v in variants:
            v.inp, v.out = fresh_topics(bootstrap, f"bench-{pipeline}-{v.name}", partitions=2)
            port = free_port()
            env = dict(os.environ, TIDEBATCH_METRICS__PORT=str(port), TIDEBATCH_CREATE_TOPICS="false", **v.env)
            cmd = [
                sys.executable, "-m", "pipeline.cli", "run", "--pipeline", pipeline,
                "--bootstrap-servers", bootstrap, "--broker-profile", "embedded", "--policy", v.policy,
                "--slo-ms", str(slo_ms), "--group-id", f"bench-{pipeline}-{v.name}-{uuid.uuid4().hex[:8]}",
                "--input-topic", v.inp, "--output-topic", v.out,
            ]
            log = OUT / f"{pipeline}-{v.name}.log"
            with open(log, "wb") as fh:
                procs.append((subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=REPO), port, log))
        for proc, port, log in procs:
            _wait_assigned(proc, port, log, timeout=180)
        yield
    finally:
        for proc, _, _ in procs:  # one at a time (each has its own group anyway)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()


def merge(parts: list[Results]) -> Results:
    docs = [d for r in parts for d in r.docs]
    ts = np.concatenate([r.result_ts_ms for r in parts]) if parts else np.array([])
    return Results(docs, ts)


def rotated(items: list, r: int) -> list:
    """Round r's order: each variant goes first once every len(items) rounds, so slow
    spells of the machine do not always fall on the same variant."""
    k = r % len(items)
    return items[k:] + items[:k]


def summarize(res: Results, sent: int, seconds: float | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"sent": sent, "scored": len(res.docs)}
    if res.docs:
        p50, p99 = res.percentiles()
        rows = [d["batch_rows"] for d in res.docs]
        out |= {"p50_ms": round(p50, 1), "p99_ms": round(p99, 1), "mean_batch_rows": round(float(np.mean(rows)), 2),
                "late_share": round(sum(bool(d["late"]) for d in res.docs) / len(res.docs), 3),
                # Model time per row: tells a slower model (a busy machine) from queueing.
                "model_ms_per_row": round(float(np.mean([d["inference_ms"] / d["batch_rows"] for d in res.docs])), 2)}
    if seconds is not None:
        out["offered_per_s"] = round(sent / seconds, 2)
    return out


def drain_summary(parts: list[Results]) -> dict[str, Any]:
    """Drains of one variant: requests/s over all of them (each drain's span summed),
    per drain, mean batch rows and model time per row."""
    docs = [d for p in parts for d in p.docs]
    rates = [drain_rate(p) for p in parts if p.docs]
    spans = sum(len(p.docs) / r for p, r in zip(parts, rates, strict=False) if r > 0)
    return {
        "requests": sum(len(p.docs) for p in parts), "per_s": round(len(docs) / spans, 2) if spans else None,
        "per_drain_per_s": [round(r, 2) for r in rates],
        "mean_batch_rows": round(float(np.mean([d["batch_rows"] for d in docs])), 2),
        "model_ms_per_row": round(float(np.mean([d["inference_ms"] / d["batch_rows"] for d in docs])), 2),
    }


def drain_rate(res: Results) -> float:
    """Results/s of a drained backlog: from the first request's consumption (its
    scored_at - inference - queue wait) to the last result."""
    start = min(d["scored_at_ms"] - d["inference_ms"] - d["queue_wait_ms"] for d in res.docs)
    span = (max(d["scored_at_ms"] for d in res.docs) - start) / 1000.0
    return len(res.docs) / span if span > 0 else float("nan")


def fmt(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


# ----------------------------------------------------------------------------- camera
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

    def send(i: int) -> None:
        _, camera, frame = events[i]
        key, value, headers = pool.message(run, camera, frame)
        while True:
            try:
                producer.produce(topic, key=key, value=value, headers=headers)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)

    sent, seconds = run_open_loop(times, send, idle=lambda s: producer.poll(s))
    assert producer.flush(60) == 0
    return sent, seconds


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
        drains: dict[str, list[Results]] = defaultdict(list)
        for r in range(DRAIN_ROUNDS):  # a burst of frames, drained; order rotated
            for v in rotated(variants, r):
                run = f"drain{r}{uuid.uuid4().hex[:4]}"
                sent, _ = send_frames(bootstrap, v.inp, pool, run, None, drain)
                drains[v.name].append(read_results(bootstrap, v.out, sent, timeout=drain * t1 * 6 + 60, run=run))
        for v in variants:
            report["policies"][v.name]["drain"] = drain_summary(drains[v.name])
        for load in loads:
            parts: dict[str, list[Results]] = defaultdict(list)
            sent_total: dict[str, int] = defaultdict(int)
            took_total: dict[str, float] = defaultdict(float)
            for r in range(rounds):
                for v in rotated(variants, r):
                    run = f"l{int(load * 100)}r{r}{uuid.uuid4().hex[:4]}"
                    n = max(int(load * capacity * slice_s), 1)
                    sent, took = send_frames(bootstrap, v.inp, pool, run, load * capacity, n, seed=r)
                    parts[v.name].append(read_results(bootstrap, v.out, sent, timeout=slice_s * 4 + 30, run=run))
                    sent_total[v.name] += sent
                    took_total[v.name] += took
            for v in variants:
                report["policies"][v.name][f"load_{load}"] = summarize(
                    merge(parts[v.name]), sent_total[v.name], took_total[v.name]) | {
                    # per slice, in round order: one slow spell of the machine shows here
                    "slice_p99_ms": [round(p.percentiles()[1], 1) if p.docs else None for p in parts[v.name]]}
            print(f"  load {load}: " + "; ".join(
                f"{v.name} {report['policies'][v.name][f'load_{load}']}" for v in variants), flush=True)
    return report


# ----------------------------------------------------------------------------- text
class TextPool:
    """Generated text requests (mixed lengths), re-sent with fresh request ids."""

    def __init__(self, size: int = 600, seed: int = 17) -> None:
        from pipeline.loadgen.text import TextRequestFactory

        factory = TextRequestFactory(seed=seed)
        self.templates = []
        for i in range(size):
            key, value = factory.make(i)
            doc = orjson.loads(value)
            doc.pop("deadline_ms", None)  # the worker's SLO governs (see the module doc)
            value = orjson.dumps(doc)
            rid = f'"request_id":"text-{seed}-{i}"'.encode()
            assert rid in value
            self.templates.append((key, value, rid))

    def get(self, i: int, run: str) -> tuple[bytes, bytes]:
        key, value, rid = self.templates[i % len(self.templates)]
        return key, value.replace(rid, f'"request_id":"{run}-{i}"'.encode(), 1)


def send_texts(bootstrap: str, topic: str, pool: TextPool, run: str, rate: float | None, count: int,
               seed: int = 2) -> tuple[int, float]:
    producer = make_producer(bootstrap, topic)
    times = iter([0.0] * count) if rate is None else poisson_schedule(rate, count, seed)

    def send(i: int) -> None:
        key, value = pool.get(i, run)
        while True:
            try:
                producer.produce(topic, key=key, value=value)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)

    sent, seconds = run_open_loop(times, send, idle=lambda s: producer.poll(s))
    assert producer.flush(60) == 0
    return sent, seconds


def padded_token_ratio(docs: list[dict], pad_to: str) -> float:
    """1 - real tokens / token slots run, over all batches. A batch's requests share
    (scored_at_ms, inference_ms, batch_rows): the worker stamps them once per batch."""
    from pipeline.codecs.text import TextCodec

    codec = TextCodec(pad_to=pad_to)  # type: ignore[arg-type]
    batches: dict[tuple, list[int]] = defaultdict(list)
    for d in docs:
        batches[(d["scored_at_ms"], d["inference_ms"], d["batch_rows"])].append(d["tokens"])
    real = slots = 0
    for tokens in batches.values():
        real += sum(tokens)
        slots += len(tokens) * codec.padded_length(tokens)
    return 1.0 - real / slots if slots else float("nan")


def text_request_seconds(pool: TextPool, n: int = 60) -> float:
    """Mean single-request model time over the pool's length mix (sets the load)."""
    import onnxruntime as ort

    from models.text.model import ensure_text_model
    from pipeline.codecs.text import TextCodec

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    session = ort.InferenceSession(str(ensure_text_model()), opts, providers=["CPUExecutionProvider"])
    codec = TextCodec()
    decoded = [codec.decode(pool.templates[i][1]) for i in range(n)]
    session.run(None, codec.collate([decoded[0].payload]))
    best = float("inf")
    for _ in range(2):  # other processes share the cores: the better of two passes
        t0 = time.perf_counter()
        for d in decoded:
            session.run(None, codec.collate([d.payload]))
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def bench_text(bootstrap: str, slice_s: float, rounds: int, slo_ms: float, load: float, drain: int) -> dict:
    pool = TextPool()
    t1 = text_request_seconds(pool)
    capacity = 1.0 / t1
    rate = load * capacity
    print(f"text: mixed lengths, one request alone {t1 * 1e3:.1f} ms on average -> {capacity:.1f} req/s; "
          f"open loop at {rate:.1f} req/s", flush=True)
    variants = [  # name, policy, the codec's padding
        Variant("bucketed", "adaptive", {"TIDEBATCH_CODEC__PAD_TO": "bucket"}),
        Variant("longest", "adaptive", {"TIDEBATCH_CODEC__PAD_TO": "longest"}),
        # adaptive declines to batch where its cost model sees no gain, which with one
        # bucket of mixed lengths is everywhere: greedy shows what padding costs when
        # batches do form, bucketed and not.
        Variant("bucketed-greedy", "greedy", {"TIDEBATCH_CODEC__PAD_TO": "bucket", **GREEDY_TEXT}),
        Variant("longest-greedy", "greedy", {"TIDEBATCH_CODEC__PAD_TO": "longest", **GREEDY_TEXT}),
        Variant("none", "none", {"TIDEBATCH_CODEC__PAD_TO": "bucket"}),
    ]
    report: dict[str, Any] = {"mean_single_ms": round(t1 * 1e3, 2), "capacity_rps": round(capacity, 2),
                              "load": load, "rate_rps": round(rate, 2), "rounds": rounds, "slice_seconds": slice_s,
                              "variants": {}}
    with workers(bootstrap, "text", variants, slo_ms):
        for v in variants:
            pad_to = v.env["TIDEBATCH_CODEC__PAD_TO"]
            report["variants"][v.name] = {"policy": v.policy, "pad_to": pad_to}
        drains: dict[str, list[Results]] = defaultdict(list)
        for r in range(DRAIN_ROUNDS):  # a burst of requests, drained; order rotated
            for v in rotated(variants, r):
                run = f"drain{r}{uuid.uuid4().hex[:4]}"
                sent, _ = send_texts(bootstrap, v.inp, pool, run, None, drain)
                drains[v.name].append(read_results(bootstrap, v.out, sent, timeout=drain * t1 * 8 + 60, run=run))
        for v in variants:
            merged = merge(drains[v.name])
            report["variants"][v.name]["drain"] = drain_summary(drains[v.name]) | {
                "padded_token_ratio": round(padded_token_ratio(merged.docs, v.env["TIDEBATCH_CODEC__PAD_TO"]), 3)}
        parts: dict[str, list[Results]] = defaultdict(list)
        sent_total: dict[str, int] = defaultdict(int)
        took_total: dict[str, float] = defaultdict(float)
        for r in range(rounds):
            for v in rotated(variants, r):
                run = f"load-r{r}{uuid.uuid4().hex[:4]}"
                sent, took = send_texts(bootstrap, v.inp, pool, run, rate, max(int(rate * slice_s), 1), seed=r)
                parts[v.name].append(read_results(bootstrap, v.out, sent, timeout=slice_s * 4 + 30, run=run))
                sent_total[v.name] += sent
                took_total[v.name] += took
        for v in variants:
            res = merge(parts[v.name])
            report["variants"][v.name]["load"] = summarize(res, sent_total[v.name], took_total[v.name]) | {
                "padded_token_ratio": round(padded_token_ratio(res.docs, v.env["TIDEBATCH_CODEC__PAD_TO"]), 3),
                "slice_p99_ms": [round(p.percentiles()[1], 1) if p.docs else None for p in parts[v.name]]}
            print(f"  {v.name}: {report['variants'][v.name]}", flush=True)
    return report


# ----------------------------------------------------------------------------- report
def print_tables(cam: dict | None, text: dict | None, slo_ms: float) -> None:
    if cam is not None:
        print_camera(cam, slo_ms)
    if text is not None:
        print_text(text, slo_ms)


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


def print_text(text: dict, slo_ms: float) -> None:
    headers = ["variant", "policy", "pad to", "drain rps", "drain batch", "drain pad %", "drain ms/row",
               "load p50 ms", "load p99 ms", "load batch", "load pad %", "model ms/row", "scored/sent"]
    rows = []
    for name, r in text["variants"].items():
        d, s = r["drain"], r["load"]
        rows.append([name, r["policy"], r["pad_to"], fmt(d["per_s"]), fmt(d["mean_batch_rows"], 2),
                     fmt(100 * d["padded_token_ratio"]), fmt(d["model_ms_per_row"]), fmt(s.get("p50_ms")),
                     fmt(s.get("p99_ms")),
                     fmt(s.get("mean_batch_rows"), 2), fmt(100 * s.get("padded_token_ratio", float("nan"))),
                     fmt(s.get("model_ms_per_row")), f"{s['scored']}/{s['sent']}"])
    print(f"\nText (MiniLM, mixed lengths; one request alone {text['mean_single_ms']} ms on average = "
          f"{text['capacity_rps']} req/s; open loop at {text['rate_rps']} req/s = {int(text['load'] * 100)}%; "
          f"greedy max {GREEDY_TEXT['TIDEBATCH_BATCHING__MAX_BATCH_ROWS']} rows; SLO {slo_ms:g} ms)")
    print(table(headers, rows))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slice-seconds", type=float, default=5.0, help="open-loop seconds of one variant's slice")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of slices (variants rotated) per load")
    ap.add_argument("--camera-loads", default="0.25,0.5", help="shares of the model's capacity")
    ap.add_argument("--text-load", type=float, default=0.4, help="share of one-at-a-time capacity")
    ap.add_argument("--slo-ms", type=float, default=60000.0)
    ap.add_argument("--camera-drain", type=int, default=120, help="backlog frames drained per policy")
    ap.add_argument("--text-drain", type=int, default=160, help="backlog requests drained per variant")
    ap.add_argument("--only", choices=("camera", "text"), help="run one half")
    ap.add_argument("--quick", action="store_true", help="short runs, to check the script works")
    args = ap.parse_args()
    if args.quick:
        args.slice_seconds, args.rounds = 2.0, 1
        args.camera_drain, args.text_drain = 20, 30
    loads = tuple(float(x) for x in args.camera_loads.split(","))
    with embedded_broker() as broker:
        cam = text = None
        if args.only != "text":
            cam = bench_camera(broker.bootstrap_servers, args.slice_seconds, args.rounds, args.slo_ms, loads,
                               args.camera_drain)
        if args.only != "camera":
            text = bench_text(broker.bootstrap_servers, args.slice_seconds, args.rounds, args.slo_ms, args.text_load,
                              args.text_drain)
    report = {"camera": cam, "text": text, "slo_ms": args.slo_ms, "cpu_count": os.cpu_count()}
    print_tables(cam, text, args.slo_ms)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "camera_text.json").write_text(json.dumps(report, indent=2))
    print(f"\nwrote {OUT / 'camera_text.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
