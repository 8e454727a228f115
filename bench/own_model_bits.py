"""Which ONNX Runtime settings give a request the same bits in a batch as alone
(issue 48: docs/OWN_MODEL.md, "Results: the model's outputs", says which). Three
scikit-learn models converted by skl2onnx (a random forest, an MLP, a logistic
regression), each run through the worker's own session (pipeline/runtime/session.py,
`runtime.intra_op_threads` 1 and 2) on 512 requests in batches of 8, 64 and 512, and
compared bit for bit with the same requests one at a time.

    .venv/bin/python bench/own_model_bits.py [--features 64] [--requests 512]

Needs scikit-learn and skl2onnx. Prints one line per model, thread count and batch
size: equal or not, and the largest difference.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from pipeline.runtime.session import InferenceSession  # noqa: E402

BATCHES = (8, 64, 512)


def models(features: int, folder: Path) -> dict[str, Path]:
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.ensemble import RandomForestRegressor
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPRegressor

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2000, features)).astype(np.float32)
    y = x[:, 0] * 2 + x[:, 3]
    fitted = {
        "random forest": RandomForestRegressor(n_estimators=50, max_depth=8, random_state=0).fit(x, y),
        "mlp": MLPRegressor(hidden_layer_sizes=(256, 256), max_iter=30, random_state=0).fit(x, y),
        "logistic regression": LogisticRegression(max_iter=200).fit(x, y > 0),
    }
    out = {}
    for name, model in fitted.items():
        options = {id(model): {"zipmap": False}} if name == "logistic regression" else None
        proto = convert_sklearn(model, initial_types=[("input", FloatTensorType([None, features]))],
                                target_opset=13, options=options)
        proto.ir_version = min(proto.ir_version, 10)
        path = folder / f"{name.replace(' ', '_')}.onnx"
        path.write_bytes(proto.SerializeToString())
        out[name] = path
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--features", type=int, default=64, help="model inputs per request (default 64)")
    ap.add_argument("--requests", type=int, default=512, help="requests compared (default 512)")
    args = ap.parse_args()
    q = np.random.default_rng(1).standard_normal((args.requests, args.features)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in models(args.features, Path(tmp)).items():
            for threads in (1, 2):
                session = InferenceSession(path, "cpu", threads)
                out = session.output_names[-1]  # the score or probabilities (a label is an argmax)
                alone = np.concatenate([session.run({"input": q[i:i + 1]})[out] for i in range(len(q))])
                for size in BATCHES:
                    batched = np.concatenate([session.run({"input": q[i:i + size]})[out] for i in range(0, len(q), size)])
                    diff = float(np.abs(batched.astype(np.float64) - alone).max())
                    print(f"{name:<20} {out:<14} intra-op threads {threads}  batch {size:>3}: "
                          f"{'bit-equal' if np.array_equal(batched, alone) else 'differs'} (max |diff| {diff:.2g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
