"""`tidebatch status`: is each pipeline healthy right now?

    tidebatch status http://127.0.0.1:9400 http://127.0.0.1:9401   # workers' metrics URLs
    tidebatch status --prometheus http://prometheus:9090             # or ask Prometheus
    tidebatch status https://worker-0:9400 --ca-file ca.crt --token '${OPS_TOKEN}'

Per pipeline it prints throughput, p99 end-to-end latency against the SLO, mean batch
size, consumer lag and a verdict; with tenant classes (a `tenants:` section), per class
its rate, share used and served, goodput, p99 against its SLA and the rows throttled
over its share and ceiling (pipeline/ops/tenant_stats.py):

    OK        serving, p99 within the SLO, lag not growing
    DEGRADED  p99 over the SLO (the pipeline's, or a tenant class's own), or lag growing
    DOWN      no worker answers, none is ready, or no partition is consumed

From workers it scrapes every /metrics twice, --interval seconds apart, and derives
rates and quantiles from the difference (pipeline/ops/stats.py, the arithmetic of the
dashboard). From Prometheus it asks the equivalent PromQL over --window. Exit code 0
when every pipeline is OK, 1 otherwise; 2 when the credentials or the CA given do not
fit (pipeline/ops/http_client.py), so a wrong password never reads as a DOWN worker.
"""

from __future__ import annotations

import argparse
import json

from pipeline.errors import UserError
from pipeline.ops.http_client import OpsClient
from pipeline.ops.status_report import format_report, from_prometheus, from_workers, metrics_url


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "status",
        help="per-pipeline health from worker metrics URLs or Prometheus",
        description="Throughput, p99 vs SLO, batch size, lag and a verdict (OK / DEGRADED / DOWN) per pipeline.",
    )
    p.add_argument("urls", nargs="*", metavar="URL",
                   help="worker metrics URLs (http[s]://host:port or http[s]://host:port/metrics)")
    p.add_argument("--prometheus", metavar="URL", help="ask this Prometheus instead of the workers")
    p.add_argument("--job", default="tidebatch-worker", help="Prometheus job of the workers (default: tidebatch-worker)")
    p.add_argument("--window", default="1m", help="PromQL range for rates and quantiles (default: 1m)")
    p.add_argument("--interval", type=float, default=2.0,
                   help="seconds between the two scrapes of each worker (default: 2)")
    p.add_argument("--lag-min", type=float, default=100.0,
                   help="lag (messages) below which growth is noise (default: 100)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    creds = p.add_argument_group(
        "credentials", "for workers with metrics.auth (protect_metrics) or metrics.tls, or a Prometheus behind "
        "auth; a secret may be '${VAR}' (quoted) or @file:/path, which `ps` does not show")
    creds.add_argument("--username", help="basic auth user")
    creds.add_argument("--password", help="basic auth password")
    creds.add_argument("--token", help="bearer token")
    creds.add_argument("--ca-file", metavar="PEM", help="CA certificate(s) to trust for https:// URLs")
    creds.add_argument("--cert-file", metavar="PEM", help="client certificate, for workers with metrics.tls.client_ca_file")
    creds.add_argument("--key-file", metavar="PEM", help="the client certificate's key (unencrypted)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    if bool(args.urls) == bool(args.prometheus):
        raise UserError("give worker metrics URLs or --prometheus URL (one of them)")
    client = OpsClient.from_options(args.username, args.password, args.token, args.ca_file,
                                    args.cert_file, args.key_file)
    if args.prometheus:
        report = from_prometheus(args.prometheus, args.job, args.window, args.lag_min, client)
    else:
        report = from_workers([metrics_url(u) for u in args.urls], args.interval, args.lag_min, client)
    print(json.dumps(report.as_dict()) if args.json else format_report(report))
    return 0 if report.ok else 1
