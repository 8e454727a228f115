"""What every peer of bench/peers.py shares, so that they differ only in how they
consume, batch and produce: the model session (same file, same ONNX Runtime
settings as the worker's, pipeline/runtime/session.py), tidebatch's own CTR codec
(pipeline/codecs/ctr.py; none of the peers has a CTR codec of its own), the result
document, the client settings and the command line.

Imported by peers running in the shared .venv (plain loop, Faust) and in .venv-peers
(quixstreams, Bytewax: bench/peers/setup.sh), so it needs only numpy, orjson,
onnxruntime and the repository on sys.path.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import orjson  # noqa: E402

from pipeline.codecs.base import Decoded, DecodeError  # noqa: E402
from pipeline.codecs.ctr import CtrCodec  # noqa: E402

MODEL = REPO / "models" / "ctr" / "ctr_deepfm.onnx"
# Settings the peers keep for themselves: each commits the way its own docs say (the
# plain loop with librdkafka's auto commit, quixstreams at its checkpoints, Bytewax
# in its recovery snapshots), and no peer gets tidebatch's logging hooks.
_OWN_KEYS = ("enable.auto.commit", "enable.auto.offset.store", "logger", "error_cb", "bootstrap.servers", "group.id")


def parse_args(description: str, modes: Sequence[str]) -> argparse.Namespace:
    """The command line every peer takes from bench/peers.py."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--profile", choices=("kafka", "embedded"), required=True,
                    help="broker profile of consumers/profiles.py: the same client settings for every peer")
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--mode", choices=list(modes), default=modes[0])
    ap.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads (the worker's default)")
    return ap.parse_args()


def client_settings(profile: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(consumer, producer) librdkafka settings of the broker profile
    (consumers/profiles.py), the same for every peer and for tidebatch: on Tansu some
    are needed at all (docs/BROKERS.md), and the producer's acks=all, idempotence, lz4
    and linger are what tidebatch's producer pays for, so the broker's CPU compares."""
    from consumers.profiles import consumer_config, producer_config

    consumer = {k: v for k, v in consumer_config(profile, "-", "-").items() if k not in _OWN_KEYS}
    producer = {k: v for k, v in producer_config(profile, "-").items() if k not in _OWN_KEYS}
    return consumer, producer


def open_session(threads: int) -> Any:
    """The CTR model on ONNX Runtime's CPU provider with the worker's settings
    (pipeline/runtime/session.py: intra-op `threads`, one inter-op thread, all graph
    optimisations)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    return ort.InferenceSession(str(MODEL), sess_options=opts, providers=["CPUExecutionProvider"])


class Scorer:
    """Decode, one ORT call for the whole list, one result document per request."""

    def __init__(self, threads: int) -> None:
        self.session = open_session(threads)
        self.codec = CtrCodec()

    def score(self, records: Sequence[tuple[bytes | None, int]]) -> list[bytes]:
        """records: (value, Kafka timestamp ms). A request that does not decode gets a
        one-line message on stderr and no result (the peers have no dead-letter topic:
        one of the things tidebatch does that they do not)."""
        decoded: list[tuple[Decoded, int]] = []
        for value, ts in records:
            try:
                decoded.append((self.codec.decode(value), ts))
            except DecodeError as exc:
                print(f"bad request skipped: {exc}", file=sys.stderr, flush=True)
        if not decoded:
            return []
        feeds = self.codec.collate([d.payload for d, _ in decoded])
        (prob,) = self.session.run(["prob"], feeds)
        results = self.codec.split({"prob": np.asarray(prob)}, [d for d, _ in decoded])
        rows = int(feeds["cat"].shape[0])
        return [orjson.dumps({**r, "kafka_ts_ms": ts, "batch_rows": rows}) for r, (_, ts) in zip(results, decoded, strict=True)]

