"""`tidebatch generate`: a text-generation worker (docs/GENERATION.md) with continuous,
static or no batching.

A command of its own rather than `tidebatch run --pipeline generate`: `run` is the
request-batching Worker, and its config (batching policies, buckets, executors) has
nothing a generation loop uses (pipeline/generation/service.py says why the loop
differs)."""

from __future__ import annotations

import argparse

from pipeline.commands.kafka_flags import add_broker_profile_flag, add_x_flag, kafka_block
from pipeline.generation.policies import POLICIES
from pipeline.observe import logs


def add_parser(sub: argparse._SubParsersAction) -> None:
    from pipeline.app.generation import GenerateService
    from pipeline.generation.service import GenerateSettings

    svc, st = GenerateService(), GenerateSettings()
    p = sub.add_parser(
        "generate", help="run a text-generation worker (continuous batching, docs/GENERATION.md)",
        description="Consume generate requests ({request_id, prompt, max_new_tokens, temperature?, stop?, "
        "deadline_ms?}), stream token chunks and one final record per request to the output topic, bad "
        "requests to <input>.dlq. Drives the shipped decoder (models/decoder/).",
    )
    p.add_argument("--bootstrap-servers", default=svc.bootstrap_servers, metavar="HOST:PORT",
                   help=f"Kafka brokers (default: {svc.bootstrap_servers})")
    add_broker_profile_flag(p, svc.broker_profile, svc.broker_profile)
    p.add_argument("--group-id", default=svc.group_id, help=f"consumer group (default: {svc.group_id})")
    p.add_argument("--input-topic", default=svc.input_topic, help=f"requests (default: {svc.input_topic})")
    p.add_argument("--output-topic", default=svc.output_topic,
                   help=f"chunks and final records (default: {svc.output_topic})")
    p.add_argument("--policy", choices=tuple(POLICIES), default=svc.policy,
                   help=f"none, static (request-level) or continuous (iteration-level; default: {svc.policy})")
    p.add_argument("--max-slots", type=int, default=svc.max_slots, metavar="N",
                   help=f"sequences decoded at once: the KV cache's rows (default: {svc.max_slots})")
    p.add_argument("--prefill-chunk", type=int, metavar="TOKENS",
                   help="prompt tokens prefilled per step across sequences (default: whole prompts)")
    p.add_argument("--chunk-tokens", type=int, default=st.chunk_tokens, metavar="N",
                   help=f"tokens per streamed chunk (default: {st.chunk_tokens})")
    p.add_argument("--flush-ms", type=float, default=st.flush_ms, metavar="MS",
                   help=f"send a smaller chunk once its oldest token waited this long (default: {st.flush_ms:g})")
    p.add_argument("--max-new-tokens", type=int, default=st.max_new_tokens, metavar="N",
                   help=f"the most tokens a request may ask for (default: {st.max_new_tokens})")
    p.add_argument("--deadline-ms", type=float, default=st.deadline_ms, metavar="MS",
                   help="admission budget of a request without its own deadline_ms, from its Kafka timestamp "
                   f"(default: {st.deadline_ms:g})")
    p.add_argument("--provider", default=svc.provider, help=f"ONNX Runtime provider: cpu, cuda, auto (default: {svc.provider})")
    p.add_argument("--partitions", type=int, default=svc.partitions,
                   help=f"partitions of topics it creates (default: {svc.partitions})")
    p.add_argument("--no-create-topics", action="store_true", help="do not create missing topics")
    p.add_argument("--metrics-host", default=svc.metrics_host, metavar="HOST",
                   help=f"where the ops endpoints listen (default: {svc.metrics_host})")
    p.add_argument("--metrics-port", type=int, default=svc.metrics_port, metavar="PORT",
                   help=f"/metrics, /healthz, /readyz, /api/stats and the dashboard; 0 picks a free port "
                   f"(default: {svc.metrics_port})")
    p.add_argument("--no-metrics", action="store_true", help="serve no ops endpoints")
    add_x_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pipeline.app.generation import GenerateService, serve_generate
    from pipeline.errors import UserError
    from pipeline.generation.service import GenerateSettings

    logs.configure(getattr(args, "log_level", "INFO"), getattr(args, "log_format", "text"))
    for name in ("max_slots", "chunk_tokens", "max_new_tokens", "partitions"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1")
    if args.prefill_chunk is not None and args.prefill_chunk < 1:
        raise UserError("--prefill-chunk must be >= 1")
    if not 0 <= args.metrics_port <= 65535:
        raise UserError("--metrics-port must be a TCP port (0 picks a free one)")
    settings = GenerateSettings(chunk_tokens=args.chunk_tokens, flush_ms=args.flush_ms,
                                max_new_tokens=args.max_new_tokens, deadline_ms=args.deadline_ms)
    svc = GenerateService(
        bootstrap_servers=args.bootstrap_servers, broker_profile=args.broker_profile, group_id=args.group_id,
        input_topic=args.input_topic, output_topic=args.output_topic, policy=args.policy,
        max_slots=args.max_slots, prefill_chunk=args.prefill_chunk, provider=args.provider,
        create_topics=not args.no_create_topics, partitions=args.partitions,
        metrics_port=None if args.no_metrics else args.metrics_port, metrics_host=args.metrics_host,
        kafka=kafka_block(args), settings=settings,
    )
    return serve_generate(svc)
