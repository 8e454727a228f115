"""Which compact binary form for `tensor-json` requests (issue 20): decode cost per
request of the JSON form against msgpack and Arrow IPC forms of the same requests,
measured side by side in one run, on one core.

    .venv/bin/python bench/tensor_binary.py [--requests 2000] [--json]

Three request shapes: a ranker's (4 floats + 8 token ids), an embedding (256 floats),
an image (3x64x64 floats). JSON is the tensor-json codec's own decode
(pipeline/codecs/tensor_json.py); msgpack is the `tensor-binary` codec's own decode
(pipeline/codecs/tensor_binary.py: tensor fields as raw little-endian bytes); Arrow IPC
a one-row record batch with a list column per input, read to the same arrays (the
form that lost, kept here as the evidence). Prints microseconds per request (best of 5 passes) and the ratio to
JSON; timings on a shared machine are noisy, so read the ratios.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from pipeline.codecs.tensor_binary import TensorBinaryCodec  # noqa: E402
from pipeline.codecs.tensor_json import TensorJsonCodec  # noqa: E402
from pipeline.runtime.onnx_graph import TensorInfo  # noqa: E402

SHAPES = {
    "ranker": [TensorInfo("dense", "tensor(float)", ("batch", 4)), TensorInfo("tokens", "tensor(int64)", ("batch", "seq"))],
    "embedding": [TensorInfo("x", "tensor(float)", ("batch", 256))],
    "image": [TensorInfo("image", "tensor(float)", ("batch", 3, 64, 64))],
}
OUT = [TensorInfo("y", "tensor(float)", ("batch", 1))]


def best_of(fn, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def requests(inputs: list[TensorInfo], n: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    out = []
    for _ in range(n):
        req = {}
        for t in inputs:
            shape = tuple(8 if isinstance(d, str) else d for d in t.shape[1:])
            req[t.name] = (rng.standard_normal(shape).astype(t.dtype) if t.dtype.kind == "f"
                           else rng.integers(0, 1000, shape).astype(t.dtype))
        out.append(req)
    return out


def msgpack_form(req: dict[str, np.ndarray], i: int) -> bytes:
    import msgpack

    return msgpack.packb({"request_id": f"r{i}", **{k: v.astype(v.dtype.newbyteorder("<")).tobytes() for k, v in req.items()}})


def arrow_form(req: dict[str, np.ndarray], i: int) -> bytes:
    import pyarrow as pa

    cols = {"request_id": pa.array([f"r{i}"])}
    for k, v in req.items():
        cols[k] = pa.array([v.ravel()], type=pa.list_(pa.from_numpy_dtype(v.dtype)))
    batch = pa.RecordBatch.from_pydict(cols)
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def arrow_decode(inputs: list[TensorInfo]):
    import pyarrow as pa

    fixed = {t.name: tuple(d for d in t.shape[1:] if isinstance(d, int)) for t in inputs}

    def decode(value: bytes) -> dict[str, np.ndarray]:
        batch = pa.ipc.open_stream(value).read_next_batch()
        if batch.num_rows != 1 or batch.column("request_id")[0].as_py() is None:
            raise ValueError("request_id")
        out = {}
        for name, dims in fixed.items():
            arr = batch.column(name).values.to_numpy(zero_copy_only=False)
            out[name] = arr.reshape((1, *dims) if dims and int(np.prod(dims)) == arr.size else (1, -1))
        return out

    return decode


def measure(n: int) -> list[dict]:
    rows = []
    for shape, inputs in SHAPES.items():
        reqs = requests(inputs, n)
        codec, binary = TensorJsonCodec(inputs, OUT), TensorBinaryCodec(inputs, OUT)
        forms = {
            "json": ([orjson.dumps({"request_id": f"r{i}", **{k: v.tolist() for k, v in r.items()}})
                      for i, r in enumerate(reqs)], lambda v, c=codec: c.decode(v, None)),
            "msgpack": ([msgpack_form(r, i) for i, r in enumerate(reqs)],
                        lambda v, c=binary: c.decode(v, None)),
            "arrow-ipc": ([arrow_form(r, i) for i, r in enumerate(reqs)], arrow_decode(inputs)),
        }
        for name, (values, decode) in forms.items():  # the same arrays from every form
            got = decode(values[0])
            got = got.payload if hasattr(got, "payload") else got
            assert all(np.array_equal(got[k], reqs[0][k][None]) for k in reqs[0]), (shape, name)
        times = {name: best_of(lambda vs=values, d=decode: [d(v) for v in vs]) / n
                 for name, (values, decode) in forms.items()}
        rows += form_rows({"shape": shape}, {name: values for name, (values, _) in forms.items()}, times)
    return rows


def form_rows(label: dict[str, str], values: dict[str, list[bytes]], seconds: dict[str, float]) -> list[dict]:
    """One row per form: `label`, its microseconds per request, the ratio to the JSON
    form's and its bytes per request (also bench/schema_codecs.py's)."""
    return [{**label, "form": name, "us_per_request": round(seconds[name] * 1e6, 2),
             "vs_json": round(seconds[name] / seconds["json"], 3), "bytes": round(sum(map(len, vs)) / len(vs))}
            for name, vs in values.items()]


def main(doc: str = __doc__, measure: Callable[[int], list[dict]] = measure) -> int:
    """The command line of a decode-cost bench: --requests, --json, else a table."""
    from bench.harness import table

    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args()
    rows = measure(args.requests)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(table([*rows[0].keys()], [list(r.values()) for r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
