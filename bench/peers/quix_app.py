"""The quixstreams 3.x peer (.venv-peers: bench/peers/setup.sh), an `Application`
and a `StreamingDataFrame` as its quickstart writes them
(https://quix.io/docs/quix-streams/quickstart.html):

- `--mode message`: `sdf.apply(score)` per message, one ONNX Runtime call each;
- `--mode window`: the only batching quixstreams offers, its windows
  (https://quix.io/docs/quix-streams/windowing.html, "collect()"): windows are
  per message key, and the requests' keys are user ids, so the stream is first
  regrouped onto one key (`group_by`, a repartition topic through the broker), then
  `tumbling_window(10 ms).collect()` and `.final()` hand one list per 10 ms to one
  ONNX Runtime call. A window's list is kept in the app's state store (RocksDB),
  which needs JSON values: the request travels as {"ts": Kafka timestamp,
  "v": the request text}. JSON requests only.

On the embedded broker the window mode fails at start: `group_by` reads the input
topic's retention.ms, which Tansu's DescribeConfigs does not return.

Commits: quixstreams' own checkpoints (every 5 s by default, at-least-once).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Scorer, client_settings, parse_args  # noqa: E402
from quixstreams import Application  # noqa: E402


def main() -> int:
    args = parse_args(__doc__ or "", ["message", "window"])
    consumer_conf, producer_conf = client_settings(args.profile)
    scorer = Scorer(args.threads)
    app = Application(
        broker_address=args.bootstrap, consumer_group=args.group, auto_offset_reset="earliest",
        consumer_extra_config=consumer_conf, producer_extra_config=producer_conf,
        state_dir=tempfile.mkdtemp(prefix="quix-state-"), loglevel="WARNING",
    )
    requests = app.topic(args.input, value_deserializer="bytes", key_deserializer="bytes")
    scores = app.topic(args.output, value_serializer="bytes")
    sdf = app.dataframe(requests)
    if args.mode == "message":
        sdf = sdf.apply(lambda value, key, ts, headers: scorer.score([(value, ts)]), metadata=True, expand=True)
    else:
        sdf = sdf.apply(lambda value, key, ts, headers: {"ts": ts, "v": value.decode("latin-1")}, metadata=True)
        sdf = sdf.group_by(lambda _: "all", name="all")
        sdf = sdf.tumbling_window(duration_ms=10).collect().final()
        sdf = sdf.apply(lambda w: scorer.score([(r["v"].encode("latin-1"), r["ts"]) for r in w["value"]]), expand=True)
    # quixstreams gives a result the timestamp of the message it came from; the bench
    # reads a result's timestamp as the time it was produced, as for every other row.
    sdf = sdf.set_timestamp(lambda value, key, ts, headers: time.time_ns() // 1_000_000)
    sdf.to_topic(scores)
    app.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
