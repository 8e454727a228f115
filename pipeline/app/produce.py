"""Sending requests to a pipeline's input topic at a rate: `tidebatch produce`'s library
(pipeline/commands/produce.py parses its flags), also used by the demo
(pipeline/app/demo.py), the benches and the tests."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from consumers.records import H_PRODUCED_MS
from pipeline.clock import wall_ms
from pipeline.errors import UserError
from pipeline.kafka_backend import ProducerClient, load_producer
from pipeline.loadgen.generate import INPUT_TOPIC as GENERATE_TOPIC
from pipeline.loadgen.generate import generate_samples
from pipeline.loadgen.pacing import poisson_schedule, run_open_loop
from pipeline.registry.pipelines import PipelineSpec, Sample, get_pipeline
from pipeline.registry.schema_settings import SchemaRegistryConfig, records_format

DEFAULT_FPS = 5.0
DEFAULT_PARTITIONS = 4


def produce(
    bootstrap: str,
    pipeline: str,
    rate: float,
    count: int,
    *,
    topic: str | None = None,
    seed: int = 1,
    profile: str = "kafka",
    start_index: int = 0,
    progress: bool = False,
    should_stop: Callable[[], bool] | None = None,
    on_sent: Callable[[int], None] | None = None,
    camera: CameraLoad | None = None,
    encoding: str = "json",
    kafka: Mapping[str, Any] | None = None,
    defined: Sequence[Mapping[str, Any]] = (),
    requests: Sequence[bytes] | None = None,
    generate: Callable[[int], Sample] | None = None,
    records: str | None = None,
    schema_registry: SchemaRegistryConfig | None = None,
) -> tuple[int, float]:
    """Send `count` requests at `rate`/s (Poisson), or, for the camera pipeline with
    `camera` given, `count` frames of camera.cameras cameras at their own frame rate;
    returns (sent, seconds). Flushes at the end. `kafka`: the producer's settings
    (KafkaOverrides.client("producer")). `defined`: the config's `pipelines` entries;
    `requests`: request values to send round robin instead of generated ones.
    `generate`: i -> request of the generate pipeline (pipeline/loadgen/generate.py),
    which is no scoring pipeline of the registry (pipeline/registry/pipelines.py).
    `records`: avro, protobuf or jsonschema: the requests as schema-registry records
    (`schema_registry` names the registry; docs/SCHEMA_REGISTRY.md); None: a pipeline
    whose codec is one of those sends its records, any other its codec's own form."""
    make_samples: Callable[[int], Callable[[int], Sample]]
    spec: PipelineSpec | None = None
    if pipeline == "generate":
        input_topic, max_message_bytes = GENERATE_TOPIC, None

        def make_samples(s: int) -> Callable[[int], Sample]:
            return generate or generate_samples(s)
    else:
        spec = get_pipeline(pipeline, defined)
        input_topic, max_message_bytes, make_samples = spec.input_topic, spec.max_message_bytes, spec.make_samples
    topic = topic or input_topic
    schedule: Iterator[float]
    if camera is not None:
        if pipeline != "camera":
            raise UserError(f"camera options (--cameras, --fps, ...) apply to the camera pipeline, not {pipeline!r}")
        schedule, make = camera.plan(count, seed, start_index)
    elif requests:
        schedule = poisson_schedule(rate, count, seed)

        def make(i: int) -> Sample:
            return None, requests[(start_index + i) % len(requests)], []
    else:
        schedule = poisson_schedule(rate, count, seed)
        samples = make_samples(seed)

        def make(i: int) -> Sample:
            return samples(start_index + i)
    if spec is not None and records is None:
        records = records_format(str(spec.entry.get("codec", "")), None)
    if records is not None:
        if spec is None or encoding != "json":
            raise UserError(f"--format {records} applies to the JSON requests of a scoring pipeline")
        make = schema_records(spec, records, schema_registry, topic, make)
    elif encoding == "binary":
        make = _binary_ctr(pipeline, make)
    elif encoding != "json":
        raise UserError(f"unknown encoding {encoding!r}: expected json or binary")
    producer = load_producer(profile, bootstrap, kafka, max_message_bytes)
    warm_up_producer(producer, topic)
    errors: list[str] = []

    def on_delivery(err, _msg) -> None:
        if err is not None:
            errors.append(err.str())

    def send(i: int) -> None:
        key, value, headers = make(i)
        # When produce() was called, for a LogAppendTime input topic: the worker then
        # splits the produce leg (to_broker) off to_worker (consumers/records.py).
        stamped = [*(headers or ()), (H_PRODUCED_MS, str(wall_ms()).encode())]
        while True:
            try:
                producer.produce(topic, value=value, key=key, headers=stamped, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
        if on_sent:
            on_sent(i + 1)
        if progress and i and i % 1000 == 0 and sys.stderr.isatty():  # no \r lines in `docker logs`
            print(f"\rsent {i}/{count}", end="", file=sys.stderr, flush=True)

    sent, elapsed = run_open_loop(schedule, send, idle=lambda s: producer.poll(s), should_stop=should_stop)
    left = producer.flush(30)
    if progress and sys.stderr.isatty():
        print(file=sys.stderr)
    if left or errors:
        raise RuntimeError(f"{left} requests unacknowledged, {len(errors)} failed: {errors[:1]}")
    return sent, elapsed


def schema_records(spec: PipelineSpec, fmt: str, settings: SchemaRegistryConfig | None, topic: str,
                   make: Callable[[int], Sample]) -> Callable[[int], Sample]:
    """The same requests as schema-registry records of `topic` (pipeline/codecs/
    schema_records.py RecordWriter), their schema made from the pipeline's request
    fields, as its worker reads them, and registered under `<topic>-value`."""
    import orjson

    from pipeline.codecs.record_types import record_name
    from pipeline.extras import load
    from pipeline.registry.schema_settings import make_client

    RecordWriter = load("pipeline.codecs.schema_records", "registry", f"--format {fmt}").RecordWriter

    codec = spec.document_codec() if spec.document_codec is not None else None
    if codec is None or not hasattr(codec, "request_type"):
        raise UserError(f"--format {fmt}: pipeline {spec.name!r}'s requests have no document form "
                        "(ctr and tensor-json requests have)")
    if settings is None or settings.url is None:
        raise UserError(f"--format {fmt} needs --schema-registry URL (or schema_registry.url in the -c config)")
    writer = RecordWriter(fmt, codec.request_type(record_name(spec.name, "Request")), make_client(settings), topic)

    def make_record(i: int) -> Sample:
        key, value, headers = make(i)
        try:
            return key, writer(orjson.loads(value)), headers
        except orjson.JSONDecodeError:
            raise UserError(f"--format {fmt}: request {i} is not a JSON document") from None
        except Exception as exc:  # the registry's refusal (or none), a document the schema does not take
            text = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            raise UserError(f"--format {fmt}: request {i}: {text}") from None

    return make_record


def _binary_ctr(pipeline: str, make: Callable[[int], Sample]) -> Callable[[int], Sample]:
    """The same requests in the binary form (pipeline/codecs/ctr_binary.py)."""
    if pipeline != "ctr":
        raise UserError(f"--encoding binary applies to the ctr pipeline, not {pipeline!r}")
    from pipeline.codecs.ctr_binary import binary_samples

    return binary_samples(make)


@dataclass(frozen=True)
class CameraLoad:
    """K cameras, each sending `fps` frames/s (optionally along the day/night wave),
    keyed by camera id, frames rendered from the sample photographs."""

    cameras: int = 4
    fps: float = DEFAULT_FPS
    day_seconds: float | None = None
    resolutions: Sequence[tuple[int, int]] | None = None

    def plan(self, count: int, seed: int, start_index: int = 0) -> tuple[Iterator[float], Callable[[int], Sample]]:
        """(send times, i -> message) for the first `count` frames after start_index."""
        from pipeline.clock import wall_ms
        from pipeline.loadgen.camera import DEFAULT_DAY_SECONDS, CameraFrameFactory, camera_schedule

        try:
            events = camera_schedule(self.cameras, self.fps, start_index + count, self.day_seconds, seed)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        events = events[start_index:]
        t0 = events[0][0] if events else 0.0
        extra = {"resolutions": tuple(self.resolutions)} if self.resolutions else {}
        factory = CameraFrameFactory(
            seed=seed, cameras=self.cameras, day_seconds=self.day_seconds or DEFAULT_DAY_SECONDS,
            # capture_ts_ms: the real time a frame is due, so it reads as live video.
            start_ms=wall_ms() - round(t0 * 1000.0), **extra,
        )

        def make(i: int) -> Sample:
            t, camera_index, frame_index = events[i]
            key, value, headers = factory.make(camera_index, frame_index, t)
            return key, value, headers

        return iter([t - t0 for t, _, _ in events]), make


def warm_up_producer(producer: ProducerClient, topic: str, timeout: float = 10.0) -> None:
    """Connect and fetch metadata before the first timed request: otherwise the first
    requests carry the producer's start-up in their timestamps as if the pipeline
    were slow."""
    producer.list_topics(topic=None, timeout=timeout)
    producer.poll(0.2)  # idempotent producer id (InitProducerId) follows the connect


def topic_partitions(topic: str, have: int | None, asked: int | None, where: str) -> tuple[int | None, str | None]:
    """(partitions to create the topic with, or None: it exists; an info line or None).
    A topic that exists is sent to as it is, whoever made it (issue 44: an admin's
    3-partition topic was refused for not having the default 4); only an explicit
    --partitions that disagrees with it is an error."""
    if have is None:
        return (asked if asked is not None else DEFAULT_PARTITIONS), None
    if asked is not None and asked != have:
        raise UserError(
            f"topic {topic!r} already exists on {where} with {have} partitions, not {asked} (--partitions): "
            "leave --partitions out to send to it as it is (partitions cannot be changed in place)"
        )
    if have != DEFAULT_PARTITIONS and asked is None:
        return None, f"topic {topic!r} exists with {have} partitions: sending to it as it is"
    return None, None
