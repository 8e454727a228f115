"""Continuous / static by the decoder's shape: does a bigger model bring issue 25's 2×?

Continuous batching pays in proportion to a decoding step's fixed cost beside its
cost per row (docs/GENERATION.md, "Why not 2× here"). The shipped decoder has
0.46 M parameters; the issue allows "a few million". This builds decoders of other
shapes with random weights (models/decoder/numpy_model.py `init_params`, the graphs
of models/decoder/export.py, in place as the worker decodes), and drains the same
requests through the scheduler and the runner alone, as bench/generation_steps.py
does (no Kafka, one thread): tokens/s of continuous and static, interleaved, and the
decoding call's fixed and per-row milliseconds fitted from its calls.

Random weights: speed does not depend on what the weights say, and greedy batched
decoding gives each request the same tokens under both policies (decoding equals
decoding alone, tests/unit/test_generation_runner.py), so both generate the same
tokens. Nothing is written to models/.

    .venv/bin/python bench/generation_shapes.py [--requests 200] [--repeat 2]
        [--shapes 128x2,128x12,192x8,256x4,256x6,384x4]   # d_model x layers
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.generation import GenPool  # noqa: E402
from bench.generation_steps import drain  # noqa: E402
from bench.harness import table  # noqa: E402
from models.decoder.export import build_graph  # noqa: E402
from models.decoder.numpy_model import Config, init_params, n_params  # noqa: E402
from pipeline.generation.shape import DecoderShape  # noqa: E402
from pipeline.generation.slot_decoder import open_in_place  # noqa: E402
from pipeline.runtime.session import InferenceSession  # noqa: E402

HEAD_DIM = 32  # the shipped decoder's (models/decoder/spec.json)


def decode_fit(calls: list[tuple[int, int, float]]) -> tuple[float, float]:
    """(fixed ms, ms per row) of the decoding calls, least squares on the rows they
    compute (the in-place call's slot range, bench/generation_steps.py TimedInPlace)."""
    x = np.array([[1.0, n] for n, _, _ in calls])
    y = np.array([s * 1e3 for _, _, s in calls])
    (a, b), *_ = np.linalg.lstsq(x, y, rcond=None)
    return float(a), float(b)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--shapes", default="128x2,128x12,192x8,256x4,256x6,384x4", help="d_model x layers, comma-separated")
    args = ap.parse_args()
    pool = GenPool()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.shapes.split(","):
            d, layers = (int(x) for x in spec.split("x"))
            cfg = Config(d_model=d, heads=d // HEAD_DIM, layers=layers, mlp=4 * d)
            params = init_params(cfg, 1)
            path = Path(tmp) / f"decoder_{d}x{layers}.onnx"
            path.write_bytes(build_graph(params, cfg).SerializeToString())
            session = InferenceSession(str(path), providers="cpu", intra_op_threads=1)
            shape = DecoderShape(layers, cfg.heads, HEAD_DIM, cfg.context)
            in_place = open_in_place(str(path), shape)
            if in_place is None:
                print("this ONNX Runtime has no CPU GroupQueryAttention: nothing to measure")
                return 1
            drain("continuous", pool, 20, args.slots, session, shape, in_place)  # warm-up
            tps: dict[str, list[float]] = {"continuous": [], "static": []}
            calls: list[tuple[int, int, float]] = []
            per_step: dict[str, float] = {}
            for _ in range(args.repeat):
                for policy in tps:
                    r, clocks = drain(policy, pool, args.requests, args.slots, session, shape, in_place)
                    tps[policy].append(r["tokens"] / r["wall"])
                    calls += clocks.decode_calls
                    per_step[policy] = r["tokens"] / r["steps"]
            fixed, per_row = decode_fit(calls)
            ratios = [c / s for c, s in zip(tps["continuous"], tps["static"], strict=True)]
            rows.append([f"{d}x{layers}", f"{n_params(params) / 1e6:.2f} M",
                         " / ".join(f"{x:,.0f}" for x in tps["continuous"]),
                         " / ".join(f"{x:,.0f}" for x in tps["static"]),
                         ", ".join(f"{x:.2f}" for x in ratios),
                         f"{per_step['continuous']:.1f} / {per_step['static']:.1f}",
                         f"{fixed:.3f}", f"{per_row:.4f}", f"{fixed / per_row:.0f}"])
    print(f"{args.requests} requests, {args.slots} KV slots, prompts of 8-47 bytes, max_new_tokens log-uniform "
          f"8..200 (bench/generation.py's); random weights; one thread")
    print(table(["shape", "params", "continuous tok/s", "static tok/s", "cont/static", "tokens/step c / s",
                 "decode fixed ms", "ms/row", "fixed/row"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
