"""`tidebatch demo`: broker + worker + load generator on this machine, then a summary."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipeline.batching.registry import POLICY_NAMES


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the CTR pipeline end to end on the embedded broker")
    p.add_argument("--duration", type=float, default=15.0, help="seconds of load (default 15)")
    # 200: well inside the embedded broker's live capacity (~500 req/s on 2 cores, issue 26);
    # at 400, 17-265 of 6000 requests were late in 4 runs, at 200 none in 2 (p99 61 ms).
    p.add_argument("--rate", type=float, default=200.0, help="requests per second (default 200)")
    p.add_argument("--policy", default="adaptive", choices=POLICY_NAMES, help="batching policy (default adaptive)")
    p.add_argument("--partitions", type=int, default=2, help="partitions of the request topic (default 2)")
    p.add_argument("--out", default="out/demo", help="where logs and the summary go (default out/demo)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument(
        "--delivery", default="at_least_once", choices=("at_least_once", "exactly_once"),
        help="exactly_once is refused here: the embedded broker cannot do it (docs/DELIVERY.md; default at_least_once)",
    )
    p.set_defaults(func=run)


EMBEDDED_NO_EXACTLY_ONCE = (
    "--delivery exactly_once needs Apache Kafka: the embedded broker (Tansu) shows aborted "
    "transactions to read_committed readers; run `tidebatch run --delivery exactly_once` "
    "against a Kafka cluster instead (docs/DELIVERY.md)"
)


def run(args: argparse.Namespace) -> int:
    from pipeline.app.demo import format_summary, run_demo
    from pipeline.errors import UserError

    if args.delivery == "exactly_once":
        raise UserError(EMBEDDED_NO_EXACTLY_ONCE)

    summary = run_demo(
        duration=args.duration, rate=args.rate, policy=args.policy,
        partitions=args.partitions, out_dir=Path(args.out), json_output=args.json,
    )
    if args.json:
        print(json.dumps(summary))
    else:
        print(format_summary(summary))
    ok = summary["missing"] == 0 and summary["worker_exit_code"] == 0
    return 0 if ok else 1
