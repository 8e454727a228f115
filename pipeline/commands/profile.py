"""`tidebatch profile`: measure a pipeline's model on this machine over batch sizes,
intra-op threads and executors, fit t(n) = a + b·n per configuration, and write a
curve file for `tidebatch simulate --curve FILE` and a recommended worker config.

    tidebatch profile ctr --quick
    tidebatch profile my-ranker -c my-ranker.yaml --seconds 60 --load 0.1,0.5,0.9
    tidebatch profile generate [--max-slots 16] [--provider cpu] [--gathered]

pipeline/profiling/ does the work; docs/OWN_MODEL.md, "Profiling", reads its output.
`profile generate` is the generate worker's decoder instead: its per-step cost curve
(pipeline/generation/profile.py; docs/GENERATION.md, "Profiling the decoder").
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.commands.arg_types import floats, names
from pipeline.commands.kafka_flags import add_broker_profile_flag

if TYPE_CHECKING:
    from pipeline.config import WorkerConfig
    from pipeline.profiling.measure import Calibration

QUICK_SECONDS = 2.0
GENERATE_SECONDS = 5.0  # profile generate: the grid's rounds fit in a few seconds
GENERATE_QUICK_SECONDS = 1.0
GENERATE_FLAGS = ("max_slots", "provider", "gathered", "sequences", "prompt_tokens", "decode_steps")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile",
        help="measure a pipeline's model here and recommend a worker config",
        description=(
            "Time the pipeline's model on its own sample requests over batch sizes, ONNX "
            "Runtime intra-op threads and executors (in-process, model process); fit "
            "t(n) = a + b·n per configuration; write the best one's curve (for `tidebatch "
            "simulate --curve FILE`) and a worker config; predict capacity and latency."
        ),
    )
    p.add_argument("pipeline", metavar="PIPELINE",
                   help="ctr, camera, text, or one under the --config's `pipelines:`; generate: the generate "
                        "worker's decoder (its per-step cost curve)")
    p.add_argument("-c", "--config", help="worker config: its `pipelines:`, `batching` (SLO) and `runtime.providers`")
    p.add_argument("--seconds", type=float, default=None,
                   help=f"measuring time for all configurations (default: 30; generate: {GENERATE_SECONDS:g})")
    p.add_argument("--quick", action="store_true",
                   help=f"a rough profile in a few seconds: {QUICK_SECONDS:g} s, one intra-op thread, fewer repeats")
    p.add_argument("--threads", type=floats, default=None,
                   help="intra-op thread counts, comma-separated (default: 1 to the cores this process may use)")
    p.add_argument("--executors", type=names, default=None,
                   help="in-process, model-process, comma-separated (default: both)")
    p.add_argument("--load", type=floats, default=[0.1, 0.5, 0.9],
                   help="loads to predict, relative to the predicted capacity (default: 0.1,0.5,0.9)")
    p.add_argument("--policy", default=None, help="batching policy to simulate and recommend (default: the config's)")
    p.add_argument("-o", "--out", default=None, help="folder for curve.json and worker.yaml (default: out/profile/PIPELINE)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--encoding", choices=("json", "binary"), default="json",
                   help="ctr: the sample requests in the JSON form or the binary form (docs/schemas/ctr_request.md; "
                        "default json)")
    p.add_argument("--bootstrap-servers", default=None,
                   help="a Kafka broker to calibrate on: a worker drains the sample requests through scratch topics "
                        "there, and each thread's CPU per request, Kafka work included, enters the prediction "
                        "(default: none; the prediction is then an upper bound)")
    add_broker_profile_flag(p, None, "the config's broker_profile", what="the calibration broker's client settings")
    p.add_argument("--embedded-broker", action="store_true",
                   help="calibrate on an embedded broker started for it on this machine (its CPU counted: it "
                        "shares the cores)")
    p.add_argument("--calibration-requests", type=int, default=20_000,
                   help="requests the calibration drains (default: 20000)")
    gen = p.add_argument_group("PIPELINE generate (the decoder of `tidebatch generate`)")
    gen.add_argument("--max-slots", type=int, default=None, metavar="N",
                     help="the worker's KV slots: the most sequences a step decodes (default: 16)")
    gen.add_argument("--provider", default=None,
                     help="ONNX Runtime provider, as `tidebatch generate --provider` (default: cpu)")
    gen.add_argument("--gathered", action="store_true",
                     help="measure the gathered fallback's decoding steps even where in-place decoding is available")
    gen.add_argument("--sequences", type=floats, default=None,
                     help="sequences per measured step, comma-separated (default: 1,4,16, capped at --max-slots)")
    gen.add_argument("--prompt-tokens", type=floats, default=None,
                     help="prompt tokens per sequence, comma-separated (default: 16,96,192)")
    gen.add_argument("--decode-steps", type=int, default=None,
                     help="decoding steps per grid cell (default: 8)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pipeline.config import WorkerConfig, load_config
    from pipeline.errors import UserError
    from pipeline.profiling.measure import default_settings, run_profile
    from pipeline.profiling.report import report_dict, report_text, write_outputs
    from pipeline.profiling.sweep import EXECUTORS
    from pipeline.registry.pipelines import get_pipeline

    if args.pipeline == "generate":
        return run_generate(args)
    given = [f for f in GENERATE_FLAGS if getattr(args, f) not in (None, False)]
    if given:
        raise UserError(f"--{given[0].replace('_', '-')} is for `tidebatch profile generate` only")
    cfg = load_config(args.config, {"pipeline": args.pipeline}) if args.config else WorkerConfig(pipeline=args.pipeline)
    spec = get_pipeline(args.pipeline, cfg.pipelines)
    if args.encoding == "binary":
        if spec.name != "ctr":
            raise UserError(f"--encoding binary applies to the ctr pipeline, not {spec.name!r}")
        from dataclasses import replace

        from pipeline.codecs.ctr_binary import binary_samples

        make = spec.make_samples
        spec = replace(spec, make_samples=lambda seed: binary_samples(make(seed)))
    executors = args.executors or list(EXECUTORS)
    unknown = [e for e in executors if e not in EXECUTORS]
    if unknown:
        raise UserError(f"unknown executor {unknown[0]!r}; use {', '.join(EXECUTORS)}")
    threads = args.threads or ([1] if args.quick else None)
    if threads and any(t < 1 or t != int(t) for t in threads):
        raise UserError("--threads must be whole numbers >= 1")
    if args.seconds is None:
        args.seconds = 30.0
    if args.seconds <= 0 or any(x <= 0 for x in args.load):
        raise UserError("--seconds and --load values must be > 0")
    if args.policy:
        from pipeline.batching.registry import POLICY_NAMES

        if args.policy not in POLICY_NAMES:
            raise UserError(f"unknown policy {args.policy!r}; use {', '.join(POLICY_NAMES)}")
    if args.calibration_requests < 100:
        raise UserError("--calibration-requests must be >= 100")
    if args.embedded_broker and args.bootstrap_servers:
        raise UserError("--embedded-broker or --bootstrap-servers, not both")
    settings = default_settings(threads=[int(t) for t in threads] if threads else None, executors=executors)
    seconds = QUICK_SECONDS if args.quick else args.seconds
    say = (lambda line: None) if args.json else (lambda line: print(line, flush=True))
    with calibration_broker(args, cfg) as calibration:
        profile = run_profile(spec, cfg, settings, seconds=seconds, loads=args.load, policy=args.policy,
                              quick=args.quick, progress=say, calibration=calibration)
    out = Path(args.out or Path("out") / "profile" / spec.name)
    curve_path, config_path = write_outputs(profile, out, cfg)
    if args.json:
        print(json.dumps({**report_dict(profile), "curve_file": str(curve_path),
                          "config_file": str(config_path)}, indent=2))
    else:
        print(report_text(profile, curve_path, config_path, cfg))
    return 0


def run_generate(args: argparse.Namespace) -> int:
    """`tidebatch profile generate`: the decoder's per-step cost curve, written as a
    "kind": "generation" curve file for `tidebatch simulate --workload generate`."""
    from pipeline.errors import UserError
    from pipeline.generation.profile import Grid, profile_decoder
    from pipeline.generation.service import GenerateSettings

    if args.config or args.bootstrap_servers or args.embedded_broker or args.policy or args.threads \
            or args.executors:
        raise UserError("profile generate measures the decoder's steps alone: leave out -c, --policy, --threads, "
                        "--executors and the calibration broker")
    slots = 16 if args.max_slots is None else args.max_slots
    provider = args.provider or "cpu"
    if slots < 1 or (args.decode_steps is not None and args.decode_steps < 1):
        raise UserError("--max-slots and --decode-steps must be >= 1")
    seconds = args.seconds if args.seconds is not None else (
        GENERATE_QUICK_SECONDS if args.quick else GENERATE_SECONDS)
    if seconds <= 0:
        raise UserError("--seconds must be > 0")
    default = Grid()
    ints = {}
    for flag, given, fallback in (("--sequences", args.sequences, default.batches),
                                  ("--prompt-tokens", args.prompt_tokens, default.prompts)):
        if given is not None and any(x != int(x) for x in given):
            raise UserError(f"{flag} must be whole numbers")
        ints[flag] = tuple(int(x) for x in given) if given else fallback
    grid = Grid(ints["--sequences"], ints["--prompt-tokens"],
                default.steps if args.decode_steps is None else args.decode_steps)
    say = (lambda line: None) if args.json else (lambda line: print(line, flush=True))
    say(f"profiling the generate worker's decoder: {slots} KV slots, provider {provider}, "
        f"about {seconds:g} s")
    profile, doc = profile_decoder(provider=provider, slots=slots, gathered=args.gathered, grid=grid,
                                   seconds=seconds, min_rounds=1 if args.quick else 3,
                                   deadline_ms=GenerateSettings().deadline_ms)
    out = Path(args.out or Path("out") / "profile" / "generate")
    out.mkdir(parents=True, exist_ok=True)
    curve_path = out / "curve.json"
    curve_path.write_text(json.dumps(doc, indent=2) + "\n")
    if args.json:
        print(json.dumps({**doc, "curve_file": str(curve_path)}, indent=2))
        return 0
    print(f"decoding steps {profile.decoding}; {profile.steps} steps in {profile.rounds} rounds, "
          f"{profile.seconds:.1f} s; per cell, its steps' ms (each step's median over the rounds), measured and "
          f"fitted:")
    print(f"{'policy':<10}  {'sequences':>9}  {'prompt':>6}  {'steps':>5}  {'ms':>8}  {'fitted':>8}")
    for c in doc["fit"]["cells"]:
        print(f"{c['policy']:<10}  {c['sequences']:>9}  {c['prompt_tokens']:>6}  {c['steps']:>5}  {c['ms']:>8.2f}  "
              f"{c['fitted_ms']:>8.2f}")
    held = f" (held at 0: {', '.join(profile.fit.dropped)})" if profile.fit.dropped else ""
    print(f"t(step) = {doc['step_ms']:.3f} ms + {doc['ms_per_sequence']:.4f} ms/sequence + "
          f"{doc['ms_per_context_token']:.6f} ms/context token + {doc['prefill_ms_per_token']:.4f} ms/prefill token"
          f"{held}")
    print(f"curve: {curve_path}  (tidebatch simulate --workload generate --curve {curve_path})")
    return 0


@contextmanager
def calibration_broker(args: argparse.Namespace, cfg: WorkerConfig) -> Iterator[Calibration | None]:
    """Where to calibrate: the given broker, an embedded one started here (stopped
    after), or none."""
    from pipeline.profiling.measure import Calibration

    if args.embedded_broker:
        from consumers.brokers.embedded import EmbeddedBroker

        with EmbeddedBroker() as broker:
            pid = broker.pid
            yield Calibration(broker.bootstrap_servers, "embedded", args.calibration_requests,
                              (pid,) if pid else ())
        return
    if args.bootstrap_servers:
        from consumers.kafka_reachable import require_kafka

        # Before minutes of measuring: a broker out of reach is one line at once.
        require_kafka(args.bootstrap_servers, cfg.kafka_connect_timeout_s, cfg.kafka.client("admin"))
        yield Calibration(args.bootstrap_servers, args.broker_profile or cfg.broker_profile, args.calibration_requests)
        return
    yield None
