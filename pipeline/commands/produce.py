"""`tidebatch produce PIPELINE`: a load generator with Poisson arrivals and realistic
request contents (no model needed)."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Producer

from consumers.admin import ensure_topics, existing_topics
from consumers.kafka_reachable import DEFAULT_TIMEOUT_S, require_kafka
from consumers.profiles import producer_config
from consumers.records import H_PRODUCED_MS
from pipeline.clock import wall_ms
from pipeline.commands.kafka_flags import add_x_flag, connect_timeout_help, kafka_block
from pipeline.commands.parser_tree import OpenSubcommands
from pipeline.errors import UserError
from pipeline.loadgen.generate import DEFAULT_OUTPUT as GENERATE_OUTPUT
from pipeline.loadgen.generate import INPUT_TOPIC as GENERATE_TOPIC
from pipeline.loadgen.generate import generate_samples
from pipeline.loadgen.pacing import poisson_schedule, run_open_loop
from pipeline.registry.pipelines import Sample, get_pipeline, shipped_names

DEFAULT_RATE = 500.0
DEFAULT_FPS = 5.0
DEFAULT_PARTITIONS = 4

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "produce", help="generate requests to a Kafka topic (Poisson arrivals)",
        description="Send requests of one pipeline to its input topic at a Poisson rate. Each shipped "
        "pipeline has its own flags (`tidebatch produce ctr --help`); any other NAME is a pipeline "
        "defined under a config's `pipelines:`, given with -c (docs/OWN_MODEL.md).",
    )
    kinds = p.add_subparsers(dest="pipeline", required=True, metavar="PIPELINE", action=OpenSubcommands)
    ctr = kinds.add_parser("ctr", help="click-through-rate requests (JSON or binary)", description=_CTR)
    _add_common(ctr, _POISSON_RATE)
    _add_file(ctr)
    ctr.add_argument(
        "--encoding", choices=("json", "binary"), default="json",
        help="the JSON form or the binary form, 4-5x cheaper to decode (docs/schemas/ctr_request.md; default json)",
    )
    cam = kinds.add_parser("camera", help="JPEG frames of K cameras, keyed by camera", description=_CAMERA)
    _add_common(cam, "frames per second of all cameras together, split evenly over them (default: see --fps)",
                count="frames to send, of all cameras together (default 10000)")
    _add_camera(cam)
    text = kinds.add_parser("text", help="texts to embed (product reviews, chat lines)", description=_TEXT)
    _add_common(text, _POISSON_RATE)
    _add_file(text)
    gen = kinds.add_parser("generate", help="text-generation requests for `tidebatch generate`", description=_GENERATE)
    _add_common(gen, _POISSON_RATE)
    _add_file(gen)
    gen.add_argument(
        "--output-tokens", default=GENERATE_OUTPUT, metavar="DIST",
        help="max_new_tokens of each request: fixed:N, uniform:LO:HI, loguniform:LO:HI, lognormal:MEAN:SIGMA "
        f"(default {GENERATE_OUTPUT}; the worker refuses more than its --max-new-tokens, 200 by default)",
    )
    gen.add_argument("--deadline-ms", type=int, metavar="MS",
                     help="each request's deadline_ms (default: none, the worker's --deadline-ms)")
    own = kinds.add_fallback(
        help="a pipeline of your own, defined under the -c config's `pipelines:` (docs/OWN_MODEL.md)",
        description=_OWN,
    )
    own.add_argument(
        "-c", "--config", metavar="FILE",
        help="worker config whose `pipelines:` define NAME (docs/OWN_MODEL.md)",
    )
    _add_common(own, _POISSON_RATE)
    _add_file(own)
    p.set_defaults(func=run)


_POISSON_RATE = f"requests per second, Poisson (default {DEFAULT_RATE:g})"
_CTR = "CTR requests: a user and 20 candidate items each (docs/schemas/ctr_request.md), Poisson arrivals."
_CAMERA = (
    "Frames of K cameras, each at its own fixed frame rate (optionally along a day/night wave), "
    "keyed by camera id and rendered from the sample photographs."
)
_TEXT = "Texts to embed with MiniLM: product reviews and chat lines, Poisson arrivals."
_GENERATE = (
    "Generate requests ({request_id, prompt, max_new_tokens}) for `tidebatch generate` "
    "(docs/GENERATION.md): chat lines as prompts, max_new_tokens drawn from --output-tokens, "
    "keyed by request_id; Poisson arrivals."
)
_OWN = (
    "Requests of a pipeline of your own, defined under a config's `pipelines:` "
    "(docs/OWN_MODEL.md): its sample requests, or --file's lines."
)


def _add_common(p: argparse.ArgumentParser, rate: str, count: str | None = None) -> None:
    """The flags of every pipeline's load generator: where to send, how many, how fast."""
    p.add_argument("--bootstrap-servers", required=True, metavar="HOST:PORT", help="Kafka brokers to send to (required)")
    p.add_argument("--topic", help="topic to send to (default: the pipeline's input topic)")
    p.add_argument(
        "--partitions", type=int, metavar="N",
        help=f"partitions if the topic is created (default {DEFAULT_PARTITIONS}); an existing topic is used as it is",
    )
    p.add_argument("--rate", type=float, help=rate)
    p.add_argument("--count", type=int, help=count or "requests to send (default 10000, or the --file's lines)")
    p.add_argument("--seed", type=int, default=1, help="seed of the arrival times and request contents (default 1)")
    p.add_argument(
        "--broker-profile", default="kafka", choices=("kafka", "embedded"),
        help="kafka, or embedded: the embedded broker's client settings (docs/BROKERS.md; default kafka)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress line on stderr (shown only on a terminal anyway)")
    p.add_argument(
        "--connect-timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
        help=connect_timeout_help(f"default {DEFAULT_TIMEOUT_S:g}"),
    )
    add_x_flag(p)


def _add_file(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--file", metavar="JSONL",
        help="send these requests, one per line, round robin, instead of generated ones (default: generated)",
    )


def _add_camera(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cameras", type=int, default=4, help="cameras sending frames, one key each (default 4)")
    p.add_argument(
        "--fps", type=float,
        help=f"frames per second of EACH camera, at a fixed frame rate (default: --rate split over the cameras, else {DEFAULT_FPS:g})",
    )
    p.add_argument(
        "--day-seconds", type=float, metavar="SECONDS",
        help="follow a day/night wave of this period: --fps at noon, a tenth of it at midnight, t = 0 is midnight "
        "(default: no wave)",
    )
    p.add_argument(
        "--resolutions", metavar="WxH[,WxH...]",
        help="frame sizes given to the cameras round robin (default 640x480,1280x720,320x240,1920x1080)",
    )


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
) -> tuple[int, float]:
    """Send `count` requests at `rate`/s (Poisson), or, for the camera pipeline with
    `camera` given, `count` frames of camera.cameras cameras at their own frame rate;
    returns (sent, seconds). Flushes at the end. `kafka`: the producer's settings
    (KafkaOverrides.client("producer")). `defined`: the config's `pipelines` entries;
    `requests`: request values to send round robin instead of generated ones.
    `generate`: i -> request of the generate pipeline (pipeline/loadgen/generate.py),
    which is no scoring pipeline of the registry (pipeline/registry/pipelines.py)."""
    make_samples: Callable[[int], Callable[[int], Sample]]
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
    if encoding == "binary":
        make = _binary_ctr(pipeline, make)
    elif encoding != "json":
        raise UserError(f"unknown encoding {encoding!r}: expected json or binary")
    from consumers.profiles import large_message_overrides

    large = large_message_overrides(max_message_bytes).producer if max_message_bytes else None
    producer = Producer(producer_config(profile, bootstrap, {**(large or {}), **(kafka or {})}))
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


def _binary_ctr(pipeline: str, make: Callable[[int], Sample]) -> Callable[[int], Sample]:
    """The same requests in the binary form (pipeline/codecs/ctr_binary.py)."""
    if pipeline != "ctr":
        raise UserError(f"--encoding binary applies to the ctr pipeline, not {pipeline!r}")
    import orjson

    from pipeline.codecs.ctr_binary import encode

    def make_binary(i: int) -> Sample:
        key, value, headers = make(i)
        return key, encode(orjson.loads(value)), headers

    return make_binary


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


def warm_up_producer(producer: Producer, topic: str, timeout: float = 10.0) -> None:
    """Connect and fetch metadata before the first timed request: otherwise the first
    requests carry the producer's start-up in their timestamps as if the pipeline
    were slow."""
    producer.list_topics(topic=None, timeout=timeout)
    producer.poll(0.2)  # idempotent producer id (InitProducerId) follows the connect


def run(args: argparse.Namespace) -> int:
    defined: list[dict[str, Any]] = []
    config = getattr(args, "config", None)  # only a pipeline of one's own takes -c
    if config:
        from pipeline.config import load_config

        defined = load_config(config, {"pipeline": args.pipeline}).pipelines
    elif args.pipeline not in (*shipped_names(), "generate"):
        raise UserError(
            f"unknown pipeline {args.pipeline!r}: the shipped ones are "
            f"{', '.join(sorted([*shipped_names(), 'generate']))}; "
            "one of your own needs -c CONFIG, whose `pipelines:` define it (docs/OWN_MODEL.md)"
        )
    generate = None
    if args.pipeline == "generate":
        if args.deadline_ms is not None and args.deadline_ms < 1:
            raise UserError("--deadline-ms must be >= 1")
        generate = generate_samples(args.seed, args.output_tokens, deadline_ms=args.deadline_ms)
        input_topic = GENERATE_TOPIC
    else:
        input_topic = get_pipeline(args.pipeline, defined).input_topic
    requests = None
    if getattr(args, "file", None):  # not camera's: its requests are images
        from pathlib import Path

        from pipeline.registry.user_pipelines import request_lines

        requests = request_lines(Path(args.file), f"--file {args.file}")
    count = args.count if args.count is not None else (len(requests) if requests else 10_000)
    topic = args.topic or input_topic
    camera = _camera_load(args) if args.pipeline == "camera" else None
    if args.connect_timeout <= 0:
        raise UserError("--connect-timeout must be > 0")
    kafka = kafka_block(args)
    require_kafka(args.bootstrap_servers, args.connect_timeout, kafka.client("admin"))
    if args.partitions is not None and args.partitions < 1:
        raise UserError("--partitions must be >= 1")
    have = existing_topics(args.bootstrap_servers, admin_config=kafka.client("admin")).get(topic)
    create, note = topic_partitions(topic, have, args.partitions, args.bootstrap_servers)
    if note:
        log.info(note)
    if create is not None:
        ensure_topics(args.bootstrap_servers, {topic: create}, admin_config=kafka.client("admin"))
    t0 = time.monotonic()
    sent, _ = produce(
        args.bootstrap_servers, args.pipeline, args.rate or DEFAULT_RATE, count,
        topic=topic, seed=args.seed, profile=args.broker_profile, progress=not args.quiet, camera=camera,
        encoding=getattr(args, "encoding", "json"), kafka=kafka.client("producer"), defined=defined, requests=requests,
        generate=generate,
    )
    elapsed = time.monotonic() - t0
    print(f"sent {sent} {args.pipeline} requests to {topic} in {elapsed:.1f} s ({sent / elapsed:.1f}/s)")
    return 0


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


def _camera_load(args: argparse.Namespace) -> CameraLoad:
    from pipeline.loadgen.camera import parse_resolutions

    if args.cameras < 1:
        raise UserError("--cameras must be >= 1")
    fps = args.fps if args.fps is not None else (args.rate / args.cameras if args.rate else DEFAULT_FPS)
    if fps <= 0:
        raise UserError("--fps must be > 0")
    if args.day_seconds is not None and args.day_seconds <= 0:
        raise UserError("--day-seconds must be > 0")
    try:
        resolutions = parse_resolutions(args.resolutions) if args.resolutions else None
    except ValueError as exc:
        raise UserError(f"--resolutions: {exc}") from None
    return CameraLoad(args.cameras, fps, args.day_seconds, resolutions)
