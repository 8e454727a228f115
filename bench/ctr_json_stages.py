"""Where the CTR JSON decode's time goes, and what the candidates for a faster one cost,
on the same requests in one run (issue 23, part 3; the choice is written up in
docs/schemas/ctr_request.md, "Speed: the JSON fast path").

    .venv/bin/python bench/ctr_json_stages.py [--requests 1000] [--mean-items 20]

Thread CPU microseconds per request, best of 7 passes, allocator as a worker sets it
(pipeline/runtime/allocator.py). Stages of CtrCodec.decode (pipeline/codecs/ctr.py):
the JSON parse, the fields, the dense array, the categorical array (gathering the
tokens, parsing them, hashing). Candidates: other parsers of the whole document
(stdlib json, msgspec untyped, msgspec typed Structs with every feature field,
pyarrow's JSON reader over the poll as JSON lines on one thread) and what the fast
path does (msgspec on the skeleton alone, ctr_scan.py over the poll, all of decode_many).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from itertools import chain
from pathlib import Path

import msgspec
import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from models.ctr import features as F  # noqa: E402
from pipeline.codecs import ctr_fast, ctr_features, ctr_fields, ctr_scan  # noqa: E402
from pipeline.codecs.ctr import CtrCodec  # noqa: E402
from pipeline.loadgen.ctr import CtrRequestFactory  # noqa: E402
from pipeline.runtime.allocator import fix_mmap_threshold  # noqa: E402

Num = int | float | None
Tok = str | None


def _typed_decoder() -> msgspec.json.Decoder:
    """msgspec Structs with every field of the schema (docs/schemas/ctr_request.md)."""
    item = msgspec.defstruct("Item", [("item_id", str), *((k, Num, None) for k in F.ITEM_DENSE),
                                      *((k, Tok, None) for k in F.ITEM_CAT)], gc=False)
    ctx = msgspec.defstruct("Ctx", [*((k, Num, None) for k in F.CONTEXT_DENSE), *((k, Tok, None) for k in F.CONTEXT_CAT)],
                            gc=False)
    req = msgspec.defstruct("Req", [("request_id", str), ("context", ctx), ("items", list[item]),  # type: ignore[valid-type]
                                    ("tenant", str | None, None), ("priority", int | None, None),
                                    ("deadline_ms", int | None, None), ("user_id", str | None, None)], gc=False)
    return msgspec.json.Decoder(req)


def _tokens(doc: dict) -> list:
    toks = list(map(doc["context"].get, F.CONTEXT_CAT))
    toks.extend(chain.from_iterable(map(it.get, F.ITEM_CAT) for it in doc["items"]))
    return toks


def stages(values: list[bytes]) -> dict[str, float]:
    n = len(values)

    def cpu_us(fn) -> float:
        best = float("inf")
        for _ in range(7):
            t0 = time.thread_time()
            fn()
            best = min(best, time.thread_time() - t0)
        return best / n * 1e6

    codec = CtrCodec()
    docs = [orjson.loads(v) for v in values]
    toks = [_tokens(d) for d in docs]
    parsed = [F.parse_tokens(t) for t in toks]
    typed = _typed_decoder()
    untyped = msgspec.json.Decoder()
    skeletons = [ctr_fast._skeleton(v, codec.max_items) for v in values]
    n_items = [len(s.items) for s in skeletons]  # type: ignore[union-attr]
    out = {
        "reference decode (whole)": cpu_us(lambda: [codec.decode(v) for v in values]),
        "  orjson.loads": cpu_us(lambda: [orjson.loads(v) for v in values]),
        "  request_id, meta, item_ids": cpu_us(lambda: [(ctr_fields.read_request_id(d), ctr_fields.read_meta(d, v),
                                                         ctr_fields.read_item_ids(d["items"])) for d, v in zip(docs, values, strict=True)]),
        "  dense array": cpu_us(lambda: [ctr_features.featurise_dense(d["context"], d["items"]) for d in docs]),
        "  cat array (whole)": cpu_us(lambda: [ctr_features.featurise_cat(d["context"], d["items"]) for d in docs]),
        "    gather the tokens": cpu_us(lambda: [_tokens(d) for d in docs]),
        "    parse them (hex)": cpu_us(lambda: [F.parse_tokens(t) for t in toks]),
        "    hash, [n,26] matrix": cpu_us(lambda: [ctr_features._cat_matrix(v, p, len(d["items"]))
                                              for (v, p), d in zip(parsed, docs, strict=True)]),
        "candidate: json.loads": cpu_us(lambda: [json.loads(v) for v in values]),
        "candidate: msgspec, untyped": cpu_us(lambda: [untyped.decode(v) for v in values]),
        "candidate: msgspec Structs, every field": cpu_us(lambda: [typed.decode(v) for v in values]),
    }
    try:
        import pyarrow as pa
        import pyarrow.json as pj

        num, tok = pa.float64(), pa.string()
        item = pa.struct([("item_id", pa.string()), *((k, num) for k in F.ITEM_DENSE), *((k, tok) for k in F.ITEM_CAT)])
        ctx = pa.struct([*((k, num) for k in F.CONTEXT_DENSE), *((k, tok) for k in F.CONTEXT_CAT)])
        schema = pa.schema([("request_id", pa.string()), ("context", ctx), ("items", pa.list_(item))])
        lines = b"\n".join(values)
        parse = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
        read = pj.ReadOptions(use_threads=False, block_size=1 << 24)
        out["candidate: pyarrow read_json (poll, 1 thread)"] = cpu_us(
            lambda: pj.read_json(io.BytesIO(lines), read_options=read, parse_options=parse))
    except ImportError:
        pass
    groups = []
    size = 0
    for v in values:  # the fast path's groups (ctr_fast.GROUP_BYTES)
        if not groups or size >= ctr_fast.GROUP_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(v)
        size += len(v)
    counts = []
    at = 0
    for g in groups:
        counts.append(np.array(n_items[at : at + len(g)]))
        at += len(g)
    out["fast path: msgspec skeleton + checks"] = cpu_us(lambda: [ctr_fast._skeleton(v, codec.max_items) for v in values])
    out["fast path: ctr_scan.scan (groups)"] = cpu_us(lambda: [ctr_scan.scan(g, c) for g, c in zip(groups, counts, strict=True)])
    out["fast path: decode_many (whole)"] = cpu_us(lambda: codec.decode_many([(v, None) for v in values]))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="CTR JSON decode: stages and candidates")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--mean-items", type=float, default=20)
    args = parser.parse_args(argv)
    fix_mmap_threshold()
    factory = CtrRequestFactory(seed=5, mean_items=args.mean_items)
    values = [factory.make(i)[1] for i in range(args.requests)]
    print(f"{len(values)} requests, {sum(map(len, values)) / len(values):.0f} bytes each; "
          "thread CPU us per request, best of 7")
    for name, us in stages(values).items():
        print(f"{name:48s} {us:8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
