"""`tidebatch produce PIPELINE`: a load generator with Poisson arrivals and realistic
request contents (no model needed)."""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

from consumers.admin import ensure_topics, existing_topics
from consumers.kafka_reachable import DEFAULT_TIMEOUT_S, require_kafka
from pipeline.app.produce import (
    DEFAULT_FPS,
    DEFAULT_PARTITIONS,
    CameraLoad,
    produce,
    topic_partitions,
)
from pipeline.commands.kafka_flags import (
    add_broker_profile_flag,
    add_x_flag,
    connect_timeout_help,
    kafka_block,
)
from pipeline.completion.parser_tree import OpenSubcommands
from pipeline.errors import UserError
from pipeline.loadgen.generate import DEFAULT_OUTPUT as GENERATE_OUTPUT
from pipeline.loadgen.generate import INPUT_TOPIC as GENERATE_TOPIC
from pipeline.loadgen.generate import generate_samples
from pipeline.registry.pipelines import get_pipeline, shipped_names
from pipeline.registry.schema_settings import (
    FORMATS,
    SchemaRegistryConfig,
    validate_schema_registry,
)

DEFAULT_RATE = 500.0

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
    _add_format(ctr)
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
    _add_format(own)
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
    add_broker_profile_flag(p, "kafka", "kafka")
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


def _add_format(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format", choices=FORMATS, dest="records",
        help="send the requests as schema-registry records (Confluent wire format), their schema registered "
        "under <topic>-value (docs/SCHEMA_REGISTRY.md; default: JSON, or the pipeline's codec if it is one of these)",
    )
    p.add_argument(
        "--schema-registry", metavar="URL",
        help="the schema registry for --format (default: the -c config's schema_registry.url)",
    )


def _registry(args: argparse.Namespace, cfg: Any) -> SchemaRegistryConfig | None:
    """The -c config's `schema_registry:` section (auth, TLS), its URL replaced by
    --schema-registry; None when neither names a registry."""
    from dataclasses import replace

    settings = getattr(cfg, "schema_registry", None) or SchemaRegistryConfig()
    url = getattr(args, "schema_registry", None)
    if url is not None:
        settings = replace(settings, url=url)
        validate_schema_registry(settings, "", args.pipeline, lambda key, reason: UserError(
            f"--schema-registry: {reason}" if key == "schema_registry.url" else f"{key}: {reason}"))
    return settings if settings.url is not None else None


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


def run(args: argparse.Namespace) -> int:
    defined: list[dict[str, Any]] = []
    config = getattr(args, "config", None)  # only a pipeline of one's own takes -c
    cfg = None
    if config:
        from pipeline.config import load_config

        cfg = load_config(config, {"pipeline": args.pipeline})
        defined = cfg.pipelines
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
        generate=generate, records=getattr(args, "records", None), schema_registry=_registry(args, cfg),
    )
    elapsed = time.monotonic() - t0
    print(f"sent {sent} {args.pipeline} requests to {topic} in {elapsed:.1f} s ({sent / elapsed:.1f}/s)")
    return 0


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
