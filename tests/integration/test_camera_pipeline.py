"""Issue "Camera frames": the camera pipeline's guarantees, on the real embedded broker
with a real Worker (camera.frames -> CenterFace -> camera.detections)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import defaultdict

import numpy as np
import onnxruntime as ort
import orjson
import pytest
from confluent_kafka import Producer

from consumers.dead_letter import H_ERROR, H_OFFSET, H_PARTITION, H_STAGE, H_TOPIC
from consumers.profiles import large_message_overrides, producer_config
from consumers.records import SourceRecord
from models.camera import MODEL_PATH, SAMPLES_DIR
from pipeline.app.compose import build_worker
from pipeline.clock import FakeClock
from pipeline.codecs.camera import CameraCodec
from pipeline.loadgen.camera import CameraFrameFactory
from pipeline.registry.pipelines import get_pipeline
from tests.integration.pipeline_helpers import (
    REPO,
    profile_of,
    read_topic,
    result_docs,
    running_worker,
    worker_config,
)

ASTRONAUT = SAMPLES_DIR / "astronaut.jpg"
# Budgets far above any queueing here: these tests are about results and order, and a
# frame that misses its deadline under the adaptive policy is scored after in-time
# frames (the late lane; docs/ARCHITECTURE.md "Camera frames: order").
SLOW_MACHINE_SLO_MS = 120_000
STANDARD_FIELDS = {
    "request_id", "key", "model", "model_version", "batch_rows", "queue_wait_ms", "inference_ms",
    "kafka_ts_ms", "scored_at_ms", "priority", "late", "source",
}
FRAME_FIELDS = {"camera_id", "frame_id", "capture_ts_ms", "width", "height", "detections"}


@pytest.fixture(scope="module")
def reference_session() -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(MODEL_PATH), opts, providers=["CPUExecutionProvider"])


def camera_config(broker, inp: str, out: str, group: str, **extra):
    return worker_config(
        broker.bootstrap_servers, inp, out, group, pipeline="camera", dlq_topic=f"{inp}.dlq",
        late_topic=f"{inp}.late", batching={"slo_ms": SLOW_MACHINE_SLO_MS, **extra.pop("batching", {})},
        # The warm-up profile renders HD frames (~6 s on this machine); the cost model
        # learns online anyway. The order test keeps it on: the realistic start.
        runtime={"warmup": extra.pop("warmup", False), **extra.pop("runtime", {})}, **extra,
    )


def large_producer(bootstrap: str) -> Producer:
    """A producer that carries the camera pipeline's largest values (16 MiB)."""
    limit = get_pipeline("camera").max_message_bytes
    assert limit is not None
    return Producer(producer_config(profile_of(bootstrap), bootstrap, large_message_overrides(limit).producer))


def produce_frames(bootstrap: str, topic: str, frames, timestamp_ms: int | None = None) -> None:
    """frames: (key, value, headers) messages, produced in this order."""
    producer = large_producer(bootstrap)
    for key, value, headers in frames:
        kwargs = {"timestamp": timestamp_ms} if timestamp_ms is not None else {}
        producer.produce(topic, key=key, value=value, headers=headers, **kwargs)
        producer.poll(0)
    assert producer.flush(30) == 0


def frame_headers(camera_id: str, frame_id: int | str, priority: int | None = None) -> list[tuple[str, bytes]]:
    headers = [("camera_id", camera_id.encode()), ("frame_id", str(frame_id).encode())]
    if priority is not None:
        headers.append(("priority", str(priority).encode()))
    return headers


def direct_detections(session: ort.InferenceSession, value: bytes, headers: list) -> list[dict]:
    """The same model on one image, no pipeline: decode -> collate([one]) -> ORT -> split."""
    codec = CameraCodec()
    decoded = codec.decode(value, dict(headers))
    feeds = codec.collate([decoded.payload])
    names = [o.name for o in session.get_outputs()]
    outputs = dict(zip(names, session.run(names, feeds), strict=True))
    return codec.split(outputs, [decoded])[0]["detections"]


def test_astronaut_detections_equal_a_direct_single_image_run(
    broker, topic_factory, unique_group_id, reference_session
) -> None:
    inp = topic_factory("cam-astro", partitions=1)
    out = topic_factory("cam-astro-det", partitions=1)
    topic_factory(f"{inp}.dlq", exact=True)
    topic_factory(f"{inp}.late", exact=True)
    value = ASTRONAUT.read_bytes()
    # Several copies in one burst, so the worker may batch them: every copy must still
    # equal the single-image run.
    copies = 4
    frames = [(b"cam-astro", value, frame_headers("cam-astro", i)) for i in range(copies)]
    expected = direct_detections(reference_session, value, frames[0][2])
    assert expected, "the reference run finds no face in astronaut.jpg"
    cfg = camera_config(broker, inp, out, unique_group_id)
    with running_worker(cfg):
        produce_frames(broker.bootstrap_servers, inp, frames)
        msgs = read_topic(broker.bootstrap_servers, out, copies, timeout=60)
    docs = result_docs(msgs)
    assert sorted(d["frame_id"] for d in docs) == [str(i) for i in range(copies)]
    for doc in docs:
        # The frame's own fields plus the worker's standard fields.
        assert set(doc) >= FRAME_FIELDS | STANDARD_FIELDS, sorted(set(doc))
        assert doc["camera_id"] == "cam-astro" and doc["key"] == "cam-astro"
        assert doc["request_id"] == f"cam-astro/{doc['frame_id']}"  # dedup key of replays
        assert (doc["width"], doc["height"]) == (512, 512)
        assert doc["model"] == "centerface" and doc["late"] is False
        assert doc["source"]["topic"] == inp
        got = doc["detections"]
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            assert g["class"] == "face"
            np.testing.assert_allclose(g["box"], e["box"], atol=1e-3)
            np.testing.assert_allclose(g["score"], e["score"], atol=1e-4)
            np.testing.assert_allclose(g["landmarks"], e["landmarks"], atol=1e-3)


def test_bad_frames_go_to_the_dlq_with_a_reason_and_the_worker_keeps_scoring(
    broker, topic_factory, unique_group_id
) -> None:
    inp = topic_factory("cam-bad", partitions=1)
    out = topic_factory("cam-bad-det", partitions=1)
    dlq = topic_factory(f"{inp}.dlq", exact=True)
    topic_factory(f"{inp}.late", exact=True)
    factory = CameraFrameFactory(seed=3, cameras=1, resolutions=[(320, 240)])
    bad = {
        "corrupt_jpeg": "corrupt JPEG",
        "zero_bytes": "empty message value (0 bytes)",
        "absurd_dimensions": "over the 8192-pixel limit",
        # 8 MiB + 1: over the codec's limit, under the clients' 16 MiB, so it is consumed.
        "oversized": "over the 8388608-byte limit",
        "missing_header": "missing required header 'camera_id'",
        "unsupported_format": "unsupported image format",
    }
    frames = [factory.make(0, 0, 0.0)]
    for i, kind in enumerate(bad, start=1):
        frames.append(factory.make_invalid(kind, 0, i, 0.0))
    frames.append(factory.make(0, len(frames), 0.0))  # a valid frame after all of them
    cfg = camera_config(broker, inp, out, unique_group_id)
    with running_worker(cfg) as worker:
        produce_frames(broker.bootstrap_servers, inp, frames)
        dead = read_topic(broker.bootstrap_servers, dlq, len(bad), timeout=60)
        scored = result_docs(read_topic(broker.bootstrap_servers, out, 2, timeout=60))
        assert worker.stats.dlq == len(bad)
    assert [d["frame_id"] for d in scored] == ["0", str(len(frames) - 1)]
    assert len(dead) == len(bad)
    for m, (kind, reason) in zip(dead, bad.items(), strict=True):
        headers = dict(m.headers())
        offset = int(headers[H_OFFSET])
        assert reason in headers[H_ERROR].decode(), (kind, headers[H_ERROR])
        assert headers[H_STAGE] == b"decode"
        assert headers[H_TOPIC].decode() == inp and headers[H_PARTITION] == b"0"
        assert 1 <= offset <= len(bad)
        # The original bytes and headers, unchanged, for inspection and replay.
        key, value, original = frames[offset]
        assert (m.value() or b"") == value and m.key() == key
        assert [(k, v) for k, v in m.headers() if not k.startswith(("tidebatch.", "__connect.errors."))] == original
    assert len(dead[3].value()) == 8 * 1024 * 1024 + 1


@pytest.mark.parametrize(
    "runtime",
    [{}, {"executors": 3}],
    ids=["one-executor", "three-executors"],  # three batches run at once: published in dispatch order
)
def test_one_cameras_frames_keep_their_order_across_buckets_and_priorities(
    broker, topic_factory, unique_group_id, runtime
) -> None:
    """Several cameras keyed by camera_id on a multi-partition topic, in two resolution
    buckets and two priority levels, under the default (adaptive, EDF) policy: per
    camera, the frame ids in result order are increasing. All frames carry the same
    Kafka timestamp (equal deadlines: FIFO must break the ties, poll after poll) and
    arrive in waves, so that later frames are queued while earlier ones still wait."""
    inp = topic_factory("cam-order", partitions=3)
    out = topic_factory("cam-order-det", partitions=3)
    topic_factory(f"{inp}.dlq", exact=True)
    topic_factory(f"{inp}.late", exact=True)
    # camera index -> (resolution, priority): 320x240 -> bucket 320x256, 480x360 -> 640x480.
    cameras = {0: ((320, 240), 0), 1: ((320, 240), 5), 2: ((480, 360), 0), 3: ((320, 240), 0)}
    factory = CameraFrameFactory(seed=9, cameras=len(cameras), resolutions=[r for r, _ in cameras.values()])
    per_camera, waves = 6, 3
    frames = []
    for j in range(per_camera):
        for k, (_, prio) in cameras.items():
            key, value, _ = factory.make(k, j, j * 0.1)
            frames.append((key, value, frame_headers(factory.camera_id(k), j, prio)))
    ts = int(time.time() * 1000)
    cfg = camera_config(broker, inp, out, unique_group_id, warmup=True, runtime=runtime)
    with running_worker(cfg) as worker:
        size = len(frames) // waves
        for w in range(waves):
            produce_frames(broker.bootstrap_servers, inp, frames[w * size:(w + 1) * size], timestamp_ms=ts)
        msgs = read_topic(broker.bootstrap_servers, out, len(frames), timeout=90)
        assert worker.stats.dlq == 0
    assert len(msgs) == len(frames)
    order: dict[str, list[int]] = defaultdict(list)
    partition_of: dict[str, set[int]] = defaultdict(set)
    for m in msgs:  # read_topic returns each partition's records in offset order
        doc = orjson.loads(m.value())
        order[doc["camera_id"]].append(int(doc["frame_id"]))
        partition_of[doc["camera_id"]].add(m.partition())
    assert set(order) == {factory.camera_id(k) for k in cameras}
    for camera_id, frame_ids in order.items():
        assert len(partition_of[camera_id]) == 1  # keyed by camera: one result partition
        assert frame_ids == sorted(frame_ids) == list(range(per_camera)), (camera_id, frame_ids)


def test_equal_timestamps_polled_apart_keep_their_order_under_edf(broker, monkeypatch) -> None:
    """Regression: deadlines were mapped onto the batcher's clock with a fresh
    (monotonic, whole-ms wall clock) pair every poll, so two frames with the same Kafka
    timestamp polled a few ms apart got deadlines up to 1 ms apart in either direction,
    and EDF could serve the later frame first. Deterministic here: fake clocks reproduce
    a poll pair whose wall-clock readings truncate differently."""
    import pipeline.worker.core as worker_module

    cfg = worker_config(
        broker.bootstrap_servers, "unused-in", "unused-out", "unused-group", pipeline="camera",
        runtime={"warmup": False}, batching={"slo_ms": SLOW_MACHINE_SLO_MS},
    )
    clock = FakeClock(100.0)
    worker = build_worker(cfg, clock=clock)
    # True wall time = 1.7e12 ms + clock * 1000; wall_ms() truncates it to whole ms.
    monkeypatch.setattr(worker_module, "wall_ms", lambda: int(1_700_000_000_000 + clock.now() * 1000))
    factory = CameraFrameFactory(seed=1, cameras=1, resolutions=[(320, 240)])
    ts = 1_700_000_100_000
    records = []
    for i in range(2):
        key, value, headers = factory.make(0, i, 0.0)
        records.append(SourceRecord("t", 0, i, key, value, dict(headers), ts))
    clock.set(100.0009)  # wall 1_700_000_100_000.9 -> 100_000: mapping off by +0.9 ms
    worker._admit([records[0]])
    clock.set(100.0101)  # wall 1_700_000_100_010.1 -> 100_010: off by +0.1 ms
    worker._admit([records[1]])
    served = []
    while (batch := worker.queue.batcher.next_batch(clock.now())) is not None:
        served += [r.item.rec.offset for r in batch.requests]
    assert served == [0, 1]


def test_produce_camera_cli_sends_keyed_frames_of_each_camera_in_order(broker, topic_factory) -> None:
    topic = topic_factory("cam-cli", partitions=2)
    cmd = [
        sys.executable, "-m", "pipeline.cli", "produce", "camera",
        "--bootstrap-servers", broker.bootstrap_servers, "--broker-profile", broker.profile,
        "--topic", topic, "--partitions", "2", "--cameras", "2", "--fps", "25", "--count", "6",
        "--resolutions", "320x240,160x120", "--quiet",
    ]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "sent 6 camera requests" in done.stdout
    msgs = read_topic(broker.bootstrap_servers, topic, 6, timeout=30)
    assert len(msgs) == 6
    codec = CameraCodec()
    frames: dict[str, list[int]] = defaultdict(list)
    for m in msgs:
        headers = dict(m.headers())
        decoded = codec.decode(m.value(), headers)  # a valid frame for the pipeline
        camera_id = headers["camera_id"].decode()
        assert m.key() == camera_id.encode()
        assert int(headers["capture_ts_ms"]) > 0
        frames[camera_id].append(int(headers["frame_id"]))
        assert decoded.payload.width in (320, 160)
    assert frames == {"cam-0000": [0, 1, 2], "cam-0001": [0, 1, 2]}
