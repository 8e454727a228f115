"""The Bytewax 0.21 peer (.venv-peers: bench/peers/setup.sh): Kafka source →
`collect` (up to 512 requests or 10 ms, whichever first) → one ONNX Runtime call per
list → Kafka sink, as Bytewax's operator reference writes a `collect`
(https://docs.bytewax.io/stable/api/bytewax/bytewax.operators.html, "collect") with
its Kafka connectors (https://docs.bytewax.io/stable/api/bytewax/bytewax.connectors.kafka.html).
`collect` works per key, so every request is keyed on one key ("all"). One worker
(`cli_main` as `python -m bytewax.run` calls it), no recovery: Bytewax's source reads
its partitions by assignment from the start and keeps offsets only in recovery
snapshots, so nothing is committed to the broker. Its sink flushes the producer
after every list it is handed (bytewax/connectors/kafka/__init__.py, `write_batch`).
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bytewax.operators as op  # noqa: E402
from bytewax._bytewax import cli_main  # noqa: E402
from bytewax.connectors.kafka import KafkaSink, KafkaSinkMessage, KafkaSource  # noqa: E402
from bytewax.dataflow import Dataflow  # noqa: E402
from common import Scorer, client_settings, parse_args  # noqa: E402


def main() -> int:
    args = parse_args(__doc__ or "", ["collect512", "collect64"])
    consumer_conf, producer_conf = client_settings(args.profile)
    consumer_conf.pop("partition.assignment.strategy", None)  # the source assigns, no group
    scorer = Scorer(args.threads)
    max_size = 64 if args.mode == "collect64" else 512
    flow = Dataflow("peer")
    msgs = op.input("in", flow, KafkaSource([args.bootstrap], [args.input], add_config=consumer_conf))
    keyed = op.key_on("one-key", msgs, lambda _: "all")
    lists = op.collect("collect", keyed, timedelta(milliseconds=10), max_size=max_size)
    docs = op.flat_map("score", lists, lambda kv: scorer.score([(m.value, m.timestamp[1]) for m in kv[1]]))
    out = op.map("to-sink", docs, lambda doc: KafkaSinkMessage(None, doc))
    op.output("out", out, KafkaSink([args.bootstrap], args.output, add_config=producer_conf))
    cli_main(flow, workers_per_process=1, epoch_interval=timedelta(seconds=10))
    return 0


if __name__ == "__main__":
    sys.exit(main())
