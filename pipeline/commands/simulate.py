"""`tidebatch simulate`: compare batching policies in the discrete-event simulator.

    tidebatch simulate --curve ctr --load 0.1,0.5,0.9 --scenario poisson
    tidebatch simulate --curve gpu-large --scenario burst --policies static-64,greedy,adaptive
    tidebatch simulate --curve ctr --scenario trace:arrivals.csv --json
    tidebatch simulate --workload generate --load 0.25,0.5,0.9

Replays the batching core (the worker's own Batcher and policies) on a fake clock
against an arrival scenario and a latency curve t(n) = a + b·n, and prints p50/p99/
p99.9 latency, throughput, goodput, batch size, SLO misses and outcome counts per
policy. pipeline/simulate/engine.py describes the model; docs/BATCHING.md the results.
With --workload generate it steps the generation scheduler instead
(pipeline/generation/simulate.py; docs/GENERATION.md): none / static / continuous
batching of text generation against a per-step cost curve.
"""

from __future__ import annotations

import argparse
import json

from pipeline.commands.arg_types import floats, names
from pipeline.simulate.specs import DEFAULT_POLICIES, SIM_LABELS


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "simulate",
        help="compare batching policies in the discrete-event simulator",
        description=(
            "Replay the batching core on a fake clock against an arrival scenario and a "
            "latency curve, and compare policies. Load is relative to the curve's "
            "capacity, max_batch_rows / t(max_batch_rows)."
        ),
    )
    parser.add_argument(
        "--workload", choices=("batch", "generate"), default="batch",
        help="batch: requests scored in batches (the worker's batching core); generate: "
             "text generation, none/static/continuous batching (default: batch)",
    )
    parser.add_argument(
        "--curve", default=None,
        help="shipped curve name (ctr, gpu-small, gpu-large; generation-assumed or the measured "
             "generation-decoder-tiny-cpu for --workload generate), a JSON curve file, or "
             "ab:A_MS:B_MS[:MAX_ROWS[:SLO_MS]] "
             "(default: ctr; generation-assumed)",
    )
    parser.add_argument(
        "--scenario", default="poisson",
        help="poisson, onoff[:ON_S:OFF_S], diurnal, burst (50%% load, 10 s at 150%%), "
             "overload (120%%), priorities (20%% high / 80%% low at 110%%), "
             "tenants[:FACTOR[:STEADY[:spiky]]] (three tenants at STEADY=0.3 of capacity, a fourth at "
             "FACTOR=2 times its 10%% share; spiky: steady-a sends its load in 100 ms spikes every 300 ms; "
             "with and without the tenant gate, first policy only), or trace:FILE (CSV/JSONL: time, rows[, priority, deadline]) (default: poisson)",
    )
    parser.add_argument(
        "--load", type=floats, default=None,
        help="loads for poisson/onoff/diurnal, comma-separated (default: 0.1,0.5,0.9; "
             "generate: 0.25,0.5,0.9, plus saturation)",
    )
    parser.add_argument(
        "--policies", type=names, default=None,
        help=f"comma-separated: {', '.join(SIM_LABELS)} (default: {','.join(DEFAULT_POLICIES)}); "
             "generate: none, static, continuous, continuous:CHUNK (default: none,static,continuous)",
    )
    parser.add_argument(
        "--tenant-slo", default=None, metavar="NAME=MS,...",
        help="tenants scenario: a tenant's own SLA (steady-a, steady-b, steady-c, burster); "
             "goodput is counted against it (default: the curve's budget for all)",
    )
    parser.add_argument(
        "--tenant-burst-ms", type=float, default=None, metavar="MS",
        help="tenants scenario: every class's bucket MS of its rate deep, as a class's burst_ms in the "
             "worker (default: its SLA)",
    )
    parser.add_argument("--duration", type=float, default=None,
                        help="simulated seconds (default: 10; burst 25; priorities 20; generate 60)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default: 1)")
    parser.add_argument("--rows", default=None,
                        help="rows per request: fixed:N, geometric:MEAN, lognormal:MEAN:SIGMA, "
                             "uniform:LO:HI, loguniform:LO:HI (default: lognormal:20:0.5, CTR requests)")
    parser.add_argument("--executors", type=int, default=1, help="executors (default: 1)")
    parser.add_argument("--noise", type=float, default=0.1,
                        help="sigma of the lognormal noise on service times (default: 0.1)")
    parser.add_argument("--decode-us", type=float, default=0.0,
                        help="source-thread microseconds per request (decode): polls of up to 1000 are decoded "
                             "one after another and queued together, as the worker does (default 0: free; "
                             "the JSON CTR codec costs ~76)")
    parser.add_argument("--shed-reserve", type=float, default=None,
                        help="with --decode-us, adaptive's admission reserve: the share of the budget a record "
                             "must have left when queued, or it is routed late undecoded (default 0.5, the "
                             "worker's; 0: route only the expired, as the worker did before)")
    parser.add_argument("--publish-us", type=float, default=0.0,
                        help="publisher-thread microseconds per result: a batch's results are handed over one "
                             "after another once the model is done, and the batcher's deadlines leave room for "
                             "that answer tail, as the worker's do (default 0: answered when the model ends)")
    parser.add_argument("--hop-ms", default=None, metavar="P50:P99",
                        help="the Kafka hop before the worker: each request arrives a lognormal delay with this "
                             "median and 99th percentile after it was produced; deadlines and latencies still "
                             "count from produce (a run's to_worker stage at low load; generate: the final records' "
                             "to_worker_ms; default: none)")
    parser.add_argument("--high-watermark", type=int, default=20_000,
                        help="rows in the in-time queue that pause consumption (default: 20000)")
    parser.add_argument("--low-watermark", type=int, default=None,
                        help="rows at which consumption resumes (default: half the high one)")
    gen = parser.add_argument_group("--workload generate")
    gen.add_argument("--prompt-tokens", default=None,
                     help="prompt tokens per request, a distribution as --rows (default: lognormal:128:0.6)")
    gen.add_argument("--output-tokens", default=None,
                     help="tokens until the stop token, a distribution as --rows (default: loguniform:8:256)")
    gen.add_argument("--max-new-tokens", type=int, default=None, help="per request (default: 256)")
    gen.add_argument("--no-saturation", action="store_true", help="leave out the saturation row")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from pipeline.errors import UserError

    if args.load is not None and any(x <= 0 for x in args.load):
        raise UserError("--load values must be > 0")
    if args.noise < 0:
        raise UserError("--noise must be >= 0")
    if args.workload == "generate":
        return run_generate(args)
    from pipeline.simulate.compare import compare
    from pipeline.simulate.curves import load_curve
    from pipeline.simulate.engine import SimConfig
    from pipeline.simulate.rows import DEFAULT_ROWS
    from pipeline.simulate.table import format_table

    if args.executors < 1:
        raise UserError("--executors must be >= 1")
    low = args.low_watermark
    if args.high_watermark < 1 or (low is not None and not 0 <= low < args.high_watermark):
        raise UserError("watermarks: need high >= 1 and 0 <= low < high")
    curve = load_curve(args.curve or "ctr")
    if args.decode_us < 0:
        raise UserError("--decode-us must be >= 0")
    if args.publish_us < 0:
        raise UserError("--publish-us must be >= 0")
    cfg = SimConfig(executors=args.executors, noise=args.noise, seed=args.seed,
                    high_watermark=args.high_watermark, low_watermark=low, decode_s=args.decode_us / 1e6,
                    publish_s=args.publish_us / 1e6)
    if args.shed_reserve is not None:
        if not 0.0 <= args.shed_reserve < 1.0:
            raise UserError("--shed-reserve must be in [0, 1)")
        cfg.shed_reserve = args.shed_reserve
    if args.scenario.split(":")[0] == "tenants":
        return _tenants(args, curve, cfg)
    comp = compare(
        curve,
        args.scenario,
        args.policies or list(DEFAULT_POLICIES),
        loads=args.load or [0.1, 0.5, 0.9],
        duration=args.duration,
        rows=args.rows or DEFAULT_ROWS,
        seed=args.seed,
        cfg=cfg,
        hop_ms=_hop(args.hop_ms),
    )
    if args.json:
        print(json.dumps(comp.to_dict(), indent=2))
        return 0
    slo = ", ".join(f"p{k}={v * 1e3:g} ms" for k, v in sorted(curve.slo.items()))
    print(
        f"curve {curve.name}: t(n) = {curve.a * 1e3:g} ms + {curve.b * 1e3:g} ms/row, "
        f"max {curve.max_batch_rows} rows, capacity {curve.capacity:,.0f} rows/s; SLO {slo}"
    )
    print(f"scenario {args.scenario}, seed {args.seed}, {args.executors} executor(s), noise {args.noise:g}")
    if comp.tuned:
        print(f"static-tuned (best p99 at 50% load, grid search): max_batch_rows={comp.tuned[0]}, "
              f"max_queue_delay={comp.tuned[1] * 1e3:g} ms")
    print(format_table(comp.results))
    print("latency = produce -> outcome (scored, or late-topic record); thru/good = scored/"
          "in-SLO rows per s over capacity; miss% = not answered in SLO")
    return 0


def _hop(text: str | None) -> tuple[float, float] | None:
    from pipeline.errors import UserError

    if text is None:
        return None
    try:
        p50, p99 = (float(x) for x in text.split(":"))
    except ValueError:
        raise UserError(f"--hop-ms: expected P50:P99 in ms, got {text!r}") from None
    return p50, p99


def run_generate(args: argparse.Namespace) -> int:
    from pipeline.errors import UserError
    from pipeline.generation import simulate as gen
    from pipeline.generation.cost import load_step_cost

    if args.scenario != "poisson":
        raise UserError("--workload generate runs Poisson arrivals only; leave out --scenario")
    if args.executors != 1:
        raise UserError("--workload generate simulates one decoder; leave out --executors")
    cost = load_step_cost(args.curve or "generation-assumed")
    max_new = gen.DEFAULT_MAX_NEW if args.max_new_tokens is None else args.max_new_tokens
    prompt, output = args.prompt_tokens or gen.DEFAULT_PROMPT, args.output_tokens or gen.DEFAULT_OUTPUT
    results = gen.compare_generation(
        cost,
        args.policies or list(gen.DEFAULT_POLICIES),
        loads=args.load or list(gen.DEFAULT_LOADS),
        saturation=not args.no_saturation,
        duration=gen.DEFAULT_DURATION if args.duration is None else args.duration,
        prompt=prompt,
        output=output,
        max_new_tokens=max_new,
        seed=args.seed,
        noise=args.noise,
        hop_ms=_hop(args.hop_ms),
    )
    if args.json:
        print(json.dumps({"curve": cost.to_dict(), "results": [r.to_dict() for r in results]}, indent=2))
        return 0
    print(
        f"generation curve {cost.name}{' (ASSUMED, not measured)' if cost.assumed else ''}: "
        f"t(step) = {cost.a * 1e3:g} ms + {cost.b * 1e3:g} ms/sequence + {cost.c * 1e3:g} ms/context token "
        f"+ {cost.p * 1e3:g} ms/prefill token; KV budget {cost.max_slots} slots, {cost.max_tokens} tokens"
    )
    hop = f"; Kafka hop {args.hop_ms} ms (p50:p99)" if args.hop_ms else ""
    print(f"prompts {prompt}, outputs {output}, max_new_tokens {max_new}, seed {args.seed}, noise {args.noise:g}{hop}; "
          f"load 1 = {gen.capacity_req_s(cost, prompt, output, max_new):.1f} "
          f"requests/s, saturation = {gen.SATURATION_LOAD:g}x")
    print(gen.format_generation_table(results))
    print("tokens/s = generated tokens per s of the arrival window; ttft = produce -> first token, "
          "lat = produce -> last token, over finished requests; itl = gap between a sequence's tokens; "
          "batch = sequences per decoding step")
    return 0


def _tenants(args: argparse.Namespace, curve, cfg) -> int:
    """The tenant scenario: one policy (the first given, default adaptive), three runs."""
    from pipeline.simulate.rows import DEFAULT_ROWS
    from pipeline.simulate.tenants import compare_tenants, format_tenant_table, parse_tenant_slo

    policy = args.policies[0] if args.policies else "adaptive"
    comp = compare_tenants(curve, args.scenario, policy=policy, duration=args.duration,
                           rows=args.rows or DEFAULT_ROWS, seed=args.seed, cfg=cfg,
                           slo=parse_tenant_slo(args.tenant_slo),
                           burst_s=args.tenant_burst_ms / 1000.0 if args.tenant_burst_ms is not None else None)
    if args.json:
        print(json.dumps(comp.to_dict(), indent=2))
        return 0
    print(f"curve {curve.name}: capacity {curve.capacity:,.0f} rows/s; SLO {curve.budget(0) * 1e3:g} ms; "
          f"policy {policy}; scenario {comp.scenario}, seed {args.seed}"
          + (f"; buckets {args.tenant_burst_ms:g} ms of each class's rate" if args.tenant_burst_ms is not None else ""))
    print(format_tenant_table(comp))
    print("single: one tenant at the same total load; shared: one queue for all tenants; tenants: "
          "the tenant gate (pipeline/batching/tenants.py). offered, good/cap: rows/s over capacity; "
          "goodput%: the tenant's rows answered within its own SLA (sla_ms); mixed%: batches with several tenants")
    return 0
