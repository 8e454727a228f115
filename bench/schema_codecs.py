"""Decode cost per request of the schema-registry codecs (avro, protobuf, jsonschema:
pipeline/codecs/schema_wire.py) beside the JSON and binary forms of the same requests,
in one run, on one core (issue 48).

    .venv/bin/python bench/schema_codecs.py [--requests 2000] [--json]

Two pipelines' requests: CTR (a user context and ~20 items; the load generator's,
pipeline/loadgen/ctr.py) and a ranker of one's own (4 floats + 8 token ids, tensor-json).
Each form's decode is the worker's: CTR JSON and binary through `decode_all` a poll
(500) at a time (its decode_many fast paths; `json-each`: the JSON requests one by one,
the document path the schema-registry forms share), tensor-json and msgpack
(tensor-binary) one by one, and the schema-registry codecs one by one: confluent-kafka's
deserializer (fastavro, protobuf, json; JSON Schema validation off, as the codec runs
it) to a document, then the inner codec's own document path. Their schemas are fetched before timing (confluent-kafka's
in-memory mock:// registry): a fetch happens once per writer id, not per request.
Every form is checked to give the JSON form's arrays first. Prints microseconds per
request (best of 5 passes), the ratio to JSON and the bytes per request; timings on a
shared machine are noisy, so read the ratios.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench.tensor_binary import best_of, form_rows, main  # noqa: E402
from pipeline.codecs.base import decode_all  # noqa: E402
from pipeline.codecs.ctr import CtrCodec  # noqa: E402
from pipeline.codecs.ctr_binary import encode as ctr_binary  # noqa: E402
from pipeline.codecs.schema_records import FORMATS, RecordWriter  # noqa: E402
from pipeline.codecs.schema_wire import SchemaWireCodec  # noqa: E402
from pipeline.codecs.tensor_binary import TensorBinaryCodec  # noqa: E402
from pipeline.codecs.tensor_json import TensorJsonCodec  # noqa: E402
from pipeline.loadgen.ctr import CtrRequestFactory  # noqa: E402
from pipeline.registry.schema_fetch import SchemaFetcher  # noqa: E402
from pipeline.runtime.onnx_graph import TensorInfo  # noqa: E402

POLL = 500
RANKER = [TensorInfo("dense", "tensor(float)", ("batch", 4)), TensorInfo("tokens", "tensor(int64)", ("batch", "seq"))]
OUT = [TensorInfo("prob", "tensor(float)", ("batch", 1))]


def in_polls(codec: Any) -> Callable[[list[bytes]], list[Any]]:
    def decode(values: list[bytes]) -> list[Any]:
        out: list[Any] = []
        for i in range(0, len(values), POLL):
            out += decode_all(codec, [(v, None) for v in values[i:i + POLL]])
        return out

    return decode


def one_by_one(codec: Any) -> Callable[[list[bytes]], list[Any]]:
    return lambda values: [codec.decode(v, None) for v in values]


def schema_forms(inner: Any, pipeline: str, docs: list[dict[str, Any]]) -> dict[str, tuple[list[bytes], Any]]:
    """Each format's records of `docs`, and a codec that has fetched their schema."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    forms = {}
    for fmt in FORMATS:
        client = SchemaRegistryClient.new_client({"url": f"mock://bench-{fmt}"})
        fetcher = SchemaFetcher(thread=False)
        codec = SchemaWireCodec(fmt, inner, client, fetcher, pipeline, f"{pipeline}.results")
        write = RecordWriter(fmt, codec.request, client, f"{pipeline}.requests")
        values = [write(d) for d in docs]
        try:
            codec.decode(values[0])
        except Exception:  # NotReady: its schema is fetched now, as the worker's thread would
            fetcher.step()
        forms[fmt] = (values, one_by_one(codec))
    return forms


def arrays(decoded: Any) -> dict[str, np.ndarray]:
    p = decoded.payload
    return dict(p) if isinstance(p, dict) else {"dense": p.dense, "cat": p.cat}


def measure(n: int) -> list[dict[str, Any]]:
    factory = CtrRequestFactory(seed=1)
    ctr_json = [factory.make(i)[1] for i in range(n)]
    ctr_docs = [orjson.loads(v) for v in ctr_json]
    ctr = CtrCodec()
    rng = np.random.default_rng(1)
    rank_docs = [{"request_id": f"r{i}", "dense": np.round(rng.standard_normal(4), 6).astype(np.float32).tolist(),
                  "tokens": rng.integers(0, 1000, 8).tolist()} for i in range(n)]
    ranker, binary = TensorJsonCodec(RANKER, OUT), TensorBinaryCodec(RANKER, OUT)
    cases = {
        "ctr": {"json": (ctr_json, in_polls(ctr)), "json-each": (ctr_json, one_by_one(ctr)),
                "binary": ([ctr_binary(d) for d in ctr_docs], in_polls(ctr)),
                **schema_forms(ctr, "ctr", ctr_docs)},
        "ranker": {"json": ([orjson.dumps(d) for d in rank_docs], one_by_one(ranker)),
                   "msgpack": ([binary.encode(d) for d in rank_docs], one_by_one(binary)),
                   **schema_forms(ranker, "ranker", rank_docs)},
    }
    rows = []
    for pipeline, forms in cases.items():
        want = [arrays(d) for d in forms["json"][1](forms["json"][0][:20])]
        for name, (values, decode) in forms.items():  # the same arrays from every form
            got = [arrays(d) for d in decode(values[:20])]
            assert all(a.keys() == b.keys() and all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)
                       for a, b in zip(got, want, strict=True)), (pipeline, name)
        times = {name: best_of(lambda vs=values, d=decode: d(vs)) / n for name, (values, decode) in forms.items()}
        rows += form_rows({"pipeline": pipeline}, {name: values for name, (values, _) in forms.items()}, times)
    return rows


if __name__ == "__main__":
    sys.exit(main(__doc__, measure))
